"""docs/trainers.md ends with the capability table as `autopar trainers --markdown` prints it: every
line of every trainer, with what to use instead and the trainer check it mirrors."""

from __future__ import annotations

from pathlib import Path

from autopar.spec.trainers import ALL_TRAINERS, get_trainer

DOC = Path(__file__).resolve().parents[2] / "docs" / "trainers.md"


def test_the_doc_is_the_commands_output(cli_run):
    r = cli_run("trainers", "--markdown")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("## ") and DOC.read_text().endswith("\n\n" + r.stdout), (
        "regenerate the last section of docs/trainers.md: autopar trainers --markdown"
    )


def test_every_line_of_every_trainer_is_listed_with_its_source():
    text = DOC.read_text()
    for key in ALL_TRAINERS:
        t = get_trainer(key)
        section = text.split(f"(`--trainer {key}`)", 1)[1].split("\n### ", 1)[0]
        rows = {line.split(" | ")[0].removeprefix("| "): line for line in section.splitlines() if line.startswith("| ")}
        for c in [*t.capabilities.values(), *([t.recipes] if t.recipes is not None else [])]:
            assert c.kind in rows, (key, c.kind)
            source = " ".join(c.source.split()).replace("|", "\\|")
            assert rows[c.kind].endswith(f"| {source} |"), (key, c.kind)
