"""autopar: find the parallel layout (TP, PP, CP, EP, DP/ZeRO, batch, recompute) that fits and
trains fastest, say how fast and why, and how to launch it.

Importing autopar is cheap: no torch, optuna or plotly (tests/test_layering.py checks it).
"""

__version__ = "0.1.0"
