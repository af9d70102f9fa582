"""No control character or escape sequence from a user's input reaches the terminal: a model name in
a runs CSV or a model file, a run directory's name; through `validate`, `estimate`, `search`,
`compare`, `report` and `export` (property tests over every C0 and C1 control character, DEL, the
Unicode reordering characters and the sequences that retitle, clear, hide or link)."""

from __future__ import annotations

import csv
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autopar.calibration.run_rows import bundled_runs
from autopar.terminal import SGR, printable

CONTROLS = [chr(c) for c in range(0x20) if chr(c) not in "\n\t"] + [chr(0x7F)] + [chr(c) for c in range(0x80, 0xA0)]
REORDERING = ["\u202e", "\u202a", "\u2066", "\u2069", "\u200b", "\u200f", "\ufeff"]
SEQUENCES = [
    "\x1b]0;PWNED\x07",  # retitle the window
    "\x1b[2J\x1b[H",  # clear the screen
    "\x1b[8m",  # conceal what follows
    "\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\",  # a forged hyperlink
    "\x9b31m",  # CSI as one C1 character
    "\x1bP+q\x1b\\",  # DCS
]
HOSTILE = st.sampled_from(CONTROLS + REORDERING + SEQUENCES)
NAME_CHARS = string.ascii_letters + string.digits


def _driving(text: str) -> list[str]:
    """The characters of `text` that could drive a terminal (none may be left)."""
    bad = set(CONTROLS) | set(REORDERING)
    return sorted({c for c in text if c in bad})


def assert_clean(r) -> None:
    left = _driving(r.stdout + r.stderr)
    assert not left, f"raw control characters reached the terminal: {[hex(ord(c)) for c in left]}"


def test_printable_escapes_every_one():
    for evil in CONTROLS + REORDERING + SEQUENCES:
        shown = printable(f"a{evil}b\nc\td")
        assert not _driving(shown.replace("\n", "").replace("\t", "")), repr(evil)
        assert shown.startswith("a") and shown.endswith("b\nc\td")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(evil=HOSTILE, prefix=st.text(NAME_CHARS, min_size=1, max_size=8))
def test_validate_runs_with_hostile_names(cli_run, tmp_path_factory, evil, prefix):
    rows = [dict(r) for r in bundled_runs() if r["row_id"] in ("1", "2")]
    rows[0]["model"] = f"{prefix}{evil}model"
    rows[1]["model"] = f"{prefix}{evil}bad"
    rows[1]["num_layers"] = "many"  # skipped: its name printed in the rows not evaluated
    path = tmp_path_factory.mktemp("runs") / "runs.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    r = cli_run("validate", "--runs", path)
    assert r.returncode == 0, r.stderr
    assert_clean(r)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(evil=HOSTILE)
def test_estimate_and_compare_with_a_hostile_model_name(cli_run, tmp_path_factory, evil):
    path = tmp_path_factory.mktemp("model") / "m.yaml"
    path.write_text(
        "name: " + repr(f"tiny{evil}model").replace("'", '"') + "\n"
        "num_layers: 4\nhidden_size: 256\nffn_hidden_size: 1024\nnum_attention_heads: 4\n"
        "vocab_size: 1000\nseq_len: 512\n"
    )
    for args in (
        ("estimate", "--model", path, "--gpus", "8"),
        ("compare", "--model", path, "--gpus", "8", "--tp 2", "--tp 4"),
    ):
        r = cli_run(*args)
        assert_clean(r)


@pytest.mark.slow
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(evil=st.sampled_from(SEQUENCES + ["\x07", "\x9b", "\u202e"]))
def test_search_report_and_export_with_a_hostile_run_directory(cli_run, tmp_path_factory, evil):
    run_dir = tmp_path_factory.mktemp("runs") / f"run{evil}dir"
    r = cli_run("search", "--model", "llama3-8b", "--gpus", "8", "--top-k", "2", "--run-dir", run_dir)
    assert r.returncode == 0, r.stderr
    assert_clean(r)
    for args in (
        ("report", run_dir),
        ("export", "--run", run_dir, "--rank", "1", "--to", "torchtitan", "--out", run_dir / "export"),
    ):
        assert_clean(cli_run(*args))


def test_the_progress_bar_reaches_a_terminal_as_rich_draws_it():
    """On a terminal the rich consoles write beneath the SafeStream: they clean their own text, and a
    progress bar's cursor controls (erase line, cursor up) must pass as they are; a name's escape
    sequence inside a cell is still shown escaped."""
    import io

    from rich.control import Control

    from autopar.cli.render import SafeConsole
    from autopar.terminal import SafeStream

    class Tty(io.StringIO):
        def isatty(self):
            return True

    raw = Tty()
    wrapped = SafeStream(raw)
    con = SafeConsole(file=wrapped, force_terminal=True, width=80)
    assert con.file is raw
    con.control(Control.move_to_column(0), Control.show_cursor(False))
    con.print("name\x1b]0;PWNED\x07")
    out = raw.getvalue()
    assert "\x1b[?25l" in out  # the cursor control, as rich wrote it
    assert "\\x1b" in out and "\x1b]" not in out and "\x07" not in out  # the name's sequence, escaped
    # text written to the wrapped stream itself keeps only colour and weight on a terminal
    wrapped.write("\x1b[1mbold\x1b[0m \x1b[2J\x1b]8;;x\x07")
    assert raw.getvalue().endswith("\x1b[1mbold\x1b[0m \\x1b[2J\\x1b]8;;x\\x07")


def test_printable_escapes_exactly_the_control_format_and_separator_characters():
    """Over every code point: escaped iff its Unicode category is Cc, Cf, Zl or Zp (newline and tab
    kept), so the escaping set cannot drift from the Unicode database."""
    import unicodedata

    for c in map(chr, range(0x110000)):
        if 0xD800 <= ord(c) <= 0xDFFF:
            continue  # surrogates are not characters of a str written out
        unsafe = unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") and c not in "\n\t"
        assert (printable(c) != c) == unsafe, hex(ord(c))


@pytest.mark.parametrize(
    "name", ["m[link=https://evil.example]click[/link]", "m[conceal]hidden[/conceal]", "m[blink]x[/blink]"]
)
def test_rich_markup_in_a_name_is_text_on_a_terminal(name):
    """A name's rich markup is shown as typed: on a terminal the console would otherwise write the
    hyperlink (OSC 8) or the concealed / blinking style itself, after the text was cleaned."""
    import io

    from autopar.cli.render import SafeConsole

    out = io.StringIO()
    c = SafeConsole(file=out, force_terminal=True, color_system="truecolor", width=200)
    c.print(f"model {name} end")
    written = out.getvalue()
    assert "\x1b]8" not in written and "\x1b[8m" not in written and "\x1b[5m" not in written
    assert name in SGR.sub("", written)


def test_a_control_rich_would_drop_is_shown_escaped():
    # rich drops BEL, backspace and carriage return from the text it is given: a run directory
    # holding one would be shown without it, a path that does not exist
    import io

    from autopar.cli.render import SafeConsole

    out = io.StringIO()
    SafeConsole(file=out, width=200).print("Results: run\x1b]0;x\x07/ (plans.parquet)")
    assert out.getvalue() == "Results: run\\x1b]0;x\\x07/ (plans.parquet)\n"
