"""The apply_* steps, one parallelism each; `autopar.trial.parallelize` calls them in order."""
