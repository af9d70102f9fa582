"""Fine-grained activation offloading (--offload-modules): the bytes each microbatch sends to the
host, and the seconds of those copies the compute does not hide.

Megatron-Core (megatron/core/pipeline_parallel/fine_grained_activation_offload.py, megatron-core
0.16) copies the saved input of each offloaded module to pinned host memory on a device-to-host
stream during the forward (`PipelineOffloadManager._d2h_stream`) and copies it back on a
host-to-device stream ahead of the backward, one layer ahead (`_h2d_stream`, "pre-reload the last
layer of this chunk to hide reload latency"). The copies run on the copy engines, not the SMs, so
they cost the compute nothing while they are hidden; the GPU's host link is full duplex (PCIe,
NVLink-C2C), so the forward's copies and the backward's reloads each have the link to themselves.
Per microbatch and rank: the forward's copies are hidden under the forward's compute and the
reloads under the backward's (its recomputed forward included), and what exceeds them is exposed:
max(0, bytes / link - forward) + max(0, bytes / link - backward). The link rate is the GPU's
host_link_gbps x host_link_efficiency (autopar.cost.offload).

[UNCERTAIN] the GPU's PCIe link also carries its GPUDirect RDMA traffic on DGX/HGX nodes, where GPU
and NIC share a PCIe switch; the offload is priced with the link to itself.
"""

from __future__ import annotations

import numpy as np

from autopar.cost.gpu_memory import plan_shape
from autopar.cost.memory_stacks import STACKS, stack_name
from autopar.cost.plan_arrays import PlanArrays
from autopar.cost.stack_activations import stack_layers
from autopar.spec.hardware import ClusterSpec
from autopar.spec.model import ModelSpec


def offloaded_bytes(x: PlanArrays, model: ModelSpec, cluster: ClusterSpec) -> np.ndarray:
    """(C, n) bytes one microbatch's layers on each rank send to the host (and read back): what
    the rank's layers would keep without the offloading less what they keep with it, on the
    layers that are not fully recomputed (a recomputed layer keeps only its input)."""
    if not np.any(x.table.offload_modules):
        return np.zeros(np.shape(x.active))
    stack = STACKS[stack_name(cluster)]
    shape = plan_shape(x, model, cluster)
    kept = stack_layers(stack, model, shape)
    plain = stack_layers(stack, model, shape._replace(modules=x.recompute_modules))
    per_microbatch = x.dense_layers * (plain.dense - kept.dense) + x.moe_layers * (plain.moe - kept.moe)
    return per_microbatch * (1.0 - x.recompute_share)


def copy_seconds(x: PlanArrays, model: ModelSpec, cluster: ClusterSpec) -> np.ndarray:
    """(C, n) seconds per microbatch of each direction's copies over the host link; NaN where the
    GPU does not state its host link (the plan is then invalid, autopar.spec.rules
    `offload_modules_host`)."""
    moved = offloaded_bytes(x, model, cluster)
    gbps = cluster.gpu.host_link_gbps
    if gbps is None:
        return np.where(moved > 0, np.nan, 0.0)
    return moved / (gbps * 1e9 * cluster.constants.host_link_efficiency)


def exposed_copies(copies: np.ndarray, compute: np.ndarray, forward_share: np.ndarray) -> np.ndarray:
    """(C, n) seconds per microbatch the copies leave exposed (module docstring): `compute` seconds
    per microbatch, of which `forward_share` runs in the forward."""
    forward = compute * forward_share
    return np.maximum(copies - forward, 0.0) + np.maximum(copies - (compute - forward), 0.0)
