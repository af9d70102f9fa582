"""The trial layer: a built-in Llama-style model, parallelised by the plan, run under torchrun.

The only torch territory of autopar, and torch is optional (`pip install autopar[trial]`). Only the
trial processes import it (worker.py under torchrun, probe.py's benchmarks); the modules the
`autopar` process itself uses (launcher, measure, plan_trial, proxy, hygiene, resources, slurm,
local_profile, ...) import none, so the planner runs without torch and the commands that start
trials check for it first (needs_torch.py). tests/test_layering.py checks both. Data flows
model.py (plain module) -> parallelize.py (ordered apply_* steps over mesh.py's DeviceMesh) ->
runner.py (steps, timing, memory, collective bytes) -> worker.py (torchrun entry, JSON result).
"""
