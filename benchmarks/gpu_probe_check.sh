#!/usr/bin/env bash
# On a GPU machine (the `device` tool's, or any): `autopar probe --device cuda` on GPU 0, then the
# single-GPU check of the built-in model (benchmarks/gpu_check.py). Everything lands in $OUT
# (default reports/gpu-probe/): the probed cluster file, its raw measurements, the check's summary.
# About 4 minutes; the test suite never runs it. Uses the machine's own python3 and torch.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-reports/gpu-probe}"
PY="${PY:-python3}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # autopar from this checkout, in every subprocess
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
export AUTOPAR_LOCAL_PROFILE="$OUT/local.yaml"  # the probe's scratch file goes beside it
t0=$(date +%s)
if ! timeout 300 "$PY" -m autopar probe --device cuda --out "$OUT/probed-cluster.yaml" --timeout 280; then
  echo "autopar probe failed: the raw probe alone" >&2
  timeout 240 "$PY" -m autopar.trial.probe gpu --device cuda --out "$OUT/gpu-probe-raw.json"
fi
echo "probe: $(( $(date +%s) - t0 )) s"
# the node's NCCL collectives worker, a rank per GPU (autopar probe runs it on nodes of 2+ GPUs)
n=$(nvidia-smi -L | wc -l)
timeout 120 "$PY" -m torch.distributed.run --standalone --nproc_per_node "$n" -m autopar.trial.probe \
  node-collectives --device cuda --out "$OUT/node-collectives.json" && cat "$OUT/node-collectives.json"
[ -f "$OUT/probed-cluster.yaml" ] && sed -n '1,60p' "$OUT/probed-cluster.yaml"
# the built-in model's single-GPU runs of tests/cost/data/h200-gpu-runs.json (about 30 s each)
for cfg in "mbs2:--mbs 2 --gbs 8" "mbs1:--mbs 1 --gbs 8" "mbs4:--mbs 4 --gbs 8" \
  "seq8k:--mbs 1 --gbs 4 --seq-len 8192" "l8:--layers 8 --mbs 2 --gbs 8"; do
  name=${cfg%%:*}
  # shellcheck disable=SC2086  # the run's flags, split on purpose
  timeout 120 "$PY" benchmarks/gpu_check.py ${cfg#*:} --timeout 110 --out "$OUT/gpu_check_$name.json" > /dev/null &&
    "$PY" -c "import json; d = json.load(open('$OUT/gpu_check_$name.json')); print('$name', d['mean_step_time_s'], d['peak_memory_gib'], d['mfu'])"
done
echo "total: $(( $(date +%s) - t0 )) s"
