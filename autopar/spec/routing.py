"""MoE routing as an input of the plan's question, never a fitted constant: how many tokens the
busiest expert rank receives over the mean.

- Forced-balanced routing (Megatron `--moe-router-force-load-balancing`, what NVIDIA's MoE
  benchmark tables run): 1.
- A real (learned) router, dropless: REAL_ROUTER_IMBALANCE, the default for a real training run.
  Its value comes from the only paired measurement in the published runs autopar is built from:
  Megatron-MoE-ModelZoo's long-context table prints, for the same Qwen3-235B-A22B layouts on 256
  H100, the throughput with forced balance and with the real router (dropless): 295 / 237, 335 /
  277, 368 / 320, 389 / 357 TFLOP/s at 16K-128K. The imbalance that turns each forced-balanced
  prediction into its dropless measurement (autopar.calibration.routing_derivation re-derives it, and a
  test checks this value against the derivation) is 1.70-1.80 under the shipped profiles; this is
  their median, rounded. It is measured on one model and router (Qwen3-235B-A22B in
  Megatron-Core); other routers may differ, and no published pair measures them yet.
"""

from __future__ import annotations

FORCED_BALANCED = 1.0
REAL_ROUTER_IMBALANCE = 1.79
