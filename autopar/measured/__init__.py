"""The measured stage, torch-free: which plans to trial and in what order (`order`), where each runs
(as it is, as a scaled-down proxy, or on the cluster: `placement`, `proxy`, `proxy_model`,
`resources`, `slurm`, `sbatch`), how a trial is launched and its processes kept in hand
(`launcher`, `hygiene`, `measure`, `plan_trial`), the Optuna study that claims and records the
trials (`trials`, `claims`), the calibration on their measurements (`calibration`, `results`), and
the stage as `autopar search --trials K` runs it (`stage`); with `--measure-with TRAINER` the user's
own trainer runs each plan instead of the built-in model: where it lives (`own_trainer`), its
export's short run launched and its log parsed (`own_run`, `trainer_logs`). `config` is the trial
specification the torch worker (autopar.trial.worker) reads, and `features` what the built-in model
supports.

It imports no torch: a trial runs in its own torchrun processes (autopar.trial), and the commands
that start one check for torch first (`needs_torch`). tests/test_layering.py checks both.
"""
