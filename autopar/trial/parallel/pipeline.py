"""Pipeline parallelism: stage modules cut by the plan's PipelineLayout, and the schedule that runs them.

The layout (autopar/spec/layout.py) gives the layers of each virtual stage; virtual stage i runs on
pipeline rank i % pp (Megatron's looped placement, as the cost model assumes), the embedding on
stage 0, the final norm, LM head and loss on the last. Uneven layouts (e.g. [2, 3]) run as given.

Schedules (torch.distributed.pipelining), by `plan.pp_schedule`:
- gpipe            -> ScheduleGPipe (all forwards, then all backwards), vpp = 1
- 1f1b             -> Schedule1F1B (Narayanan et al. 2021 PipeDream-Flush), vpp = 1
- interleaved-1f1b -> ScheduleInterleaved1F1B (Narayanan et al. 2021), vpp > 1 stages per rank
- zero-bubble      -> ScheduleInterleavedZeroBubble (Qi et al. 2024 ZB-H1, backward split into input
                      and weight gradients), looped placement, any vpp
Microbatches per step = global batch / (micro batch * dp); each dp rank feeds its share of the
global batch, split into microbatches by the schedule. Gradients are scaled by 1/microbatches, so a
step's gradient is the mean over the global batch, as in a single-process run.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
)
from torch.distributed.pipelining.schedules import PipelineScheduleMulti, PipelineScheduleSingle

from autopar.spec.plan import ParallelPlan
from autopar.trial.model import Transformer

if TYPE_CHECKING:  # the schedules' type for their list of stages
    from torch.distributed.pipelining.stage import _PipelineStageBase

SINGLE_STAGE = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
MULTI_STAGE = {"interleaved-1f1b": ScheduleInterleaved1F1B, "zero-bubble": ScheduleInterleavedZeroBubble}


def virtual_stages(plan: ParallelPlan, num_layers: int, pp_rank: int) -> list[tuple[int, range]]:
    """(virtual stage index, its global layer indices) held by pipeline rank `pp_rank`."""
    layout = plan.resolved_layout(num_layers)
    problems = layout.problems(num_layers, plan.pp, plan.vpp)
    if problems:
        raise ValueError("pipeline layout: " + "; ".join(problems))
    ranges = layout.layer_ranges()
    return [(i, ranges[i]) for i in range(pp_rank, plan.pp * plan.vpp, plan.pp)]


def stage_module(model: Transformer, layers: range, first: bool, last: bool) -> Transformer:
    """A stage of `model`: a new module sharing (not copying) the blocks it holds, with the
    embedding only on the first stage and norm + head only on the last."""
    stage = copy.copy(model)  # shallow: then give it its own module/parameter tables
    stage._modules = dict(model._modules)
    stage._parameters = dict(model._parameters)
    stage._buffers = dict(model._buffers)
    stage.layers = nn.ModuleDict({str(i): model.layers[str(i)] for i in layers})
    if not first:
        stage.tok_embeddings = None
    if not last:
        stage.norm = None
        stage.output = None
    return stage


def apply_pp(model: Transformer, plan: ParallelPlan, pp_mesh: DeviceMesh) -> list[tuple[int, Transformer]]:
    """This rank's (virtual stage index, stage module) pairs, cut from the full model."""
    if model.config.spec.tied_embeddings:
        raise ValueError(
            "tied embeddings under pipeline parallelism need an embedding-group gradient "
            "all-reduce, which the built-in model does not implement"
        )
    n = plan.pp * plan.vpp
    return [
        (i, stage_module(model, layers, first=i == 0, last=i == n - 1))
        for i, layers in virtual_stages(plan, model.config.spec.num_layers, pp_mesh.get_local_rank())
    ]


def build_schedule(
    stages: list[tuple[int, nn.Module]],
    plan: ParallelPlan,
    pp_mesh: DeviceMesh,
    device: torch.device,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
):
    """The plan's schedule over this rank's (possibly DDP/FSDP-wrapped) stage modules."""
    n = plan.pp * plan.vpp
    group = pp_mesh.get_group()
    pipe: list[_PipelineStageBase] = [PipelineStage(module, i, n, device, group=group) for i, module in stages]
    m = plan.num_microbatches
    name = plan.pp_schedule
    schedule: PipelineScheduleSingle | PipelineScheduleMulti
    if name in SINGLE_STAGE:
        if plan.vpp != 1:
            raise ValueError(f"the {name} schedule runs one stage per rank; vpp={plan.vpp} needs interleaved-1f1b")
        schedule = SINGLE_STAGE[name](pipe[0], m, loss_fn=loss_fn)
    elif name == "interleaved-1f1b" and plan.vpp == 1:
        raise ValueError("interleaved-1f1b needs vpp > 1")
    elif name in MULTI_STAGE:
        schedule = MULTI_STAGE[name](pipe, m, loss_fn=loss_fn)
    else:
        raise ValueError(f"unknown pipeline schedule {name!r}")
    # the losses come back through `losses=`; merged outputs would keep every microbatch's logits on
    # the last stage to the end of the step (torchtitan's trainer passes return_outputs=False too);
    # an instance attribute over the method, which the checker reports as a method assignment
    schedule.step = functools.partial(schedule.step, return_outputs=False)  # type: ignore[method-assign]
    return schedule
