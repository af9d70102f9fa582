"""Storage passwords never leave autopar: `--storage` URLs with a password are shown and written as
`user:***@host` in every error line, output stream, and file of the run directory (search.json,
measured.json, trial documents, report.html), for the Optuna search and the measured stage.

The CLI runs in-process (seconds, not a subprocess per case); a working password-bearing storage is
a postgresql:// URL that the test maps to an SQLite file (SQLite URLs take no user part), and the
measured stage's trials are stubbed (a launch that crashes at once: a failure is data)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from autopar.cli import main
from autopar.secrets import mask_secrets, mask_values
from autopar.spec.hardware import LOCAL_DEFAULTS

PW = "S3cr3tPW"


@pytest.mark.parametrize(
    "text, masked",
    [
        (f"postgresql://u:{PW}@host:1/db", "postgresql://u:***@host:1/db"),
        (f"mysql://u:{PW}@h/db", "mysql://u:***@h/db"),
        (f"postgresql+psycopg2://u:{PW}@h/db", "postgresql+psycopg2://u:***@h/db"),
        (
            f"cannot open storage 'mysql+pymysql://root:{PW}@h:3306/x': refused",
            "cannot open storage 'mysql+pymysql://root:***@h:3306/x': refused",
        ),
        (f"postgresql://u:p@{PW}@h/db", "postgresql://u:***@h/db"),  # an unescaped @ in the password
        (f"postgresql://:{PW}@h/db", "postgresql://:***@h/db"),
        (f"mysql://h/db?user=u&password={PW}&charset=utf8", "mysql://h/db?user=u&password=***&charset=utf8"),
        ("sqlite:////tmp/study.db", "sqlite:////tmp/study.db"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        # one rule for any word, URL or not: user:password@ hides the password
        ("no url here: a:b@c", "no url here: a:***@c"),
        ("an address a@b.example is no password", "an address a@b.example is no password"),
        # issue 24: a query parameter named for a secret, a mistyped scheme, no scheme
        (f"postgresql://u@127.0.0.1:1/db?sslpassword={PW}", "postgresql://u@127.0.0.1:1/db?sslpassword=***"),
        (f"sqlite:///pw.db?sslpassword={PW}", "sqlite:///pw.db?sslpassword=***"),
        (f"x://h/db?api_key={PW}&Token={PW};client_secret={PW}", "x://h/db?api_key=***&Token=***;client_secret=***"),
        (f"postgresql:/u:{PW}@host/db", "postgresql:/u:***@host/db"),
        (f"postgres:u:{PW}@host/db", "postgres:u:***@host/db"),
        (f"'u:{PW}@host/db'", "'u:***@host/db'"),
        (f"postgresql://u:a?key={PW}@h/db", "postgresql://u:***@h/db"),  # the userinfo is masked first
    ],
)
def test_mask_secrets(text: str, masked: str) -> None:
    """Every URL form hides its password, in a string and inside JSON-like values."""
    assert mask_secrets(text) == masked
    assert PW not in mask_secrets(text)
    assert mask_values({"a": [text, 1, None], "b": text}) == {"a": [masked, 1, None], "b": masked}


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    """`autopar ARGV` in-process: (exit code, stdout, stderr)."""
    try:
        main(argv)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def _leaks(run_dir: Path, *streams: str) -> list[str]:
    """Where the password shows: an output stream, or any file under the run directory (bytes)."""
    where = [f"stream {i}" for i, s in enumerate(streams) if PW in s]
    if run_dir.exists():
        where += [str(p) for p in run_dir.rglob("*") if p.is_file() and PW.encode() in p.read_bytes()]
    return where


SEARCH = ["search", "--model", "tiny", "--gpus", "4", "--gpu", "local"]
UNREACHABLE = [
    f"postgresql://u:{PW}@127.0.0.1:1/db",
    f"mysql://u:{PW}@127.0.0.1:1/db",
    f"postgresql+psycopg2://u:{PW}@127.0.0.1:1/db",
]


@pytest.fixture(autouse=True)
def _local_profile(tmp_path, monkeypatch):
    """A private local profile (the unprobed defaults); the measured stage leaves the test process's
    signal handlers alone."""
    (tmp_path / "local.yaml").write_text(yaml.safe_dump(LOCAL_DEFAULTS))
    monkeypatch.setenv("AUTOPAR_LOCAL_PROFILE", str(tmp_path / "local.yaml"))
    monkeypatch.setattr("autopar.measured.hygiene.install_signal_handlers", lambda: None)


@pytest.mark.parametrize("url", UNREACHABLE, ids=["postgresql", "mysql", "postgresql+psycopg2"])
@pytest.mark.parametrize("stage", ["optuna", "measured"])
def test_unreachable_storage_is_one_masked_line(url: str, stage: str, tmp_path, capsys) -> None:
    """The Optuna search (--max-exhaustive 0) and the measured stage (--trials) open the storage:
    both refuse it in one line that names the user, not the password."""
    run = tmp_path / "run"
    extra = ["--max-exhaustive", "0", "--n-trials", "3"] if stage == "optuna" else ["--trials", "1"]
    code, out, err = _run([*SEARCH, "--storage", url, "--run-dir", str(run), *extra], capsys)
    assert code == 2, (out, err)
    assert err.startswith("autopar: error: cannot open storage") and err.count("\n") == 1, err
    assert "u:***@127.0.0.1:1" in err
    assert not _leaks(run, out, err)


def test_unused_storage_is_written_masked(tmp_path, capsys) -> None:
    """An exhaustive search never opens --storage, but search.json records it: masked."""
    run = tmp_path / "run"
    code, out, err = _run([*SEARCH, "--storage", UNREACHABLE[0], "--run-dir", str(run), "--json"], capsys)
    assert code == 0, err
    opts = json.loads((run / "search.json").read_text())["options"]
    assert opts["storage"] == "postgresql://u:***@127.0.0.1:1/db"
    assert not _leaks(run, out, err)


def test_working_storage_never_leaks(tmp_path, capsys, monkeypatch) -> None:
    """A storage that opens (mapped to SQLite) through the Optuna search, the measured stage and the
    report: the password is in no stream and no file of the run directory."""
    import optuna

    from autopar.measured.launcher import LaunchResult
    from autopar.search import optuna_driver as od

    opened: list[str] = []

    def sqlite_instead(url: str, attempts: int = 5):
        """Any storage URL opens one SQLite file (recording the URL asked for)."""
        opened.append(url)
        return optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'shared.db'}")

    def crash(trials, nproc, **kw):
        """A trial launch that fails at once."""
        return LaunchResult(
            outcome="crash", returncode=1, wall_s=0.0, result=None, command=["stub"], reasons=["stubbed launch"]
        )

    monkeypatch.setattr(od, "_rdb_storage", sqlite_instead)
    monkeypatch.setattr("autopar.measured.measure.launch", crash)
    run = tmp_path / "run"
    url = f"postgresql://u:{PW}@db.example:5432/autopar"
    # two ranks (every plan runs here as it is), a seeded sampler: the measured stage has a plan to try
    code, out, err = _run(
        [
            "search",
            "--model",
            "tiny",
            "--gpus",
            "2",
            "--gpu",
            "local",
            "--seed",
            "1",
            "--storage",
            url,
            "--run-dir",
            str(run),
            "--max-exhaustive",
            "0",
            "--n-trials",
            "4",
            "--trials",
            "1",
        ],
        capsys,
    )
    assert opened and all(u == url for u in opened)  # both stages opened the real URL
    assert code == 0, err
    assert (run / "measured.json").is_file() and list((run / "trials").glob("*.json"))
    assert (run / "report.html").is_file()
    assert (
        json.loads((run / "search.json").read_text())["options"]["storage"]
        == "postgresql://u:***@db.example:5432/autopar"
    )
    assert not _leaks(run, out, err), _leaks(run, out, err)


#: what a password or a user name may hold, percent-encoded in a URL (the reserved and the rest)
SECRET_CHARS = st.characters(blacklist_categories=("Cs",), min_codepoint=0x21, max_codepoint=0x2FF)


@settings(max_examples=200, deadline=None)
@given(user=st.text(SECRET_CHARS, min_size=1, max_size=12), password=st.text(SECRET_CHARS, min_size=4, max_size=16))
def test_percent_encoded_userinfo_never_shows_the_password(user, password):
    """Whatever the user name and the password hold, percent-encoded as a URL carries them
    (urllib.parse.quote, safe=''), neither the password nor its decoded form is left in the masked
    text, and the host still shows; a user name's encoded colon does not hide the password."""
    from urllib.parse import quote

    assume(
        password not in user
        and quote(password, safe="") not in quote(user, safe="")
        and password not in "postgresql://db.example:5432/autopar cannot open storage refused"
    )
    assume_secret = quote(password, safe="")
    for userinfo in (f"{quote(user, safe='')}:{assume_secret}", f"{quote(user + ':' + password, safe='')}"):
        url = f"postgresql://{userinfo}@db.example:5432/autopar"
        shown = mask_secrets(f"cannot open storage '{url}': refused")
        assert assume_secret not in shown and (len(password) < 4 or password not in shown), shown
        assert "@db.example:5432/autopar" in shown


def test_an_encoded_colon_in_the_user_name_is_masked_whole(tmp_path, capsys) -> None:
    """postgresql://u%3Asecret@host: the user name decodes to 'u:secret', so the whole userinfo is
    masked, in the error line and in the run directory."""
    url = f"postgresql://u%3A{PW}@127.0.0.1:1/db"
    run = tmp_path / "run"
    code, out, err = _run([*SEARCH, "--storage", url, "--run-dir", str(run), "--max-exhaustive", "0"], capsys)
    assert code == 2 and "postgresql://***@127.0.0.1:1/db" in err, err
    assert not _leaks(run, out, err)
