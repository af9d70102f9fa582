"""Property tests (hypothesis) over the command-line options and the file schemas (issue 15): bad
input never raises a traceback; it exits 2 with exactly one stderr line `autopar: error: ...`.

Numeric options get only values outside their range (autopar.spec.schema.FLAGS), so no search,
trial or benchmark ever starts; model and cluster files get one field replaced by arbitrary data
(valid data may run a cheap `autopar estimate`: exit 0); space files go through the schema directly.
Bounded: a few hundred examples, derandomized, about ten seconds in this process.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autopar.spec.resolve import MAX_SIZE
from autopar.spec.schema import FLAGS, Limit

#: the plan flags' ranges (autopar.spec.resolve.PlanRequest.check) beside the schema's options
LIMITS = (
    FLAGS
    | {f: Limit(1, MAX_SIZE) for f in ("--tp", "--pp", "--vpp", "--cp", "--dp", "--ep", "--etp", "--mbs")}
    | {
        "--zero": Limit(0, 3),
        "--recompute-layers": Limit(0, MAX_SIZE),
        "--pp-first": Limit(0, MAX_SIZE),
        "--capacity-factor": Limit(1, 64, True),
    }
)

SETTINGS = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

#: command -> (argv with every option valid, numeric options to break); {dir} is a scratch folder
TEMPLATES = {
    "search": (
        ["search", "--model", "tiny", "--gpus", "8", "--run-dir", "{dir}/run"],
        [
            "--gpus",
            "--seq-len",
            "--gbs",
            "--top-k",
            "--max-exhaustive",
            "--n-trials",
            "--seed",
            "--trials",
            "--trial-budget",
            "--rounds",
            "--trial-steps",
            "--trial-timeout",
            "--max-local-ranks",
            "--proxy-layers",
            "--proxy-width",
            "--proxy-seq",
            "--gpus-per-node",
        ],
    ),
    "trial": (
        ["trial", "--model", "tiny", "--gpus", "1", "--run-dir", "{dir}/trials"],
        [
            "--gpus",
            "--seq-len",
            "--steps",
            "--warmup",
            "--nnodes",
            "--timeout",
            "--memory-limit-mib",
            "--proxy-layers",
            "--proxy-width",
            "--max-local-ranks",
        ],
    ),
    "probe": (["probe", "--out", "{dir}/p.yaml"], ["--ranks", "--timeout"]),
    "export": (
        ["export", "--to", "megatron", "--model", "tiny", "--gpus", "8", "--out", "{dir}/export"],
        ["--master-port", "--rank", "--gpus", "--seq-len", "--gpus-per-node"],
    ),
    "estimate": (
        ["estimate", "--model", "tiny", "--gpus", "8"],
        [
            "--gpus",
            "--seq-len",
            "--gpus-per-node",
            "--tp",
            "--pp",
            "--vpp",
            "--cp",
            "--dp",
            "--ep",
            "--etp",
            "--mbs",
            "--gbs",
            "--zero",
            "--recompute-layers",
            "--pp-first",
            "--capacity-factor",
        ],
    ),
    "calibrate": (["calibrate", "{dir}/no-run"], ["--top"]),
}
CASES = [(cmd, flag) for cmd, (_, flags) in TEMPLATES.items() for flag in flags]

TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)


def _parses(text: str, number: bool) -> bool:
    """Whether click would read `text` as the option's type (int(), or float() for numbers)."""
    try:
        (float if number else int)(text)
    except (ValueError, OverflowError):
        return False
    return True


