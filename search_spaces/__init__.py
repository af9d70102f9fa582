"""The shipped search spaces (*.yaml), installed as the package `autopar.spaces` (setup.py maps this
folder), so that editable and wheel installs read them the same way: importlib.resources."""
