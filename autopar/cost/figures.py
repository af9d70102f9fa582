"""The estimate's named terms: the parallel axes, the time terms a step is the sum of and the memory
terms a rank's peak is the sum of, with how each reads in the terminal, the report and the why
line. autopar.cost.columns prices them (`time_<term>`, `mem_<term>`, `comm_bytes_<axis>`)."""

from __future__ import annotations

AXES = ("tp", "cp", "ep", "pp", "dp")
TIME_TERMS = ("compute", "tp", "cp", "ep", "pp", "act_offload", "dp", "bubble", "optimizer", "offload")
MEMORY_TERMS = ("weights", "gradients", "optimizer", "activations", "other")
#: how the terms read in the terminal, the report and the why line (communication terms are what
#: overlap leaves exposed)
TIME_LABELS = {
    "compute": "compute",
    "tp": "TP comm (exposed)",
    "cp": "CP comm (exposed)",
    "ep": "EP all-to-all (exposed)",
    "pp": "PP send/recv (exposed)",
    "dp": "DP comm (exposed)",
    "bubble": "pipeline bubble",
    "optimizer": "optimizer step",
    "offload": "optimizer offload (host)",
    "act_offload": "activation offload (host)",
}
MEMORY_LABELS = {
    "weights": "weights",
    "gradients": "gradients",
    "optimizer": "optimizer states",
    "activations": "activations",
    "other": "other (runtime, buffers)",
}
