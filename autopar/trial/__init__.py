"""The trial layer: a built-in Llama-style model, parallelised by the plan, run under torchrun.

The only torch territory of autopar. `launcher` (and `spec`) import no torch, so the search process
can launch trials without loading it; everything else here does. Data flows
model.py (plain module) -> parallelize.py (ordered apply_* steps over mesh.py's DeviceMesh) ->
runner.py (steps, timing, memory, collective bytes) -> worker.py (torchrun entry, JSON result).
"""
