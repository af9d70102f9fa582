"""Single-GPU check of the built-in model: tp1/pp1 training steps of a ~1B-parameter slice in bf16,
with MFU and peak memory. Run by benchmarks/gpu_check.sh on a GPU machine; not part of the suite.

The slice: llama2-7b cut to 4 layers (4 x 202M + 2 x 131M embedding/head = 1.07B parameters),
sequence 4096, micro-batch 2, global batch 8 (4 microbatches of gradient accumulation), AdamW,
bf16 autocast over fp32 master weights. MFU = model FLOPs per step (autopar.cost.flops, 6 x
forward incl. causal attention) / step time / the GPU's dense bf16 peak (autopar spec data).
Imports no torch itself: the trial runs under torchrun through autopar.measured.launcher.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autopar.measured.config import TrialConfig  # noqa: E402
from autopar.measured.launcher import launch  # noqa: E402
from autopar.spec.hardware import get_gpu, preset_for_device  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--mbs", type=int, default=2)
    ap.add_argument("--gbs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=270.0)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: an fp32 smoke test of this script")
    ap.add_argument(
        "--out",
        type=Path,
        default=REPO / "reports" / "gpu_check.json",
        help="summary JSON (reports/ is git-ignored); the run's logs go beside it",
    )
    args = ap.parse_args()

    dtype = "bf16" if args.device == "cuda" else "fp32"
    trial = TrialConfig(
        name=f"{args.model}-{args.layers}L-{dtype}",
        model=args.model,
        scale={"num_layers": args.layers},
        seq_len=args.seq_len,
        steps=args.steps,
        warmup=args.warmup,
        device=args.device,
        optimizer="adamw",
        lr=1e-4,
        count_comm=False,
        plan={
            "tp": 1,
            "pp": 1,
            "dp": 1,
            "dtype": dtype,
            "zero_stage": 0,
            "micro_batch_size": args.mbs,
            "global_batch_size": args.gbs,
        },
    )
    run = launch([trial], 1, timeout_s=args.timeout, workdir=args.out.parent / "gpu_check_run")
    if not run.succeeded or not run.trials:
        print(f"FAILED: {run.outcome}: {'; '.join(run.reasons)}\n{run.stderr_tail[-4000:]}", file=sys.stderr)
        return 1
    t = run.trials[0]
    env = run.result["env"]
    key = preset_for_device(env.get("gpu", ""))
    peak_tflops = get_gpu(key).bf16_tflops if key else None
    mfu = t["model_flops_per_step"] / t["mean_step_time_s"] / (peak_tflops * 1e12) if peak_tflops else None
    rank = t["ranks"][0]
    summary = {
        "gpu": env.get("gpu"),
        "torch": env["torch"],
        "cuda": env.get("cuda"),
        "trial": t["name"],
        "params": rank["param_count"],
        "seq_len": t["seq_len"],
        "tokens_per_step": t["tokens_per_step"],
        "step_time_s": t["step_time_s"],
        "mean_step_time_s": t["mean_step_time_s"],
        "tokens_per_s": t["tokens_per_s"],
        "model_tflops_per_s": t["model_flops_per_step"] / t["mean_step_time_s"] / 1e12,
        "peak_bf16_tflops": peak_tflops,
        "mfu": mfu,
        "peak_memory_gib": rank["peak_memory_bytes"] / 2**30,
        "losses": t["losses"],
        "wall_s": run.wall_s,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
