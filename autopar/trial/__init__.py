"""The trial layer: a built-in Llama-style model, parallelised by the plan, run under torchrun.

The only torch territory of autopar, and torch is optional (`pip install autopar[trial]`). Only the
trial processes import it (worker.py under torchrun, probe.py's benchmarks). What the `autopar`
process itself does around a trial (planning, proxies, launching, SLURM, the measured stage) is in
autopar.measured, which imports no torch; this layer reads its trial specification
(autopar.measured.config) and the built-in model's features (autopar.measured.features).
tests/test_layering.py checks both. Data flows model.py (plain module) -> parallelize.py (ordered
apply_* steps over mesh.py's DeviceMesh) -> runner.py (steps, timing, memory, collective bytes) ->
worker.py (torchrun entry, JSON result).
"""
