"""Package discovery lives here, not in pyproject.toml, for one reason: the shipped search spaces stay
in the top-level folder search_spaces/ (user-editable, next to the README) and install as the
package `autopar.spaces`. pyproject's `packages.find` cannot add a package mapped from another
folder, so the list is the discovered autopar packages plus that one (metadata: pyproject.toml)."""

from setuptools import find_namespace_packages, setup

setup(
    packages=[*find_namespace_packages(include=["autopar*"]), "autopar.spaces"],
    package_dir={"autopar.spaces": "search_spaces"},
)
