"""Optuna's log level is autopar's only while autopar works with a study: importing the driver
leaves it alone, creating a study and running trials keep Optuna's INFO lines out, and the level
the caller had comes back afterwards."""

from __future__ import annotations

import subprocess
import sys

import optuna

from autopar.search import optuna_driver as od


def test_importing_the_driver_leaves_the_log_level_alone() -> None:
    code = (
        "import optuna\noptuna.logging.set_verbosity(optuna.logging.DEBUG)\n"
        "import autopar.search.optuna_driver, autopar.measured.trials\n"
        "assert optuna.logging.get_verbosity() == optuna.logging.DEBUG, optuna.logging.get_verbosity()\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


def test_a_study_is_quiet_and_the_level_comes_back(tmp_path, capfd) -> None:
    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.INFO)
    try:
        capfd.readouterr()
        study = od.load_or_create_study(
            f"sqlite:///{tmp_path / 'study.db'}", "quiet", optuna.samplers.RandomSampler(seed=0), ["minimize"]
        )
        assert optuna.logging.get_verbosity() == optuna.logging.INFO
        with od.quiet_optuna():
            assert optuna.logging.get_verbosity() == optuna.logging.WARNING
            study.tell(study.ask(), 1.0)
        assert optuna.logging.get_verbosity() == optuna.logging.INFO
        assert "A new study created" not in capfd.readouterr().err
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        with od.quiet_optuna():  # never louder than the caller asked
            assert optuna.logging.get_verbosity() == optuna.logging.ERROR
    finally:
        optuna.logging.set_verbosity(before)
