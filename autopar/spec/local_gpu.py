"""`--gpu local`: this machine's profile, as `autopar probe` wrote it (autopar.trial.local_profile),
or LOCAL_DEFAULTS (autopar.spec.hardware) on a machine never probed. A profile that
$AUTOPAR_LOCAL_PROFILE names must exist: a path the user gave and mistyped is one line, never a
silent fallback to the defaults."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from autopar.errors import InputError, quoted
from autopar.spec.hardware import LOCAL_DEFAULTS, ClusterSpec, cluster_from_dict, load_cluster_file

ENV = "AUTOPAR_LOCAL_PROFILE"


def local_profile_path() -> Path:
    """Where `autopar probe` writes (and `--gpu local` reads) this machine's profile:
    $AUTOPAR_LOCAL_PROFILE, else ~/.autopar/local.yaml."""
    return Path(os.environ.get(ENV) or "~/.autopar/local.yaml").expanduser()


def local_cluster(gpus_per_node: int | None = None) -> ClusterSpec:
    """The probed profile if there is one, else LOCAL_DEFAULTS; one line when $AUTOPAR_LOCAL_PROFILE
    names a file that is not there."""
    path = local_profile_path()
    if os.environ.get(ENV) and not path.exists():
        raise InputError(
            f"{ENV} names {quoted(str(path))}, which does not exist; run `autopar probe` to write it "
            f"there, fix the path, or unset {ENV} (the unprobed defaults)"
        )
    cluster = load_cluster_file(path) if path.exists() else cluster_from_dict(LOCAL_DEFAULTS, origin="local defaults")
    return replace(cluster, gpus_per_node=gpus_per_node) if gpus_per_node else cluster
