"""Stand-ins for the SLURM client commands, for tests: `sbatch`, `squeue`, `sacct`, `scancel`, and
inside a job `srun` and `scontrol`, scripts written into a directory that goes first on PATH.
`sbatch` runs the job script here, in the background and in a session of its own (as a cluster
would: the job does not die with the submitting process), and every command keeps the job's state in files under STATE:

    STATE/next-id          the next job id
    STATE/calls.log        one line per command: "<command> <args>"
    STATE/<id>/pid         the job's process (and process group) id
    STATE/<id>/rc          its exit code, once it ended
    STATE/<id>/cancelled   scancel was called

squeue lists a job while its process lives (RUNNING) and no rc exists; sacct says COMPLETED /
FAILED (from rc), CANCELLED, RUNNING or nothing. scancel sends SIGTERM to the job's process group,
then SIGKILL after a second.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

COMMON = """#!{python}
import fcntl, os, signal, subprocess, sys, time
from pathlib import Path
STATE = Path({state!r})
STATE.mkdir(parents=True, exist_ok=True)
with open(STATE / "calls.log", "a") as f:
    f.write(" ".join([Path(sys.argv[0]).name] + sys.argv[1:]) + "\\n")

def alive(pid):
    try:
        st = Path(f"/proc/{{pid}}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return st not in ("Z", "X")

def job_pid(job):
    try:
        return int((STATE / job / "pid").read_text())
    except (OSError, ValueError):
        return None

def ended(job):
    return (STATE / job / "rc").exists() or (STATE / job / "cancelled").exists() or not alive(job_pid(job) or 0)
"""

SBATCH = (
    COMMON
    + """
args = sys.argv[1:]
script = args[-1]
opts = dict(a[2:].split("=", 1) for a in args[:-1] if a.startswith("--") and "=" in a)
with open(STATE / "next-id", "a+") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    f.seek(0)
    job = str(int(f.read().strip() or "1000"))
    f.seek(0); f.truncate(); f.write(str(int(job) + 1))
d = STATE / job
d.mkdir()
out = opts.get("output", f"slurm-{{job}}.out").replace("%j", job)
env = dict(os.environ, SLURM_JOB_ID=job, SLURM_JOB_NODELIST="localhost", SLURM_JOB_NAME=opts.get("job-name", ""))
runner = f"bash {{script!r}} > {{out!r}} 2>&1; echo $? > {{str(d / 'rc')!r}}"
p = subprocess.Popen(["bash", "-c", runner], cwd=opts.get("chdir") or None, env=env, start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
(d / "pid").write_text(str(p.pid))
print(job if "--parsable" in args else f"Submitted batch job {{job}}")
"""
)

SQUEUE = (
    COMMON
    + """
args = sys.argv[1:]
job = args[args.index("-j") + 1]
if (STATE / job).exists() and not ended(job):
    print("RUNNING")
"""
)

SACCT = (
    COMMON
    + """
args = sys.argv[1:]
job = args[args.index("-j") + 1]
d = STATE / job
if not d.exists():
    sys.exit(0)
if (d / "cancelled").exists():
    print("CANCELLED by 0|0:15")
elif (d / "rc").exists():
    rc = int((d / "rc").read_text().strip() or 1)
    print(("COMPLETED" if rc == 0 else "FAILED") + f"|{{rc}}:0")
elif alive(job_pid(job) or 0):
    print("RUNNING|0:0")
"""
)

SCANCEL = (
    COMMON
    + """
for job in sys.argv[1:]:
    d = STATE / job
    pid = job_pid(job)
    if pid is None or ended(job):
        continue
    (d / "cancelled").write_text("")
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            break
        time.sleep(1.0)
"""
)


#: srun inside a job on this one node: `hostname` answers 127.0.0.1; any other command runs as
#: --ntasks copies (one with --ntasks-per-node=1) with SLURM_PROCID / SLURM_LOCALID / SLURM_NTASKS
SRUN = (
    COMMON
    + """
args, opts, i = sys.argv[1:], {{}}, 0
while i < len(args) and args[i].startswith("-"):
    if "=" in args[i]:
        k, v = args[i].lstrip("-").split("=", 1)
        opts[k] = v
        i += 1
    elif args[i] in ("-w", "-n", "-N"):
        opts[args[i].lstrip("-")] = args[i + 1]
        i += 2
    else:
        opts[args[i].lstrip("-")] = ""
        i += 1
cmd = args[i:]
if cmd[:1] == ["hostname"]:
    print("127.0.0.1")
    sys.exit(0)
n = 1 if "ntasks-per-node" in opts else int(opts.get("ntasks", 1))
env = lambda r: dict(os.environ, SLURM_PROCID=str(r), SLURM_LOCALID=str(r), SLURM_NTASKS=str(n))
procs = [subprocess.Popen(cmd, env=env(r)) for r in range(n)]
sys.exit(max(p.wait() for p in procs))
"""
)

#: `scontrol show hostnames LIST`: this one node
SCONTROL = (
    COMMON
    + """
print("localhost")
"""
)


def install(bin_dir: Path, state: Path) -> None:
    """Write the commands into `bin_dir` (put it first on PATH), keeping state in `state`."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    commands = (("sbatch", SBATCH), ("squeue", SQUEUE), ("sacct", SACCT), ("scancel", SCANCEL))
    for name, body in commands + (("srun", SRUN), ("scontrol", SCONTROL)):
        path = bin_dir / name
        path.write_text(body.format(python=sys.executable, state=str(state)))
        path.chmod(0o755)


def calls(state: Path, command: str) -> list[str]:
    """The logged calls of one command."""
    try:
        lines = (state / "calls.log").read_text().splitlines()
    except OSError:
        return []
    return [ln for ln in lines if ln.split(" ", 1)[0] == command]


def cancel_all(state: Path) -> None:
    """Kill every job the stubs started (test clean-up)."""
    import signal

    for d in state.glob("[0-9]*"):
        try:
            os.killpg(int((d / "pid").read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass
