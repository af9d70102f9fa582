"""What the published runs say about the cost model, above it (autopar.cost is physics only: pure
functions of plan x hardware x profile, and knows nothing of published runs).

- the published runs: `run_rows` reads the calibration tables (data/calibration_runs*.csv) and a
  user's `--runs` CSV, `run_checks` checks their cells, `row_cells` reads a cell's words,
  `run_plan` / `run_cases` turn a row into a plan, a model and a cluster (`RunCase`),
  `flop_conventions` reads each source's TFLOP/s convention, `memory_facts` /
  `memory_published` compare the rows' published memory;
- the fit: `case_batch` prices the cases once, `profile_fit` refits the trainer profiles' constants
  toward their priors, `fit` / `calibrate` fit the built-in model's constants to trials;
- the validation: `validation` predicts the cases, `validate_runs` is `autopar validate`
  (in sample, leave-one-source-out, the stored figures of `stored_figures` and their digest);
- the intervals: `support` (how near the published runs a plan is), `uncertainty` (80 % intervals);
- `estimate`: the cost model's price of a plan with its intervals, the one entry point above.
"""
