"""The `autopar` command line: one file per command, each a thin call into the library.

Errors a user can fix (autopar.errors.InputError, typer/click usage errors, paths that cannot be
written) print one line on stderr and exit with code 2; never a traceback. A deadline or budget no
plan meets (autopar.errors.UnmetGoal) is an answer: one line on stdout, exit 1. Ctrl-C and SIGTERM print
one line and exit 130 and 143.
"""

from __future__ import annotations

import errno
import importlib
import os
import sys

import typer

from autopar.errors import InputError, UnmetGoal, one_line, quoted
from autopar.secrets import mask_secrets
from autopar.terminal import safe

app = typer.Typer(
    name="autopar",
    help="Find the parallel layout that fits and trains fastest; say how fast and why.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


#: every command, as `autopar --help` lists it; its code is the module autopar.cli.<name>, imported
#: only when that command runs, so `autopar --help` and a bad-input error start in a fraction of a
#: second instead of loading the whole planner
COMMANDS: dict[str, str] = {
    "search": "Which layouts fit MODEL on GPUS, which is fastest, and why.",
    "estimate": "One plan: fits?, peak memory, step time, MFU, term by term.",
    "compare": "Two or more layouts of one model on one cluster, term by term.",
    "export": "Ready-to-run launch configs of a plan, per trainer.",
    "report": "RUN_DIR/report.html: one self-contained offline page of a search.",
    "trainers": "The trainers autopar plans for: what each can run, with sources.",
    "models": "Model presets and aliases: shape and parameter counts.",
    "hardware": "GPU presets: peaks, achievable GEMM rates, links.",
    "validate": "Predict the published runs and compare with what they measured.",
    "calibrate": "Fit efficiency, overlap and memory constants to measured trials.",
    "trial": "Run one plan for real (torchrun); record times, memory, bytes.",
    "probe": "Measure this machine's GEMM, memory and collective rates.",
}


@app.callback()
def _group() -> None:
    """Keeps `autopar` a group of commands when only one command is loaded (typer would otherwise
    run that one command at the top level)."""


_loaded: set[str] = set()  # commands whose module is imported (registered for real)
_listed: set[str] = set()  # commands registered as a name and a line only, for the listing


def _register(names=None) -> None:
    """Import the modules of `names` (default: every command); each adds its command to `app`
    (none imports torch, optuna or plotly at import time). A command registered for real after its
    listing entry replaces it: typer keeps the last command of a name."""
    for name in COMMANDS if names is None else names:
        if name not in _loaded:
            importlib.import_module(f"autopar.cli.{name}")
            _loaded.add(name)
    for info in app.registered_commands:
        name = info.name or getattr(info.callback, "__name__", "")
        if name in COMMANDS and info.short_help is None:
            info.short_help = COMMANDS[name]


def _not_loaded() -> None:
    raise RuntimeError("a listing entry ran instead of its command")  # main() loads a command it runs


def _register_listing() -> None:
    """Every command not loaded as a name and its line: enough for `autopar --help`, `autopar` alone
    and an unknown command's message, without importing the commands."""
    for name, line in COMMANDS.items():
        if name not in _loaded and name not in _listed:
            app.command(name=name, short_help=line, add_help_option=False)(_not_loaded)
            _listed.add(name)


def _command_of(argv: list[str]) -> str | None:
    """The command ARGV runs (its first word; `autopar` takes no option but --help), or None."""
    return argv[0] if argv and argv[0] in COMMANDS else None


#: OS errors of the user's paths, permissions and disk: bad input (one line, exit 2), not a crash
_USER_ERRNOS = frozenset(
    {
        errno.EACCES,
        errno.EPERM,
        errno.ENOENT,
        errno.ENOTDIR,
        errno.EISDIR,
        errno.EEXIST,
        errno.EROFS,
        errno.ENOSPC,
        errno.ENAMETOOLONG,
        errno.EDQUOT,
        errno.ELOOP,
        errno.ETXTBSY,
    }
)


def _fail(message: str, code: int = 2) -> None:
    """One line `autopar: error: ...` on stderr (no password, no control character), then exit."""
    print(f"autopar: error: {one_line(mask_secrets(message))}", file=sys.stderr)
    sys.exit(code)


def _os_error(e: OSError) -> str:
    """An OS error of a path as one sentence naming the path and the fix."""
    where = f" {quoted(str(e.filename), 120)}" if e.filename is not None else ""
    return f"cannot use{where}: {e.strerror or type(e).__name__}; check the path, its folder and their permissions"


def _given_value(argv: list[str], param) -> str | None:
    """The value the command line gave the option a usage error is about (its last occurrence),
    or None (an argument, a flag, or not found): click's messages do not always quote it."""
    opts = [
        o
        for o in (getattr(param, "opts", None) or []) + (getattr(param, "secondary_opts", None) or [])
        if o.startswith("-")
    ]
    value = None
    for i, tok in enumerate(argv):
        for o in opts:
            if tok == o and i + 1 < len(argv):
                value = str(argv[i + 1])
            elif str(tok).startswith(o + "=") and o.startswith("--"):
                value = str(tok)[len(o) + 1 :]
    return value


def _value_options(name: str) -> set[str]:
    """The option names of command `name` that take a value (not flags); empty for no such command."""
    import typer.main

    cmd = getattr(typer.main.get_command(app), "commands", {}).get(name)
    return {
        o
        for p in getattr(cmd, "params", [])
        if getattr(p, "param_type_name", "") == "option" and not getattr(p, "is_flag", False)
        for o in p.opts
    }


def _check_empty(argv: list[str]) -> None:
    """One line for an empty (or blank) value or argument: `--run-dir ''` would otherwise mean the
    current directory, `--gpu 'h100-sxm,'`-style lists are checked where they are parsed."""
    if not argv:
        return
    takes = _value_options(argv[0])
    for i, tok in enumerate(argv):
        tok = str(tok)
        opt, eq, val = tok.partition("=")
        if tok.startswith("--") and eq and opt in takes and not val.strip():
            raise InputError(f"{opt} {quoted(val)} is empty; give a value or leave the option out")
        if tok.strip():
            continue
        prev = str(argv[i - 1]) if i else ""
        if prev in takes:
            raise InputError(f"{prev} {quoted(tok)} is empty; give a value or leave the option out")
        raise InputError(f"an empty argument {quoted(tok)} follows {quoted(prev)}; remove it or give a value")


def _safe_streams() -> None:
    """Output that cannot fail and cannot drive the terminal: characters the terminal's encoding
    lacks are escaped (a model name in Cyrillic under LANG=C or PYTHONIOENCODING=ascii), control
    characters and escape sequences are shown escaped (autopar.terminal), and a closed stdout or
    stderr (`>&-`) writes nowhere instead of crashing."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None:
            setattr(sys, name, open(os.devnull, "w"))  # noqa: SIM115 - for the life of the process
        else:
            if hasattr(stream, "reconfigure"):
                try:
                    stream.reconfigure(errors="backslashreplace")
                except (ValueError, OSError, TypeError):
                    pass
            setattr(sys, name, safe(stream))  # no escape sequence of a name reaches the terminal


def _freeze_heap() -> None:
    """For the process's own command line only (not a caller's `main(argv)`, e.g. the tests): the
    objects of the modules imported so far live until the process ends, so the garbage collector
    stops walking them (gc.freeze, Python's docs: for a program's long-lived start-up state), and
    again at exit, where the interpreter's final collections would walk every object the search
    built (pandas frames, the cost model's arrays) just before the process frees them anyway: about
    0.45 s of the main job's CPU time on the 2-core reference machine (docs/benchmarks.md)."""
    import atexit
    import gc

    gc.freeze()
    atexit.register(gc.freeze)


def main(argv: list[str] | None = None) -> None:
    """Run the command line; input errors print one line and exit 2, Ctrl-C / SIGTERM exit 130 / 143
    with one line (autopar.measured.hygiene)."""
    _safe_streams()
    args = sys.argv[1:] if argv is None else [str(a) for a in argv]
    command = _command_of(args)
    if command is None:
        _register_listing()
    else:
        _register([command])
    if argv is None:
        _freeze_heap()
    from autopar.measured.hygiene import install_signal_handlers

    install_signal_handlers()
    try:
        _check_empty(args)
        app(args=argv, standalone_mode=False)
    except InputError as e:
        _fail(str(e))  # no storage password, whoever wrote it
    except UnmetGoal as e:  # an answer: no plan meets the deadline or budget, and what the best needs
        print(f"autopar: {one_line(mask_secrets(str(e)))}")
        sys.exit(1)
    except typer.TyperException as e:  # click's usage errors, as typer raises them (its public base)
        ctx = getattr(e, "ctx", None)
        if type(e).__name__ == "NoArgsIsHelpError":  # `autopar search` alone: its help, exit 0
            print(ctx.get_help() if ctx else "", file=sys.stdout)
            sys.exit(0)
        cmd = ctx.command_path if ctx else "autopar"
        msg = (e.format_message() if hasattr(e, "format_message") else str(e)).strip().rstrip(".")
        value = _given_value(sys.argv[1:] if argv is None else argv, getattr(e, "param", None))
        _fail(f"{msg}{'' if value is None else f' (got {quoted(value)})'}; see `{cmd} --help`")
    except (typer.Abort, KeyboardInterrupt):
        print("autopar: interrupted", file=sys.stderr)
        sys.exit(130)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except BrokenPipeError:
        sys.exit(0)
    except OSError as e:
        if e.errno not in _USER_ERRNOS or os.environ.get("AUTOPAR_DEBUG"):
            raise
        _fail(_os_error(e))
    except (MemoryError, RecursionError) as e:
        if os.environ.get("AUTOPAR_DEBUG"):
            raise
        _fail(f"the input is too large to process ({type(e).__name__}); make it smaller")  # bad input: exit 2