@st.composite
def bad_value(draw, flag: str) -> str:
    """A value outside the option's range, as the command line gives it."""
    lo, hi, number, above = LIMITS[flag]
    if number:
        below = st.floats(max_value=lo, exclude_max=not above, allow_nan=False)
        options = [below, st.floats(min_value=hi, exclude_min=True), st.sampled_from([math.nan, math.inf, -math.inf])]
        options = [s.map(repr) for s in options]
    else:
        options = [
            st.integers(max_value=int(lo) - 1).map(str),
            st.integers(min_value=int(hi) + 1).map(str),
            st.integers(min_value=10**20, max_value=10**200).map(str),
        ]
    options.append(TEXT.filter(lambda t: not _parses(t, number)))
    return draw(st.one_of(options))


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@settings(max_examples=150, **SETTINGS)
@given(case=st.sampled_from(CASES), data=st.data())
def test_a_bad_number_is_one_line_naming_the_option(cli_run, one_line_error, scratch, case, data):
    cmd, flag = case
    value = data.draw(bad_value(flag), label="value")
    argv = [a.replace("{dir}", str(scratch)) for a in TEMPLATES[cmd][0]] + [f"{flag}={value}"]
    # the line names the option and the value: a number as given, other text quoted (repr)
    shown = value.strip() if _parses(value, True) else " ".join(repr(value).split())
    one_line_error(cli_run(*argv), [flag, shown] if len(value) <= 40 else [flag])
    assert not (scratch / "run").exists() and not (scratch / "p.yaml").exists()


SCALARS = (
    st.none() | st.booleans() | st.integers() | st.integers(min_value=10**20, max_value=10**60) | st.floats() | TEXT
)
JUNK = st.recursive(
    SCALARS,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(TEXT, children, max_size=4)),
    max_leaves=12,
)

