"""GPU calibration check (issue 6): `autopar.trial.probe` bf16 GEMMs on GPU 0, then 3 single-GPU
trials of a llama2-7b slice (micro-batch 1, 2, 4), then the bounded least-squares fit of the cost
model's constants to them (autopar.calibration.calibrate), printed with residuals. Budget: under 5 minutes
on one GPU. Run by benchmarks/gpu_check.sh; not part of the suite. Imports no torch itself.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autopar.calibration.calibrate import calibrate, fit_gemm, predict  # noqa: E402
from autopar.measured.measure import measure_plan  # noqa: E402
from autopar.spec.hardware import default_cluster, preset_for_device  # noqa: E402
from autopar.spec.plan import ParallelPlan  # noqa: E402
from autopar.spec.presets import get_preset  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--gbs", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=80.0, help="seconds per trial")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: smoke test (tiny, fp32)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="autopar-gpucal-"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "autopar.trial.probe",
            "gemm",
            "--device",
            args.device,
            "--out",
            str(work / "gemm.json"),
        ],
        check=True,
        cwd=REPO,
        timeout=120,
    )
    g = json.loads((work / "gemm.json").read_text())
    peak, half = fit_gemm(g["gemm"])
    name = g.get("device", "cpu")
    key = (preset_for_device(name) or "h100-sxm") if args.device == "cuda" else "local"
    cluster = default_cluster(key, gpus_per_node=1)
    print(
        f"probe: {name}: bf16 GEMM peak {peak / 1e12:.0f} TFLOP/s fitted (preset {cluster.gpu.bf16_tflops:.0f}), "
        f"half-efficiency dim {half:.0f}"
    )
    model = get_preset(args.model).scaled(num_layers=args.layers) if args.device == "cuda" else get_preset("tiny")
    seq = args.seq_len if args.device == "cuda" else 128
    dtype = "bf16" if args.device == "cuda" else "fp32"
    plans, docs = [], []
    for mbs in (1, 2, 4):
        plan = ParallelPlan(micro_batch_size=mbs, global_batch_size=args.gbs, dtype=dtype, zero_stage=0)
        doc = measure_plan(
            model.to_dict() | {"name": model.name},
            plan.to_dict(),
            1,
            steps=3,
            warmup=1,
            seq_len=seq,
            timeout_s=args.timeout,
            device=args.device,
            workdir=work / f"mbs{mbs}",
        )
        print(
            f"trial mbs {mbs}: {doc['status']} "
            + (
                f"{doc['measured']['step_time_s']:.3f} s/step, peak "
                f"{doc['measured']['peak_memory_bytes'] / 2**30:.2f} GiB"
                if doc["measured"]
                else str(doc["reasons"])
            )
        )
        if doc["measured"]:
            plans.append(plan)
            docs.append(doc)
    if len(plans) < 2:
        print("gpu_calibrate: fewer than 2 trials ran; nothing to fit")
        return 1
    meas = [d["measured"]["step_time_s"] for d in docs]
    mem = [d["measured"]["peak_memory_bytes"] for d in docs]
    before = predict(plans, model, cluster, 1, seq)[0]
    cal = calibrate(
        plans,
        meas,
        mem,
        model,
        cluster,
        1,
        seq,
        names=["gemm_efficiency", "layer_overhead_us", "elementwise_traffic_factor"],
    )
    for n in cal.time_fit.names + (cal.memory_fit.names if cal.memory_fit else []):
        print(f"  {n:28s} {getattr(cluster.constants, n):.4g} -> {getattr(cal.cluster.constants, n):.4g}")
    for p, m, b, a in zip(plans, meas, before, cal.predicted_s):
        print(f"  mbs {p.micro_batch_size}: measured {m:.4f} s, predicted {b:.4f} -> {a:.4f} s")
    print(f"gpu_calibrate: done in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
