"""Optimizer offload to host memory (--optimizer-offload f): what moves, and what the step pays.

A share f of each rank's optimizer shard (its fp32 master weights and Adam moments) lives in host
memory and is stepped by a CPU Adam:
- Megatron-Core (megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py HybridDeviceOptimizer,
  param_update_in_fp32=True): the offloaded parameters' fp32 copies and AdamW states on the CPU,
  their gradients copied into pinned fp32 host buffers (`_set_sub_optimizer_grads`, 4 B), the
  updated fp32 parameters copied back into the 16-bit model weights (`param_copy_back_gpu_hook`:
  torch's copy_ converts to the destination dtype before the transfer, 2 B in bf16) [UNCERTAIN:
  the dtype each copy crosses the link in is torch's, aten/src/ATen/native/cuda/Copy.cu, not read
  here]; the main-gradient buffer and the 16-bit weights stay on the GPU (the DDP buffers are
  untouched). Host: fp32 master, m, v and the fp32 gradient, 16 B per offloaded parameter.
- DeepSpeed ZeRO-Offload (deepspeed/runtime/zero/stage_1_and_2.py, cpu_offload): the fp32
  partition, its fp32 gradient partition and the Adam states on the CPU
  (`initialize_optimizer_states`, pinned), the gradients copied in fp32
  (`async_inplace_copy_grad_to_fp32_buffer_from_gpu`, 4 B), the updated partition cast into a
  pinned 16-bit buffer and copied back (`step`: `param_buffer_of_bit16_for_cpu_offload_groups`,
  2 B). Host: 16 B as above plus the 16-bit buffer, 18 B per offloaded parameter; the GPU's fp32
  gradient partition leaves with the rest.
Time per step, from the hardware data: the device-to-host and host-to-device bytes over the GPU's
host link (GpuSpec.host_link_gbps x host_link_efficiency; each GPU of a DGX/HGX node has its own
PCIe x16 link, GB200 its own NVLink-C2C), and the CPU Adam's host DRAM bytes at
GpuSpec.host_memory_gbps (the node's DRAM bandwidth per GPU) x cpu_adam_memory_efficiency. A
trainer that pipelines the three per tensor (cpu_optimizer_overlap 1: Megatron's
overlap_cpu_optimizer_d2h_h2d) pays the slowest; otherwise their sum.
"""

from __future__ import annotations

import numpy as np

from autopar.cost.params import RankParams
from autopar.cost.plan_arrays import PlanArrays
from autopar.spec.hardware import ClusterSpec

#: gradient bytes per offloaded parameter sent to the host: fp32 (Megatron's pinned fp32 gradient
#: buffers, `cpu_copy_map_grad`; DeepSpeed's fp32 gradient partition)
GRADIENT_TO_HOST_BYTES = 4.0
#: host DRAM bytes per offloaded parameter of one CPU Adam step: AdamW reads the fp32 master, the
#: fp32 gradient, m and v (16 B) and writes the master, m and v (12 B) (torch.optim.AdamW's
#: _multi_tensor / fused CPU kernel, DeepSpeed csrc/adam/cpu_adam_impl.cpp Step_AVX: the same
#: arrays), then the updated master is read again (4 B) for its 16-bit copy (2 B) before the
#: transfer
CPU_ADAM_BYTES_PER_PARAM = 16.0 + 12.0 + 4.0 + 2.0
#: host memory per offloaded parameter: fp32 master, m, v and the fp32 gradient (Megatron); DeepSpeed
#: adds the pinned 16-bit copy of its partition
HOST_BYTES_PER_PARAM = {"megatron": 16.0, "deepspeed": 18.0}


def offloaded_params(x: PlanArrays, prm: RankParams) -> np.ndarray:
    """(C, n) parameters of each rank's optimizer shard kept on the host: the share f of the shard
    (ZeRO-1+ shards it over the data-parallel group, the experts over their expert-data group)."""
    sharded = x.table.zero_stage >= 1
    shard = prm.dense / np.where(sharded, x.dp_shard, 1.0) + prm.expert / np.where(sharded, x.expert_dp, 1.0)
    return shard * x.table.optimizer_offload


def _rate(gbps: float | None, efficiency: float) -> float:
    """Bytes per second; NaN where the GPU does not state the figure (the plan is then invalid,
    autopar.spec.rules `optimizer_offload_host`)."""
    return float("nan") if gbps is None else gbps * 1e9 * efficiency


def offload_seconds(x: PlanArrays, cluster: ClusterSpec, prm: RankParams) -> np.ndarray:
    """(C, n) seconds per step the offloaded optimizer step adds (module docstring); 0 without offload."""
    params = offloaded_params(x, prm)
    k = cluster.constants
    link = _rate(cluster.gpu.host_link_gbps, k.host_link_efficiency)
    dram = _rate(cluster.gpu.host_memory_gbps, k.cpu_adam_memory_efficiency)
    to_host = params * GRADIENT_TO_HOST_BYTES / link
    to_device = params * x.weight_bytes / link
    cpu_adam = params * CPU_ADAM_BYTES_PER_PARAM / dram
    pipelined = np.maximum(np.maximum(to_host, to_device), cpu_adam)
    serial = to_host + cpu_adam + to_device
    seconds = k.cpu_optimizer_overlap * pipelined + (1.0 - k.cpu_optimizer_overlap) * serial
    return np.where(params > 0, seconds, 0.0)


def host_bytes(x: PlanArrays, prm: RankParams, deepspeed: bool) -> np.ndarray:
    """(C, n) host memory per GPU the offloaded shard takes (HOST_BYTES_PER_PARAM)."""
    return offloaded_params(x, prm) * HOST_BYTES_PER_PARAM["deepspeed" if deepspeed else "megatron"]
