"""The shipped examples whose results must not move under a refactor: `autopar search` runs
(plans.parquet, top.json) and `autopar estimate --json` outputs. `regenerate.py` writes their
golden files; `test_golden.py` reruns them and compares exactly. Regenerate only for an intended
change of the cost model, and say so in the commit."""

from __future__ import annotations

#: name -> `autopar search` arguments (the run directory is added by the runner)
SEARCHES: dict[str, list[str]] = {
    "70b-256": ["--model", "70b", "--gpus", "256"],
    "405b-16384": ["--model", "405b", "--gpus", "16384"],
    "deepseek-v3-1024-moe": ["--model", "deepseek-v3", "--gpus", "1024", "--space", "moe"],
    "qwen3-30b-a3b-64-moe": ["--model", "qwen3-30b-a3b", "--gpus", "64", "--space", "moe"],
    "70b-256-long": ["--model", "70b", "--gpus", "256", "--space", "long-context", "--seq-len", "65536"],
    "tiny-2-local": ["--model", "tiny", "--gpus", "2", "--gpu", "local"],
}

#: name -> `autopar estimate --json` arguments
ESTIMATES: dict[str, list[str]] = {
    "70b-tp8-pp4": ["--model", "70b", "--gpus", "256", "--tp", "8", "--pp", "4", "--seq-len", "8192", "--gbs", "512"],
    "405b-uneven": ["--model", "405b", "--gpus", "2048", "--tp", "8", "--pp", "8", "--vpp", "8", "--gbs", "1024",
                    "--recompute", "full", "--recompute-layers", "8"],
    "deepseek-v3-ep": ["--model", "deepseek-v3", "--gpus", "1024", "--tp", "2", "--pp", "16", "--ep", "64",
                       "--etp", "1", "--gbs", "2048", "--recompute", "selective"],
    "70b-cp-zb": ["--model", "70b", "--gpus", "256", "--tp", "2", "--cp", "2", "--pp", "8", "--zero", "3",
                  "--pp-schedule", "zero-bubble", "--seq-len", "8192", "--gbs", "512", "--trainer", "torchtitan"],
    "mixtral-fp8": ["--model", "mixtral-8x7b", "--gpus", "64", "--tp", "2", "--pp", "4", "--ep", "8", "--dtype",
                    "fp8", "--tp-comm-overlap", "--gbs", "256"],
    "tiny-local-torch": ["--model", "tiny", "--gpus", "2", "--gpu", "local", "--pp", "2", "--mbs", "2",
                         "--pp-schedule", "gpipe", "--gbs", "8"],
}