MODEL = {
    "num_layers": 4,
    "hidden_size": 64,
    "ffn_hidden_size": 128,
    "num_attention_heads": 4,
    "num_kv_heads": 2,
    "head_dim": 16,
    "vocab_size": 1000,
    "seq_len": 256,
}
MOE = {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 64}
MLA = {"q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16}
MODEL_KEYS = (
    list(MODEL)
    + ["name", "norm", "gated_mlp", "tied_embeddings", "qk_norm", "linear_bias", "moe", "mla", "bogus"]
    + [f"moe.{k}" for k in list(MOE) + ["num_shared_experts", "first_k_dense", "layer_freq", "router_bias"]]
    + [f"mla.{k}" for k in MLA]
)
CLUSTER_KEYS = [
    "gpu",
    "gpus_per_node",
    "intra_node_gbps",
    "inter_node_gbps",
    "intra_node_latency_us",
    "name",
    "intra_node_topology",
    "training_stack",
    "pinned",
    "constants",
    "constants.gemm_efficiency",
    "constants.layer_overhead_us",
    "gpu.hbm_gib",
    "gpu.bf16_tflops",
    "gpu.name",
    "gpu.gpus_per_node",
    "gpu.intra_node_topology",
    "gpu.base",
    "gpu.bogus",
    "reliability",
    "reliability.interruptions_per_gpu_hour",
    "reliability.checkpoint_gbps_per_gpu",
    "reliability.restart_s",
    "reliability.bogus",
]


def _with(base: dict, key: str, value) -> dict:
    """`base` with `key` (dotted: one level down) set to `value`."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    head, _, leaf = key.partition(".")
    if leaf:
        out.setdefault(head, {})[leaf] = value
    else:
        out[head] = value
    return out


def _write(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    return path


def _exit_0_or_one_line(r, one_line_error) -> None:
    """Valid data may run (exit 0: its --json output strict JSON, no NaN or Infinity), or answer that
    no plan meets its deadline or budget (exit 1: one line on stdout); anything else is the one-line
    contract."""
    if r.returncode == 1:
        assert r.stderr == "" and len(r.stdout.splitlines()) == 1 and r.stdout.startswith("autopar: "), r
        return
    if r.returncode != 0:
        one_line_error(r)
    elif r.stdout.lstrip().startswith(("{", "[")):
        import json

        def refuse(word: str):
            raise ValueError(f"--json output holds {word}")

        json.loads(r.stdout, parse_constant=refuse)


@settings(max_examples=80, **SETTINGS)
@given(key=st.sampled_from(MODEL_KEYS), value=JUNK)
def test_a_model_file_field_is_exit_0_or_one_line(cli_run, one_line_error, scratch, key, value):
    base = dict(MODEL, moe=MOE) if key.startswith("moe.") else dict(MODEL, mla=MLA) if key.startswith("mla.") else MODEL
    path = _write(scratch / "model.yaml", _with(base, key, value))
    _exit_0_or_one_line(cli_run("estimate", "--model", path, "--gpus", "2", "--json"), one_line_error)


@settings(max_examples=80, **SETTINGS)
@given(key=st.sampled_from(CLUSTER_KEYS), value=JUNK)
def test_a_cluster_file_field_is_exit_0_or_one_line(cli_run, one_line_error, scratch, key, value):
    base = {"gpu": {"base": "h100-sxm"}} if key.startswith("gpu.") else {"gpu": "h100-sxm"}
    path = _write(scratch / "cluster.yaml", _with(base, key, value))
    argv = ["estimate", "--model", "tiny", "--gpus", "8", "--cluster", path, "--tokens", "1T", "--json"]
    _exit_0_or_one_line(cli_run(*argv), one_line_error)


RUN_FLAGS = ["--tokens", "--deadline", "--price-per-gpu-hour", "--budget"]


@settings(max_examples=60, **SETTINGS)
@given(
    flag=st.sampled_from(RUN_FLAGS),
    value=st.one_of(TEXT, st.floats(allow_nan=True).map(str), st.integers(max_value=0).map(str)),
)
def test_a_whole_run_flag_is_exit_0_or_one_line(cli_run, one_line_error, flag, value):
    """--tokens/--deadline/--price-per-gpu-hour/--budget with anything: an estimate or one line."""
    context = {"--tokens": [], "--budget": ["--tokens", "1T", "--price-per-gpu-hour", "2"]}.get(
        flag, ["--tokens", "1T"]
    )
    r = cli_run("estimate", "--model", "tiny", "--gpus", "8", *context, flag, value, "--json")
    _exit_0_or_one_line(r, one_line_error)


HF = {
    "model_type": "llama",
    "num_hidden_layers": 4,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 512,
}
HF_KEYS = list(HF) + [
    "architectures",
    "head_dim",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
    "num_local_experts",
    "num_experts_per_tok",
    "mlp_only_layers",
    "decoder_sparse_step",
    "n_routed_experts",
    "moe_layer_freq",
    "first_k_dense_replace",
    "q_lora_rank",
    "kv_lora_rank",
]
HF_TYPES = ["llama", "mixtral", "qwen3_moe", "deepseek_v3", "qwen2"]


@settings(max_examples=60, **SETTINGS)
@given(model_type=st.sampled_from(HF_TYPES), key=st.sampled_from(HF_KEYS), value=JUNK)
def test_a_huggingface_config_field_is_exit_0_or_one_line(cli_run, one_line_error, scratch, model_type, key, value):
    import json

    folder = scratch / "hf"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(_with(dict(HF, model_type=model_type), key, value)))
    _exit_0_or_one_line(cli_run("estimate", "--model", folder, "--gpus", "2", "--json"), one_line_error)


@settings(max_examples=40, **SETTINGS)
@given(text=st.text(max_size=300))
def test_any_text_as_a_model_file_is_exit_0_or_one_line(cli_run, one_line_error, scratch, text):
    path = scratch / "raw.yaml"
    path.write_text(text, errors="surrogatepass")
    _exit_0_or_one_line(cli_run("estimate", "--model", path, "--gpus", "2"), one_line_error)


SPACE_KEYS = (
    ["name", "description", "knobs", "constraints", "bogus"]
    + [
        f"knobs.{k}"
        for k in (
            "tp",
            "pp",
            "vpp",
            "cp",
            "ep",
            "etp",
            "zero",
            "mbs",
            "recompute",
            "recompute_layers",
            "dtype",
            "sp",
            "pp_schedule",
            "trainer",
            "tokens_per_step",
            "gbs",
            "bogus",
        )
    ]
    + [f"constraints.{k}" for k in ("tp_within_node", "max_pp", "min_dp", "memory_headroom_gib", "bogus")]
)


@settings(max_examples=80, **SETTINGS)
@given(key=st.sampled_from(SPACE_KEYS), value=JUNK)
def test_a_space_file_field_is_a_space_or_one_line(key, value):
    from autopar.errors import InputError
    from autopar.search.space import SearchSpace, space_from_dict

    data = _with({"knobs": {"tp": [1, 2]}, "constraints": {}}, key, value)
    try:
        assert isinstance(space_from_dict(data, "search space 'fuzz.yaml'"), SearchSpace)
    except InputError as e:
        text = str(e)
        assert text.startswith("search space 'fuzz.yaml'") and len(text) < 600, text
