"""Many workers, one study: two `autopar search` processes started at once on the same storage
and study name share the trial budget exactly (no trial run twice, nothing left running, any
surplus trial marked pruned with the `surplus` user attribute).

The storages are a real PostgreSQL server on loopback (started and stopped by a fixture; CI
installs Debian's `postgresql` package in `make test`) and an Optuna journal file.
"""

from __future__ import annotations

import collections
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

pytestmark = [pytest.mark.slow]

optuna.logging.set_verbosity(optuna.logging.WARNING)

N_TRIALS = 50
WORKER_TIMEOUT_S = 150


# ---- a PostgreSQL server for the test ------------------------------------------------------------


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    cands = sorted(
        glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
        key=lambda p: [int(x) if x.isdigit() else 0 for x in Path(p).parts[-3].split(".")],
    )
    return cands[-1] if cands else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres():
    """A throwaway PostgreSQL cluster on 127.0.0.1 (trust auth, fsync off). Yields `new_db(name)`,
    which creates a database and returns its URL. As root, the server runs as the `postgres`
    user. Stopped (immediate) at teardown, always."""
    bins = {n: _pg_bin(n) for n in ("initdb", "pg_ctl", "postgres")}
    missing = [n for n, p in bins.items() if p is None]
    if missing:
        pytest.fail(
            f"PostgreSQL binaries not found ({', '.join(missing)}; looked in PATH and "
            f"/usr/lib/postgresql/*/bin): make test (as root) installs Debian's `postgresql` package"
        )
    import psycopg2  # declared test dependency (psycopg2-binary)

    as_root = os.geteuid() == 0
    prefix: list[str] = []
    # a directory the postgres user can reach (pytest's tmp dirs under /tmp/pytest-of-root are 0700)
    base = Path(tempfile.mkdtemp(prefix="autopar-pg-"))
    if as_root:
        import pwd

        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(base, ignore_errors=True)
            pytest.fail(
                "running as root but there is no `postgres` user: make test (as root) installs Debian's "
                "`postgresql` package"
            )
        runuser = shutil.which("runuser") or "/usr/sbin/runuser"
        prefix = [runuser, "-u", "postgres", "--"]
        os.chown(base, pw.pw_uid, pw.pw_gid)
    os.chmod(base, 0o755)
    data, log = base / "data", base / "server.log"
    port = _free_port()
    started = False

    def run(*cmd, timeout=60):
        r = subprocess.run(prefix + [str(c) for c in cmd], capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({r.returncode}): {r.stdout}{r.stderr}{tail}")
        return r

    try:
        run(bins["initdb"], "-D", data, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")
        started = True  # from here on, always try to stop it
        run(
            bins["pg_ctl"],
            "-D",
            data,
            "-l",
            log,
            "-w",
            "-t",
            "60",
            "-o",
            f"-h 127.0.0.1 -p {port} -k {base} -F -c max_connections=100",
            "start",
            timeout=90,
        )

        def new_db(name: str) -> str:
            conn = psycopg2.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres", connect_timeout=10)
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{name}"')
            conn.close()
            return f"postgresql+psycopg2://postgres@127.0.0.1:{port}/{name}"

        yield new_db
    finally:
        if started:
            subprocess.run(
                prefix + [bins["pg_ctl"], "-D", str(data), "-m", "immediate", "-w", "-t", "30", "stop"],
                capture_output=True,
                timeout=60,
            )
        shutil.rmtree(base, ignore_errors=True)


# ---- the workers ---------------------------------------------------------------------------------


def _run_workers(sh, tmp_path: Path, storage: str, study: str, n: int = 2) -> list[tuple[int, str, str]]:
    """Start n workers at once on the same study; wait for all (bounded); return (rc, stdout, stderr)."""
    procs = []
    try:
        for i in range(n):
            out = open(tmp_path / f"worker{i}.out", "w")
            err = open(tmp_path / f"worker{i}.err", "w")
            cmd = sh.cmd(
                "search",
                "--model",
                "llama3-70b",
                "--gpus",
                "256",
                "--seq-len",
                "8192",
                "--max-exhaustive",
                "0",
                "--n-trials",
                N_TRIALS,
                "--storage",
                storage,
                "--study-name",
                study,
                "--run-dir",
                tmp_path / f"run{i}",
                "--json",
            )
            procs.append((subprocess.Popen(cmd, stdout=out, stderr=err, cwd=tmp_path, env=sh.env()), out, err))
        deadline = time.monotonic() + WORKER_TIMEOUT_S
        for p, _, _ in procs:
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"a worker did not finish within {WORKER_TIMEOUT_S} s")
    finally:
        for p, out, err in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
            out.close()
            err.close()
    return [
        (p.returncode, (tmp_path / f"worker{i}.out").read_text(), (tmp_path / f"worker{i}.err").read_text())
        for i, (p, _, _) in enumerate(procs)
    ]


def _check_study(trials: list[optuna.trial.FrozenTrial], results):
    for i, (rc, out, err) in enumerate(results):
        assert rc == 0, f"worker {i} exited {rc}: {err[-3000:]}"
    numbers = [t.number for t in trials]
    dup = [n for n, c in collections.Counter(numbers).items() if c > 1]
    assert not dup, f"trial numbers used twice: {dup}"
    assert sorted(numbers) == list(range(len(numbers)))
    states = collections.Counter(t.state.name for t in trials)
    assert states["RUNNING"] == 0, f"trials left RUNNING: {states}"
    assert states["FAIL"] == 0, f"failed trials: {states}"
    counted = [
        t
        for t in trials
        if t.state == TrialState.COMPLETE or (t.state == TrialState.PRUNED and not t.user_attrs.get("surplus"))
    ]
    assert len(counted) == N_TRIALS, f"{len(counted)} trials count towards the budget of {N_TRIALS}: {states}"
    surplus = [t for t in trials if t.user_attrs.get("surplus")]
    for t in surplus:
        assert t.state == TrialState.PRUNED, f"surplus trial {t.number} is {t.state.name}"
        assert "outer" not in t.user_attrs  # never evaluated
    assert len(surplus) <= len(results)  # at most one per worker: each stops at its first surplus trial
    for t in counted:
        assert "outer" in t.user_attrs
    assert len(trials) == len(counted) + len(surplus)
    # each worker reports the whole shared study: the same winner
    import json

    tops = [json.loads(out)["top"][0] for _, out, _ in results]
    assert all(t["plan_name"] == tops[0]["plan_name"] and t["step_time_s"] == tops[0]["step_time_s"] for t in tops)


def _pg_trials(url: str, study: str) -> list[optuna.trial.FrozenTrial]:
    storage = optuna.storages.RDBStorage(url)
    try:
        return optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=True)
    finally:
        storage.engine.dispose()


