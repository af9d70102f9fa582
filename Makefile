# The two commands of the README. Both create the virtual environment when it is missing.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: setup setup-test test-deps run lint test bench profiles recipes clean

setup: $(STAMP)
setup-test: $(TEST_STAMP)

# The package with its trial extra (torch: trials, probe, calibration rounds). CPU machines (no
# nvidia-smi) get the local CPU build of torch first; GPU machines get the normal build through the
# trial extra's torch range.
$(STAMP): pyproject.toml setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(PY) -m pip install -q torch==2.13.0; fi
	$(PY) -m pip install -q -e '.[trial]'
	touch $(STAMP)

# The test extras (the trial extra, pytest, hypothesis, the trainers' own config parsers for the
# export tests), and older / CUDA-only trainer releases that the export tests read without importing
# (no dependencies).
$(TEST_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[trial,test]'
	rm -rf $(VENV)/trainer-refs
	$(PY) -m pip install -q --no-deps --target $(VENV)/trainer-refs torchtitan==0.2.2 megatron-bridge==0.3.1 nemo-toolkit==2.7.3
	touch $(TEST_STAMP)

run: setup
	$(VENV)/bin/autopar search --model 70b --gpus 256

# The system packages the tests start (Chromium, PostgreSQL): installed as root, else the command to
# run is printed and make stops before the tests.
test-deps:
	bash scripts/install-test-deps.sh

# ruff and mypy (pinned in the test extras, configured in pyproject.toml): the format is checked, not
# changed; mypy type-checks autopar/
lint: setup-test
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(PY) -m mypy

# the suite on every core (pytest-xdist): about half the serial time on 2 cores
test: test-deps setup-test lint
	$(PY) -m pytest -n auto

bench: setup
	$(PY) benchmarks/bench_estimate.py
	$(PY) benchmarks/bench_search.py
	$(PY) benchmarks/bench_search_scale.py
	$(PY) benchmarks/bench_report.py
	$(PY) benchmarks/bench_everyday.py
	$(PY) benchmarks/bench_validate_runs.py

# Refit the shipped trainer profiles to the bundled public runs and store their figures with the
# digest of the code and data (docs/cost-model.md quotes them; a test checks the digest)
profiles: setup
	$(VENV)/bin/autopar validate --fit --write-profiles autopar/cost/data/profiles.toml

# Re-read what the NeMo 2 and Megatron-Bridge recipes set from the reference releases (the exports
# write only what changes a recipe; a test checks the files against these releases)
recipes: setup-test
	$(PY) scripts/bridge_recipe_values.py $(VENV)/trainer-refs
	$(PY) scripts/nemo_recipe_values.py $(VENV)/trainer-refs

clean:
	rm -rf $(VENV) build *.egg-info
