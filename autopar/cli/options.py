"""Option types shared by the commands (typer Annotated aliases)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

Model = Annotated[str, typer.Option("--model", "-m", help="Preset name (see `autopar models`), a HuggingFace "
                                    "config.json, or an autopar model YAML/JSON file.")]
Gpus = Annotated[int, typer.Option("--gpus", "-g", help="Number of GPUs.")]
Gpu = Annotated[str, typer.Option("--gpu", help="GPU preset (see `autopar hardware`).")]
GpusPerNode = Annotated[Optional[int], typer.Option("--gpus-per-node", help="GPUs per node = NVLink domain "
                                                    "(default: the GPU preset's, 8; 72 for an NVL72 rack).")]
ClusterFile = Annotated[Optional[str], typer.Option("--cluster", help="Cluster / hardware-profile YAML "
                                                    "(overrides --gpu).")]
SeqLen = Annotated[Optional[int], typer.Option("--seq-len", "-s", help="Sequence length (default: the model's).")]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]

Tp = Annotated[int, typer.Option("--tp", help="Tensor-parallel size.")]
Pp = Annotated[int, typer.Option("--pp", help="Pipeline-parallel size.")]
Vpp = Annotated[int, typer.Option("--vpp", help="Virtual pipeline stages per pp rank (interleaved 1F1B).")]
Cp = Annotated[int, typer.Option("--cp", help="Context-parallel size.")]
Dp = Annotated[Optional[int], typer.Option("--dp", help="Data-parallel size (default: gpus / (tp*pp*cp)).")]
Ep = Annotated[int, typer.Option("--ep", help="Expert-parallel size (carved out of dp x cp (x tp) ranks).")]
Etp = Annotated[Optional[int], typer.Option("--etp", help="Expert tensor-parallel size (default: tp).")]
Zero = Annotated[int, typer.Option("--zero", help="ZeRO stage: 0 DDP, 1 distributed optimizer, 2 + sharded "
                                   "gradients, 3 FSDP.")]
Sp = Annotated[Optional[bool], typer.Option("--sp/--no-sp", help="Sequence parallelism (default: on when tp > 1).")]
Mbs = Annotated[int, typer.Option("--mbs", help="Micro-batch size (sequences).")]
Gbs = Annotated[Optional[int], typer.Option("--gbs", help="Global batch size in sequences (default: ~4M tokens).")]
PpSchedule = Annotated[Optional[str], typer.Option("--pp-schedule", help="gpipe | 1f1b | interleaved-1f1b | "
                                                   "zero-bubble (default: 1f1b, interleaved when vpp > 1).")]
Recompute = Annotated[str, typer.Option("--recompute", help="none | selective | full.")]
RecomputeLayers = Annotated[Optional[int], typer.Option("--recompute-layers", help="With --recompute full: layers "
                                                        "per stage to recompute (default: all).")]
Dtype = Annotated[Optional[str], typer.Option("--dtype", help="bf16 | fp8 (GEMMs in FP8) | fp32 (full precision, "
                                             "e.g. CPU trials). Default: bf16; fp32 on --gpu local.")]
Grads = Annotated[str, typer.Option("--grads", help="Main-gradient dtype: fp32 (Megatron, 18 B/param) or bf16 "
                                    "(the seeds' 16N).")]
PpLayout = Annotated[Optional[str], typer.Option("--pp-layout", help="Layers per virtual stage, e.g. 4,5,5,4.")]
PpFirst = Annotated[Optional[int], typer.Option("--pp-first", help="Layers on the first stage "
                                                "(Megatron --decoder-first-pipeline-num-layers).")]
PpLast = Annotated[Optional[int], typer.Option("--pp-last", help="Layers on the last stage.")]
EmbeddingAsLayer = Annotated[bool, typer.Option("--pp-embedding-as-layer", help="Count the embedding as a layer "
                                                "when balancing stages.")]
LossAsLayer = Annotated[bool, typer.Option("--pp-loss-as-layer", help="Count the loss as a layer when balancing.")]
RoutingImbalance = Annotated[float, typer.Option("--routing-imbalance", help="MoE: busiest expert rank's tokens / "
                                                 "the mean (1 = balanced).")]
TpCommOverlap = Annotated[bool, typer.Option("--tp-comm-overlap", help="Overlap TP collectives with GEMMs "
                                              "(Megatron --tp-comm-overlap / async TP).")]

# ---- `autopar trial` (a plan run for real: small batches, fp32 on CPU) ----------------------------
TrialGbs = Annotated[Optional[int], typer.Option("--gbs", help="Global batch size in sequences (default: "
                                                 "mbs x dp x pp, one microbatch per pipeline stage).")]
TrialDtype = Annotated[str, typer.Option("--dtype", help="fp32 (CPU trials) | bf16 (GPU).")]
