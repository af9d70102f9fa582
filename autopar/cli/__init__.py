"""The `autopar` command line: one file per command, each a thin call into the library.

Errors a user can fix (autopar.errors.InputError, and typer/click usage errors) print one line on
stderr and exit with code 2; never a traceback.
"""

from __future__ import annotations

import sys

import typer

try:  # typer >= 0.20 vendors click
    from typer._click import exceptions as click_exc
except ImportError:  # pragma: no cover - older typer with click installed
    from click import exceptions as click_exc

from autopar.errors import InputError
from autopar.secrets import mask_url

app = typer.Typer(
    name="autopar",
    help="Find the parallel layout that fits and trains fastest; say how fast and why.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _register() -> None:
    # each module adds its command to `app`; none imports torch, optuna or plotly at import time
    from autopar.cli import (calibrate, compare, estimate, export, hardware, models, probe, report,  # noqa: F401
                             search, trainers, trial, validate)


def main(argv: list[str] | None = None) -> None:
    _register()
    try:
        app(args=argv, standalone_mode=False)
    except InputError as e:
        print(f"autopar: error: {mask_url(str(e))}", file=sys.stderr)  # no storage password, whoever wrote it
        sys.exit(2)
    except click_exc.NoArgsIsHelpError as e:
        print(e.ctx.get_help() if e.ctx else "", file=sys.stdout)
        sys.exit(0)
    except click_exc.ClickException as e:
        cmd = e.ctx.command_path if e.ctx else "autopar"
        msg = e.format_message().strip().rstrip(".").replace("\n", " ")
        print(f"autopar: error: {mask_url(msg)}; see `{cmd} --help`", file=sys.stderr)
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        print("autopar: aborted", file=sys.stderr)
        sys.exit(130)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except BrokenPipeError:
        sys.exit(0)
