# The two commands of the README. Both create the virtual environment when it is missing.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup run test bench clean

setup: $(STAMP)

# CPU machines (no nvidia-smi) get the local CPU build of torch first; GPU machines get the normal
# build through the package's own torch range.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(PY) -m pip install -q torch==2.13.0; fi
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

run: setup
	$(VENV)/bin/autopar search --model 70b --gpus 256

test: setup
	$(PY) -m pytest

bench: setup
	$(PY) benchmarks/bench_estimate.py
	$(PY) benchmarks/bench_search.py
	$(PY) benchmarks/bench_report.py

clean:
	rm -rf $(VENV) build *.egg-info
