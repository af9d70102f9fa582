"""The search's measured throughput and the default size of an exhaustive search derived from it,
the Optuna samplers and the rankings. Kept apart from autopar.search.run so that the CLI can show
the default and check --sampler and --rank-by without importing pandas, the cost model or optuna."""

from autopar.figures import HIGH, STEP_TIME_S

#: plans a whole exhaustive search gets through per second (walk, pricing on one core, keeping,
#: writing plans.parquet) on the 2-core reference machine: benchmarks/bench_search_scale.py measured
#: 14.0M plans in 12.1 s of process (1.16M/s; 2.2M/s pricing alone on the 1.6M space), so 1M/s
#: with a margin for slower machines
MEASURED_PLANS_PER_S = 1_000_000
#: exhaustive whenever the search finishes in about ten seconds; Optuna samples larger spaces
DEFAULT_MAX_EXHAUSTIVE = 10 * MEASURED_PLANS_PER_S

#: Optuna samplers of `--sampler` (autopar.search.optuna_driver.make_sampler)
SAMPLERS = ("tpe", "nsga2", "random")

#: --rank-by -> the step-time column plans are ranked by (autopar.calibration.uncertainty's intervals)
RANK_BY = {"expected": STEP_TIME_S, "p80": HIGH[STEP_TIME_S]}
