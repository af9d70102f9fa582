#!/usr/bin/env bash
# Single-GPU check of the built-in model (tp1/pp1, ~1B-parameter llama2-7b slice, bf16): step time,
# MFU and peak memory, in under 5 minutes. Needs a CUDA GPU; the test suite never runs it.
# Usage: benchmarks/gpu_check.sh [extra args of benchmarks/gpu_check.py]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpu_check: no nvidia-smi, no GPU here; nothing to check" >&2
  exit 0
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'torch sees no CUDA device')"
timeout 290 "$PY" benchmarks/gpu_check.py "$@"
# issue 6: calibration run (probe + 3 single-GPU trials + fit), under 5 minutes
timeout 290 "$PY" benchmarks/gpu_calibrate.py
