"""`autopar models`: the model presets with their derived sizes."""

from __future__ import annotations

from autopar.cli import app
from autopar.cli import options as o
from autopar.figures import PARAMS_TOTAL
from autopar.json_out import dumps


@app.command()
def models(as_json: o.Json = False) -> None:
    """List model presets: shape and derived parameter counts (total / active)."""
    from autopar.report.format import human_count
    from autopar.spec.presets import get_preset, preset_aliases, preset_names

    specs = [get_preset(n) for n in preset_names()]
    aliases = preset_aliases()
    if as_json:
        print(
            dumps(
                [
                    s.to_dict()
                    | {
                        PARAMS_TOTAL: s.params_total,
                        "params_active": s.params_active,
                        "aliases": [a for a, name in aliases.items() if name == s.name],
                    }
                    for s in specs
                ],
                indent=2,
            )
        )
        return

    from autopar.cli.render import compact_table, console

    t = compact_table("Model presets (parameter counts derived from the shapes)")
    for col in (
        "name",
        "layers",
        "hidden",
        "ffn",
        "heads/kv",
        "vocab",
        "seq",
        "MoE (experts/top-k/ffn)",
        "params",
        "active",
    ):
        # a preset's name stays whole in a narrow terminal: it is what `--model` takes
        t.add_column(
            col, justify="left" if col in ("name", "MoE (experts/top-k/ffn)") else "right", no_wrap=col == "name"
        )
    for s in specs:
        moe = f"{s.moe.num_experts}/{s.moe.top_k}/{s.moe.expert_ffn_hidden_size}" if s.moe else "-"
        t.add_row(
            s.name,
            str(s.num_layers),
            str(s.hidden_size),
            str(s.ffn_hidden_size),
            f"{s.num_attention_heads}/{s.num_kv_heads}",
            str(s.vocab_size),
            str(s.seq_len),
            moe,
            human_count(s.params_total),
            human_count(s.params_active),
        )
    console().print(t)
    # the short names `--model` takes too (models.toml's aliases), each with the preset it means
    shorts = compact_table("Aliases `--model` takes")
    shorts.add_column("alias", no_wrap=True)
    shorts.add_column("preset", no_wrap=True)
    for alias, name in aliases.items():
        shorts.add_row(alias, name)
    console().print(shorts)
