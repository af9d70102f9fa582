"""Launch configs for real trainers: `render(plan, model, cluster) -> ExportBundle` per trainer.

    from autopar.export import EXPORTERS, get_exporter
    bundle = get_exporter("megatron").render(plan, model, cluster)
    bundle.write("launch/megatron")

Each trainer's exporter is one module registered here (autopar/export/base.py states the
contract; a trainer's helpers sit beside it as <trainer>_*.py): megatron (Megatron-LM), torchtitan,
deepspeed (DeepSpeed + Megatron-DeepSpeed), nemo (NeMo 2), bridge (Megatron-Bridge), and the
launchers torchrun and slurm, which wrap any of them.
"""

from __future__ import annotations

from autopar.export.base import ExportBundle, Exporter, ExportFile, ExportOptions, ExportRefused, SlurmOptions
from autopar.export.bridge import BridgeExporter
from autopar.export.deepspeed import DeepSpeedExporter
from autopar.export.launch import SlurmExporter, TorchrunExporter
from autopar.export.megatron import MegatronExporter
from autopar.export.nemo import NemoExporter
from autopar.export.registry import EXPORTERS, get_exporter, register
from autopar.export.torchtitan import TorchtitanExporter
from autopar.export.view import normalize, plan_view

for _cls in (
    MegatronExporter,
    TorchtitanExporter,
    DeepSpeedExporter,
    NemoExporter,
    BridgeExporter,
    TorchrunExporter,
    SlurmExporter,
):
    register(_cls())

__all__ = [
    "EXPORTERS",
    "ExportBundle",
    "ExportFile",
    "ExportOptions",
    "ExportRefused",
    "Exporter",
    "SlurmOptions",
    "get_exporter",
    "normalize",
    "plan_view",
    "register",
]
