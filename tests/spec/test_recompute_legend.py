"""The legend under the search's tables for the abbreviated selective-recompute labels (sel:norm+up):
each short name used, once, with the Megatron module it stands for (autopar.spec.recompute_modules)."""

from __future__ import annotations

from autopar.spec.recompute_modules import modules_mask, recompute_label, recompute_legend


def test_legend_spells_out_each_short_name_used_once():
    labels = [
        recompute_label("selective", modules_mask(["layernorm", "mla_up_proj"])),
        recompute_label("selective", modules_mask(["layernorm", "moe_act"])),
        "none",
        "full",
    ]
    assert labels[:2] == ["sel:norm+up", "sel:norm+act"]
    assert recompute_legend(labels) == (
        "sel:A+B: selective recompute of the modules norm layernorm, up mla_up_proj, act moe_act"
    )


def test_no_legend_without_an_abbreviation():
    assert recompute_legend(["none", "full", "selective"]) is None
