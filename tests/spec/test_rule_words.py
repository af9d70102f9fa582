"""Reject reasons read as words: a rule named by a formula ("microbatches%pp") has its words, and a
trainer's capability line names the trainer (autopar.spec.rules.rule_words)."""

from __future__ import annotations

import re

from autopar.report.answer_text import rejection_text
from autopar.spec.rules import RULES, rule_words


def test_every_formula_named_rule_has_words() -> None:
    formulas = [r for r in RULES if re.search(r"[%*|()]", r.name)]
    assert {r.name for r in formulas} >= {"microbatches%pp", "ep*etp|tp*cp*dp", "gbs%(mbs*dp)"}
    for r in formulas:
        assert r.words and not re.search(r"[%|]", r.words), r.name


def test_labels_as_words() -> None:
    assert rule_words("microbatches%pp") == "microbatches not a multiple of pp (interleaved 1F1B)"
    assert rule_words("ep*etp|tp*cp*dp") == "ep x etp does not divide tp x cp x dp"
    assert rule_words("deepspeed:pp_schedules") == "DeepSpeed: pp schedules"
    assert rule_words("memory") == "memory"


def test_the_rejection_line_counts_in_words() -> None:
    got = rejection_text({"memory": 1406, "microbatches%pp": 66})
    assert got == "memory (1,406), microbatches not a multiple of pp (interleaved 1F1B) (66)"
