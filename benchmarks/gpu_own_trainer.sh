#!/usr/bin/env bash
# The own-trainer measured stage on a GPU machine (docs/trials.md, "Measure with your own trainer"):
# for each trainer found here, `autopar search --trials 2 --measure-with TRAINER` on the machine's
# GPUs (the tiny model in bf16, 3 timed steps; torchtitan, which needs a config of the model's
# shape, llama3-8b on 8 GPUs or more), then each trial's measured step time, memory and status. The test suite never runs it; a trainer not installed here is skipped
# with the line that says how to point autopar at it.
#   MEGATRON_LM=/path MEGATRON_BRIDGE=/path TORCHTITAN=/path benchmarks/gpu_own_trainer.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpu_own_trainer: no nvidia-smi, no GPU here; nothing to check" >&2
  exit 0
fi
GPUS=$(nvidia-smi --list-gpus | wc -l)
OUT="${OUT:-/tmp/autopar-own-trainer}"
mkdir -p "$OUT"
for trainer in deepspeed megatron bridge nemo torchtitan; do
  run="$OUT/$trainer"
  rm -rf "$run"
  echo "== $trainer on $GPUS GPU(s)"
  model=(--model tiny)
  case $trainer in
    bridge) model+=(--recipe llama32_1b_pretrain_config) ;;
    nemo) model+=(--recipe llama32_1b) ;;
    torchtitan)
      [ "$GPUS" -ge 8 ] || { echo "skipped: torchtitan needs a config of the model's shape (llama3-8b: 8 GPUs)"; continue; }
      model=(--model llama3-8b --seq-len 2048) ;;
  esac
  timeout 580 "$PY" -m autopar search "${model[@]}" --gpus "$GPUS" --gpu h100-sxm --dtype bf16 \
    --trials 2 --trial-steps 3 --trial-timeout 240 --measure-with "$trainer" --run-dir "$run" \
    --top-k 3 >"$run.log" 2>&1
  echo "exit $?"
  grep -E "^(Measured stage|  ->|Winner|no GPU|autopar: error)" "$run.log" | cut -c1-300
done
