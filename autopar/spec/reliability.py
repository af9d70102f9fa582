"""How reliable a cluster is: how often its jobs are interrupted and how fast they checkpoint and
restart (a cluster file's `reliability:` mapping, autopar.spec.hardware.ClusterSpec), with defaults
from the Llama 3 paper. autopar.cost.goodput turns it into goodput; autopar.spec.training_run
re-exports it with the run's other quantities."""

from __future__ import annotations

from dataclasses import dataclass, fields

from autopar.errors import InputError, quoted
from autopar.spec.schema import check_number

#: the Llama 3 paper (Dubey et al. 2024, "The Llama 3 Herd of Models", sec. 3.3.4): 419 unexpected
#: interruptions in a 54-day snapshot of pre-training on 16,384 H100 GPUs
LLAMA3_INTERRUPTIONS, LLAMA3_DAYS, LLAMA3_GPUS = 419, 54, 16_384
#: interruptions per GPU-hour of a large H100 cluster (the Llama 3 figures above)
DEFAULT_INTERRUPTIONS_PER_GPU_HOUR = LLAMA3_INTERRUPTIONS / (LLAMA3_DAYS * 24 * LLAMA3_GPUS)
#: checkpoint storage bandwidth per GPU, GB/s: Meta's Tectonic file system sustains 2 TB/s for the
#: 16,384-GPU Llama 3 cluster (Dubey et al. 2024, sec. 3.3.1); each GPU's share of a write or read
DEFAULT_CHECKPOINT_GBPS_PER_GPU = 2000.0 / LLAMA3_GPUS
#: [assumed] seconds from an interruption to training again, before the checkpoint read: the
#: scheduler restarting the job and NCCL and the data loaders starting up on thousands of GPUs
#: (the Llama 3 paper gives no figure; ten minutes is the order its operators describe)
DEFAULT_RESTART_S = 600.0


@dataclass(frozen=True)
class Reliability:
    """How often a cluster's jobs are interrupted and how fast they checkpoint and restart (a
    cluster file's `reliability:` mapping; defaults from the Llama 3 paper)."""

    interruptions_per_gpu_hour: float = DEFAULT_INTERRUPTIONS_PER_GPU_HOUR
    checkpoint_gbps_per_gpu: float = DEFAULT_CHECKPOINT_GBPS_PER_GPU
    restart_s: float = DEFAULT_RESTART_S

    def __post_init__(self) -> None:
        check_number(
            self.interruptions_per_gpu_hour,
            "reliability: interruptions_per_gpu_hour",
            0.0,
            1.0,
            fix="fix the cluster file (the Llama 3 paper's cluster: 1.97e-5)",
        )
        check_number(
            self.checkpoint_gbps_per_gpu,
            "reliability: checkpoint_gbps_per_gpu",
            0.0,
            1e4,
            above=True,
            fix="fix the cluster file (storage GB/s divided by the GPUs writing)",
        )
        check_number(self.restart_s, "reliability: restart_s", 0.0, 7 * 86_400.0, fix="fix the cluster file")

    @classmethod
    def from_dict(cls, data: object, origin: str) -> "Reliability":
        if not isinstance(data, dict):
            raise InputError(
                f"{origin}: 'reliability' must be a mapping of {', '.join(_RELIABILITY_KEYS)}, got "
                f"{quoted(data)}; fix the cluster file"
            )
        unknown = [k for k in data if k not in _RELIABILITY_KEYS]
        if unknown:
            raise InputError(
                f"{origin}: unknown reliability field {quoted(str(unknown[0]), 40)}; known: "
                f"{', '.join(_RELIABILITY_KEYS)}"
            )
        try:
            return cls(**data)
        except InputError as e:
            raise InputError(f"{origin}: {e}") from None


_RELIABILITY_KEYS = tuple(f.name for f in fields(Reliability))
