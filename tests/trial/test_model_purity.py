"""The built-in model knows nothing of parallelism (torchtitan's design): autopar/trial/model.py
(and its moe.py and layers.py) imports nothing of torch.distributed nor of the parallel steps, and
holds no process group; the `apply_*` steps swap in what parallelism changes (the ring attention
core, the expert dispatch, the sequence-wide routing statistics). Checked on the source, and on a
model the steps ran on."""

from __future__ import annotations

import ast
from pathlib import Path

import torch

from autopar.spec.presets import get_preset
from autopar.trial.model import ModelConfig, Transformer
from autopar.trial.moe import MoE

TRIAL = Path(__file__).resolve().parents[2] / "autopar" / "trial"
MODEL_FILES = [TRIAL / "model.py", TRIAL / "moe.py", TRIAL / "layers.py"]


def _imports(tree: ast.AST) -> list[str]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append(node.module or "")
    return out


def test_the_model_source_imports_no_parallelism() -> None:
    for path in MODEL_FILES:
        tree = ast.parse(path.read_text())
        bad = [m for m in _imports(tree) if m.startswith(("torch.distributed", "autopar.trial.parallel"))]
        assert not bad, (path.name, bad)
        names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | {
            n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
        }
        assert not [n for n in names if n.endswith("_group") or n in ("dist", "all_reduce", "all_to_all_single")]


def test_a_model_holds_no_process_group() -> None:
    spec = get_preset("tiny-moe")
    with torch.device("meta"):
        model = Transformer(ModelConfig(spec=spec, vocab_rows=spec.vocab_size, max_seq_len=spec.seq_len))
    for module in model.modules():
        for value in vars(module).values():
            assert not type(value).__name__.endswith("ProcessGroup"), (module, value)
    moes = [m for m in model.modules() if isinstance(m, MoE)]
    assert moes
    for moe in moes:  # the defaults: every expert here, the statistics of local tokens
        assert moe.routed_experts.__func__ is MoE.routed_experts
        assert moe.sequence_stats.__func__ is MoE.sequence_stats