@pytest.mark.postgres
def test_two_workers_postgresql(sh, tmp_path, postgres):
    """Two workers at once on one study in a PostgreSQL database whose Optuna tables exist (as
    after any earlier run on it)."""
    url = postgres("autopar_ready")
    optuna.storages.RDBStorage(url).engine.dispose()  # create Optuna's tables
    results = _run_workers(sh, tmp_path, url, "shared-pg")
    _check_study(_pg_trials(url, "shared-pg"), results)


@pytest.mark.postgres
def test_two_workers_postgresql_fresh_database(sh, tmp_path, postgres):
    """Two workers started at once on a brand-new database (the first use of a shared storage):
    both create Optuna's tables at the same moment; the storage retries that race, so both run."""
    url = postgres("autopar_fresh")
    results = _run_workers(sh, tmp_path, url, "shared-fresh")
    assert all(rc == 0 for rc, _, _ in results), [err[-2000:] for rc, _, err in results if rc]
    _check_study(_pg_trials(url, "shared-fresh"), results)


def test_two_workers_journal_file(sh, tmp_path):
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    log = tmp_path / "study.log"
    results = _run_workers(sh, tmp_path, str(log), "shared-journal")
    assert log.is_file()
    storage = JournalStorage(JournalFileBackend(str(log)))
    trials = optuna.load_study(study_name="shared-journal", storage=storage).get_trials(deepcopy=True)
    _check_study(trials, results)
    # neither worker created a SQLite study of its own
    assert not (tmp_path / "run0" / "study.db").exists() and not (tmp_path / "run1" / "study.db").exists()

    # a third worker on the finished study runs no trial (at most it draws one surplus trial)
    (tmp_path / "late").mkdir()
    again = _run_workers(sh, tmp_path / "late", str(log), "shared-journal", n=1)
    after = optuna.load_study(study_name="shared-journal", storage=JournalStorage(JournalFileBackend(str(log))))
    after = after.get_trials(deepcopy=True)
    _check_study(after, results + again)
    assert sum(t.state == TrialState.COMPLETE for t in after) == sum(t.state == TrialState.COMPLETE for t in trials)
