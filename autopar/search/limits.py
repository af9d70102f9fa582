"""The search's measured throughput and the default size of an exhaustive search derived from it.
Kept apart from autopar.search.run so that the CLI can show the default without importing the
cost model."""

#: plans priced per second by a whole exhaustive search, evaluate phase on one core of the 2-core
#: reference machine (benchmarks/bench_search_scale.py, the 1.5M-plan space)
MEASURED_PLANS_PER_S = 300_000
#: exhaustive whenever the search finishes in about ten seconds; Optuna samples larger spaces
DEFAULT_MAX_EXHAUSTIVE = 10 * MEASURED_PLANS_PER_S
