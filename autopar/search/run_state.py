"""A run directory's life during `autopar search`: checked (or refused in one line) before the
search, marked incomplete while its files are being replaced, marked complete when search.json has
been written last; on a failure or an interrupt nothing half-made is left looking complete.

The marker is run_dir.INCOMPLETE. A directory this search created and left without results is
removed again (a storage that cannot be opened leaves nothing behind); a directory holding the
search of another question is refused before anything is written into it.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from autopar.atomic import temp_files
from autopar.errors import InputError, quoted
from autopar.search.run_dir import INCOMPLETE, RUN_FILE_BYTES, write_marker
from autopar.spec.read_file import read_json
from autopar.spec.schema import path_kind

#: a temporary file of a dead process is removed once it is this old (another host's worker may
#: still be writing a younger one into a shared run directory)
STALE_TMP_S = 600.0


def question_summary(q) -> dict:
    """What makes two searches the same question, as search.json records it."""
    return {
        "model": q.model.name,
        "num_gpus": q.num_gpus,
        "gpu": q.cluster.gpu.key,
        "seq_len": q.seq_len,
        "global_batch_size": q.global_batch_size,
    }


def summary_text(s: dict) -> str:
    """'llama3-70b on 256 x h100-sxm, seq 8192, gbs 512'."""
    return (
        f"{s.get('model')} on {s.get('num_gpus')} x {s.get('gpu')}, seq {s.get('seq_len')}, "
        f"gbs {s.get('global_batch_size')}"
    )


def recorded_summary(run_dir: Path) -> dict | None:
    """The question summary of the search.json a run directory holds (None: none, or unreadable)."""
    try:
        qd = read_json(run_dir / "search.json", "search.json", RUN_FILE_BYTES)["question"]
        return {
            "model": qd["model"]["name"],
            "num_gpus": qd["num_gpus"],
            "gpu": qd["cluster"]["gpu"],
            "seq_len": qd["seq_len"],
            "global_batch_size": qd["global_batch_size"],
        }
    except (ValueError, KeyError, TypeError):  # InputError: not there, special or unreadable
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _remove_stale_tmp(run_dir: Path) -> None:
    """Remove `.NAME.PID.tmp` files (autopar.atomic) of processes that died while writing."""
    now = time.time()
    for p, pid in temp_files(run_dir):
        try:
            if pid is not None and pid != os.getpid() and not _alive(pid) and now - p.stat().st_mtime > STALE_TMP_S:
                p.unlink()
        except OSError:
            pass


@dataclass
class RunState:
    """One search's hold on its run directory (see the module docstring)."""

    run_dir: Path
    created: list[Path] = field(default_factory=list)  # directories this search made, deepest first
    replacing: bool = False  # the first result file has been replaced: the marker must stay until done
    was_incomplete: bool = False

    def prepare(self, q) -> "RunState":
        """Check the directory (a folder, writable, not another question's), create it if need be,
        and mark it incomplete. One line when it cannot be used."""
        d = self.run_dir
        kind = path_kind(d)
        if kind not in (None, "dir"):
            raise InputError(
                f"run directory {quoted(str(d))} exists and is not a directory; give another --run-dir, or remove it"
            )
        if kind == "dir":
            self._check_question(q)
        p = d
        while path_kind(p) is None and p != p.parent:
            self.created.append(p)
            p = p.parent
        self.was_incomplete = kind == "dir" and (d / INCOMPLETE).exists()
        try:
            d.mkdir(parents=True, exist_ok=True)
            write_marker(
                d,
                {
                    "question": summary_text(question_summary(q)),
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "started": time.time(),
                },
            )
        except OSError as e:
            self._remove_created()
            raise InputError(
                f"cannot write the run directory {quoted(str(d))}: {e.strerror or type(e).__name__}; "
                f"give another --run-dir, or fix its permissions"
            ) from None
        _remove_stale_tmp(d)
        return self

    def _check_question(self, q) -> None:
        """Refuse a directory whose search.json is another question's while it also holds an Optuna
        study or trials of it (reusing them would mix two questions)."""
        have = recorded_summary(self.run_dir)
        if have is None or have == question_summary(q):
            return
        if any((self.run_dir / x).exists() for x in ("study.db", "trials")):
            raise InputError(
                f"run directory {quoted(str(self.run_dir))} holds the search of another question "
                f"({summary_text(have)}) with its study or trials; give another --run-dir, or "
                f"delete that directory"
            )

    def replace_files(self) -> None:
        """Called before the first result file is replaced: from here on only `finish` unmarks it."""
        self.replacing = True

    def finish(self) -> None:
        """search.json is written: the directory is complete."""
        (self.run_dir / INCOMPLETE).unlink(missing_ok=True)

    def abandon(self) -> None:
        """After a failure or an interrupt: remove this process's temporary files; if no result file
        was replaced, restore the directory as it was (unmarked, or gone when this search made it
        and left nothing in it); else leave it marked incomplete for a rerun to finish."""
        d = self.run_dir
        for p, _ in temp_files(d, own=True):
            p.unlink(missing_ok=True)
        if self.replacing or self.was_incomplete or self._holds_unfinished():
            return
        (d / INCOMPLETE).unlink(missing_ok=True)
        self._remove_created()

    def _holds_unfinished(self) -> bool:
        """Whether the directory holds no finished search but what a rerun resumes (an Optuna
        study.db or trials this search began): it stays marked incomplete."""
        d = self.run_dir
        return not (d / "search.json").exists() and any((d / x).exists() for x in ("study.db", "trials"))

    def _remove_created(self) -> None:
        """Remove the directories this search made, where they are empty."""
        for p in self.created:
            try:
                p.rmdir()
            except OSError:
                break
