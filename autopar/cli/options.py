"""Option types shared by the commands (typer Annotated aliases)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

Model = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="Preset name (see `autopar models`), a HuggingFace config.json, or an autopar model YAML/JSON file.",
    ),
]
Gpus = Annotated[int, typer.Option("--gpus", "-g", help="Number of GPUs.")]
Gpu = Annotated[str, typer.Option("--gpu", help="GPU preset (see `autopar hardware`).")]
GpusPerNode = Annotated[
    Optional[int],
    typer.Option(
        "--gpus-per-node", help="GPUs per node = NVLink domain (default: the GPU preset's, 8; 72 for an NVL72 rack)."
    ),
]
PowerLimit = Annotated[
    Optional[float],
    typer.Option(
        "--power-limit",
        help="Power limit per GPU in watts (default: the GPU's own, its TDP): compute-bound kernels slow "
        "with the clock under a cap, memory-bound ones barely move; energy is priced at it.",
    ),
]
ClusterFile = Annotated[
    Optional[str], typer.Option("--cluster", help="Cluster / hardware-profile YAML (overrides --gpu).")
]
SeqLen = Annotated[Optional[int], typer.Option("--seq-len", "-s", help="Sequence length (default: the model's).")]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]
Gbs = Annotated[Optional[int], typer.Option("--gbs", help="Global batch size in sequences (default: ~4M tokens).")]

RoutingImbalance = Annotated[
    Optional[float],
    typer.Option(
        "--routing-imbalance",
        help="MoE: the busiest expert rank's tokens / the mean. Default: a real router's, 1.79 (the "
        "published forced-balanced / dropless pairs), capped at ep; 1 = forced balance (benchmark runs).",
    ),
]
