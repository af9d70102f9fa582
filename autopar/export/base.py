"""The exporter contract: a plan, a model and a cluster in, the files a trainer runs out.

    Exporter.render(plan, model, cluster, options) -> ExportBundle
    Exporter.parse(bundle) -> dict          (the plan as the trainer will read it back)

Contract every exporter keeps (tests/export/test_contract.py checks it for every registered one):
- Pure and deterministic: the same inputs give byte-identical files (no clock, no environment).
- Faithful or refused: every field of the plan that the trainer's layout depends on (degrees,
  batch sizes, pipeline schedule and layout, recompute choice, precision, overlap, MoE dispatch) is
  expressed in the files, or `render` raises `ExportRefused` (an `InputError`) whose one-line
  message names what the trainer cannot run and why. Nothing is silently dropped or approximated.
- One source of refusals: `render` re-targets the plan to the exporter's trainer and refuses what
  that trainer's capability table forbids (autopar.export.capabilities), with the table's sentence,
  the same one the search applies; exporters keep only checks that depend on their own options.
- Round trip: `parse(render(plan, ...))` equals `plan_view(plan, model)` after `normalize`
  (autopar.export.view), for the plan re-targeted to the exporter's trainer (a "default" FP8 recipe
  is that trainer's).
- Every text file starts with the header (model, cluster, predicted memory, step time, MFU, the
  autopar command that produced it); JSON files carry it under the "_autopar" key.
- The launch scripts place ranks the way the cost model assumed (autopar.spec.plan.MESH_ORDER:
  tp innermost on consecutive ranks of one node, then cp, dp, and pp outermost).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from autopar.errors import InputError, quoted
from autopar.quoting import check_identifier, check_text
from autopar.spec.hardware import ClusterSpec
from autopar.spec.model import ModelSpec
from autopar.spec.plan import ParallelPlan
from autopar.spec.routing import REAL_ROUTER_IMBALANCE
from autopar.spec.trainers import RECIPE_EXAMPLE

if TYPE_CHECKING:  # imported where the estimate is made (Context.make)
    from autopar.calibration.estimate import Estimate


class ExportRefused(InputError):
    """The trainer cannot express this plan. The message says what and why, on one line."""

    def __init__(self, trainer: str, reason: str):
        self.trainer = trainer
        self.reason = reason
        super().__init__(f"{trainer} cannot run this plan: {reason}")


@dataclass(frozen=True, kw_only=True)
class SlurmOptions:
    job_name: str = "autopar"
    partition: str | None = None
    account: str | None = None
    time: str | None = None  # e.g. 04:00:00
    container_image: str | None = None  # pyxis/enroot --container-image


@dataclass(frozen=True, kw_only=True)
class ExportOptions:
    """Everything an exporter needs beyond (plan, model, cluster). All optional."""

    seq_len: int | None = None  # default: the model's
    #: the autopar command line that produced the export (header); default: the equivalent
    #: `autopar estimate` command
    command: str | None = None
    #: where the plan came from, e.g. "rank 1 of reports/run/top.json"
    source: str | None = None
    #: torchtitan release: "0.3" (Python config, current) or "0.2.2" (TOML, any release <= 0.2.2)
    torchtitan_version: str = "0.3"
    #: torchtitan base config: "module:function" (>= 0.3) or "name:flavor" (<= 0.2.2); default
    #: from the model preset
    torchtitan_base: str | None = None
    #: NeMo 2 recipe module (e.g. llama3_70b) / Megatron-Bridge recipe function (e.g.
    #: llama3_70b_pretrain_config); default from the model preset
    recipe: str | None = None
    #: (trainer, recipe) pairs, where `recipe` is None: what a search's --recipe named (its run
    #: directory's question)
    recipes: tuple[tuple[str, str], ...] = ()
    #: what the torchrun / slurm exporters launch; None = the plan's own trainer
    trainer: str | None = None
    master_port: int = 29500
    slurm: SlurmOptions = field(default_factory=SlurmOptions)
    #: a short run instead of training: this many steps on the trainer's mock data, no checkpoints,
    #: every step logged (autopar.export.short_run); None = the training run
    short_run_steps: int | None = None

    def recipe_for(self, trainer: str) -> str | None:
        """--recipe, else the recipe the search named for this trainer, else None (the preset's)."""
        return self.recipe if self.recipe is not None else dict(self.recipes).get(trainer)


@dataclass(frozen=True)
class ExportFile:
    name: str
    text: str
    executable: bool = False


@dataclass(frozen=True)
class ExportBundle:
    """The files of one export, what to run, and what the user must still fill in."""

    format: str
    files: tuple[ExportFile, ...]
    run: str  # the command a user runs (from the output directory)
    notes: tuple[str, ...] = ()
    #: parse-back hints that are not file content (e.g. which trainer a launcher wraps)
    meta: dict = field(default_factory=dict, compare=False)

    def file(self, name: str) -> ExportFile:
        for f in self.files:
            if f.name == name:
                return f
        raise KeyError(f"{self.format} export has no file {name!r}; it has {[f.name for f in self.files]}")

    def text(self, name: str) -> str:
        return self.file(name).text

    def write(self, out_dir: str | Path) -> list[Path]:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for f in self.files:
            p = out / f.name
            p.write_text(f.text, encoding="utf-8")
            if f.executable:
                p.chmod(0o755)
            paths.append(p)
        return paths


class Exporter:
    """Base class of the trainer exporters. Subclasses set the class attributes and implement
    `_render` and `parse`; `render` wraps `_render` with the shared checks and the header."""

    name: str = ""
    title: str = ""  # one line for `autopar export --help`
    example: str = ""  # an `autopar export` command line
    description: str = ""  # a few lines: what the files are and how to run them

    def render(
        self, plan: ParallelPlan, model: ModelSpec, cluster: ClusterSpec, options: ExportOptions | None = None
    ) -> ExportBundle:
        """The files for `plan` re-targeted to this exporter's trainer; raises ExportRefused with the
        capability table's sentence when that trainer cannot run it."""
        options = options or ExportOptions()
        check_inputs(model, options)
        trainer = self.runs_on(plan, options)
        ctx = Context.make(
            self.name, plan.with_(trainer=trainer), model, cluster, options, waived=self.waived_for(trainer, options)
        )
        bundle = self._render(ctx)
        return replace(bundle, meta={**bundle.meta, "trainer": trainer, "estimate": ctx.estimate})

    def runs_on(self, plan: ParallelPlan, options: ExportOptions) -> str:
        """The trainer whose files this exporter writes (launchers: the one they wrap)."""
        return self.name

    def waived(self, options: ExportOptions) -> frozenset[str]:
        """Capability lines an export option stands in for (default: `--recipe` for `<trainer>:recipes`)."""
        from autopar.export.capabilities import recipe_waiver

        return recipe_waiver(self.name, options.recipe_for(self.name))

    def waived_for(self, trainer: str, options: ExportOptions) -> frozenset[str]:
        """The capability lines waived for `trainer` (runs_on's): this exporter's own; a launcher
        asks the trainer it wraps (autopar.export.launch)."""
        return self.waived(options)

    def _render(self, ctx: "Context") -> ExportBundle:  # pragma: no cover - abstract
        raise NotImplementedError

    def parse(self, bundle: ExportBundle) -> dict:  # pragma: no cover - abstract
        """The plan as the trainer reads it back from the files: the keys of `plan_view`."""
        raise NotImplementedError


def check_inputs(model: ModelSpec, options: ExportOptions) -> None:
    """Refuse, in one line, values that no quoting makes safe in a script (autopar.quoting): a line
    break or control character in the model name or an option, a recipe that is not a Python name."""
    check_text(model.name, "the model name")
    s = options.slurm
    for flag, value in (
        ("--job-name", s.job_name),
        ("--partition", s.partition),
        ("--account", s.account),
        ("--time", s.time),
        ("--container-image", s.container_image),
        ("--torchtitan-base", options.torchtitan_base),
        ("--torchtitan-version", options.torchtitan_version),
    ):
        if value is not None:
            check_text(str(value), flag)
            if len(str(value)) > (1024 if flag == "--container-image" else 256):
                raise InputError(
                    f"{flag} {quoted(str(value))} is too long; give at most "
                    f"{1024 if flag == '--container-image' else 256} characters"
                )
    for recipe in [options.recipe] + [r for _, r in options.recipes]:
        if recipe is not None:
            check_identifier(recipe, "--recipe", example=RECIPE_EXAMPLE)


# ---- the rendering context shared by every exporter ---------------------------------------------


@dataclass(frozen=True)
class Context:
    trainer: str
    plan: ParallelPlan
    model: ModelSpec
    cluster: ClusterSpec
    options: ExportOptions
    seq_len: int
    num_gpus: int
    nodes: int
    gpus_per_node: int
    stages: tuple[int, ...]  # layers per virtual stage (the resolved layout)
    estimate: Estimate

    @classmethod
    def make(
        cls,
        trainer: str,
        plan: ParallelPlan,
        model: ModelSpec,
        cluster: ClusterSpec,
        options: ExportOptions,
        waived: frozenset[str] = frozenset(),
    ) -> "Context":
        """`trainer` is the export format; `plan.trainer` the trainer that runs it, whose capability
        lines (less `waived`) refuse the plan with their sentence. Other broken rules: InputError."""
        from autopar.calibration.estimate import estimate
        from autopar.export.capabilities import broken_rules

        s = options.seq_len or model.seq_len
        n = plan.num_gpus
        broken = broken_rules(plan, model, cluster, num_gpus=n, seq_len=s, waived=waived)
        if broken.other:
            raise InputError("invalid plan: " + "; ".join(text for _, text in broken.other))
        if broken.capability:
            raise ExportRefused(plan.trainer, broken.capability[0][1])
        # the header's figures price a real router, as the search does (autopar.spec.routing)
        est = estimate(plan, model, cluster, num_gpus=n, seq_len=s, routing_imbalance=REAL_ROUTER_IMBALANCE)
        g = cluster.gpus_per_node
        if n % g and n > g:
            raise InputError(
                f"{n} GPUs do not fill whole nodes of {g} GPUs; launch scripts need "
                f"gpus a multiple of --gpus-per-node (or fewer GPUs than one node)"
            )
        per_node = min(g, n)
        return cls(
            trainer=trainer,
            plan=plan,
            model=model,
            cluster=cluster,
            options=options,
            seq_len=s,
            num_gpus=n,
            nodes=max(1, n // g),
            gpus_per_node=per_node,
            stages=tuple(plan.resolved_layout(model.num_layers).stages),
            estimate=est,
        )

    # ---- small shared facts ----

    @property
    def layout_is_even(self) -> bool:
        return len(set(self.stages)) == 1

    def refuse(self, reason: str) -> ExportRefused:
        return ExportRefused(self.trainer, reason)
