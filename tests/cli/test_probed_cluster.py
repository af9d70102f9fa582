"""What `autopar probe --device cuda` measures replaces the published hardware figures of the same
name (issue 22: "a user's own cluster replaces the defaults"): the probe's document becomes a cluster
file, the cluster file's `behaviour:` reaches the kernel rates, bad files are refused in one line.
The GPU side itself runs on a GPU only (benchmarks/gpu_probe_check.sh); here the same code runs on
the CPU at tiny sizes, and the rates are derived by hand from the document."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from autopar.cost.kernels import attention_seconds, gpu_behaviour, hbm_rate, large_gemm_rate
from autopar.measured.local_profile import write_gpu_cluster
from autopar.spec.behaviour import behaviour_of
from autopar.spec.hardware import cluster_from_dict, get_gpu, load_cluster_file, preset_for_device
from autopar.spec.table import DTYPE

SEQ = [1024, 4096]
HALF = 300.0  # the shape fall-off x / (x + HALF) of the document's small-M GEMMs
NATIVE = {
    "attention_fwd_tflops": [300.0, 500.0],
    "attention_bwd_tflops": [200.0, 400.0],
    "attention_fwd_full_tflops": [400.0, 600.0],
    "attention_bwd_full_tflops": [300.0, 450.0],
}


def _probed(**behaviour):
    return cluster_from_dict({"gpu": "h200", "behaviour": {"source": "test", **behaviour}})


def test_measured_gemm_and_copy_rates_replace_the_published_ones():
    published = behaviour_of(get_gpu("h200")).gemm
    c = _probed(bf16_tflops=700.0, hbm_gbps=4300.0)
    assert float(large_gemm_rate(c, DTYPE["bf16"])) == pytest.approx(700e12)
    assert float(large_gemm_rate(c, DTYPE["fp8"])) == pytest.approx(published.fp8_flops)  # not measured: kept
    assert hbm_rate(c) == pytest.approx(4300e9)
    assert "measured on this cluster (test)" in gpu_behaviour(c).stand_ins[-1]


def test_measured_attention_curves_price_attention():
    """Without CP, a causal forward of f FLOPs and its backward (2.5 f) at head dim 128 take
    f / fwd + 2.5 f / bwd seconds at the measured rates of that length (interpolated in log-log)."""
    c = _probed(attention_seq=SEQ, **NATIVE)
    f = 1e12
    got = attention_seconds(c, f, 4096, 128.0, 1.0, 0.0)
    assert float(got) == pytest.approx(f / 500e12 + 2.5 * f / 400e12)
    # between two measured lengths: log-log interpolation, 2048 is halfway in log
    fwd_2048 = np.exp((np.log(300e12) + np.log(500e12)) / 2)
    bwd_2048 = np.exp((np.log(200e12) + np.log(400e12)) / 2)
    assert float(attention_seconds(c, f, 2048, 128.0, 1.0, 0.0)) == pytest.approx(f / fwd_2048 + 2.5 * f / bwd_2048)


def test_an_unprobed_cluster_keeps_the_published_behaviour():
    plain = cluster_from_dict({"gpu": "h200"})
    assert gpu_behaviour(plain) == behaviour_of(get_gpu("h200"))


@pytest.mark.parametrize(
    "behaviour, needle",
    [
        ({"attention_fwd_tflops": [1.0, 2.0]}, "attention_seq"),
        ({"attention_seq": SEQ, "attention_fwd_tflops": [1.0]}, "1 values for 2 lengths"),
        ({"attention_seq": [4096, 1024], **NATIVE}, "must increase"),
        ({"attention_seq": SEQ, "attention_fwd_tflops": [1.0, 2.0]}, "measured together"),
        ({"bf16_tflops": -5}, "bf16_tflops must be a number"),
        ({"attention_seq": SEQ, "attention_mma_sync_tflops": ["x", 1]}, "list of positive numbers"),
        ({"hbm": 3000}, "unknown behaviour field"),
    ],
)
def test_a_bad_behaviour_mapping_is_one_line_naming_the_field(cli_run, one_line_error, tmp_path, behaviour, needle):
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"gpu": "h200", "behaviour": behaviour}))
    r = cli_run("estimate", "--model", "8b", "--gpus", "8", "--cluster", path)
    one_line_error(r, needles=[needle])


@pytest.mark.parametrize(
    "name, key",
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA GB200", "gb200"),
        ("NVIDIA H100 PCIe", None),
        ("NVIDIA H100 NVL", None),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_preset_for_device(name, key):
    assert preset_for_device(name) == key


@pytest.fixture(scope="module")
def probe_doc(tmp_path_factory):
    """The GPU probe's document, measured on this CPU at tiny sizes, named as an H200 would be."""
    out = tmp_path_factory.mktemp("probe") / "gpu.json"
    subprocess.run(
        [sys.executable, "-m", "autopar.trial.probe", "gpu", "--device", "cpu", "--quick", "--out", str(out)],
        check=True,
        timeout=300,
    )
    import json

    doc = json.loads(out.read_text()) | {"device": "NVIDIA H200", "device_count": 8}
    # CPU GEMMs this small are not rates of the fall-off; the GPU's follow 800e12 x / (x + 300)
    doc["bf16_gemm_small_m"] = [
        {"m": m, "n": 8192, "k": 8192, "flops_per_s": 800e12 * m / (m + HALF)} for m in (64, 256, 1024, 4096)
    ]
    return doc


def test_the_probe_document_becomes_a_cluster_file_that_reads_back(probe_doc, tmp_path):
    dest = tmp_path / "h200-probed.yaml"
    write_gpu_cluster(dest, probe_doc)
    cluster = load_cluster_file(dest)
    m = cluster.measured
    assert cluster.gpu.key == "h200" and cluster.gpus_per_node == 8
    assert m.bf16_tflops == pytest.approx(max(r["flops_per_s"] for r in probe_doc["bf16_gemm"]) / 1e12)
    assert m.gemm_half_dim == pytest.approx(HALF, rel=1e-4)
    assert m.hbm_gbps == pytest.approx(probe_doc["copy_bytes_per_s"] / 1e9)
    cudnn = next(a for a in probe_doc["attention"] if a["backend"] == "cudnn")["rows"]
    assert m.attention_seq == tuple(float(r["seq"]) for r in cudnn)
    assert m.attention_bwd_full_tflops == pytest.approx([r["full_bwd_flops_per_s"] / 1e12 for r in cudnn])
    flash = next(a for a in probe_doc["attention"] if a["backend"] == "flash")["rows"]
    assert m.attention_mma_sync_tflops == pytest.approx([r["causal_fwd_bwd_flops_per_s"] / 1e12 for r in flash])
    assert "NVIDIA H200" in (m.source or "")
    # the raw measurements are kept below the mapping
    assert "# raw measurements" in dest.read_text()
    # one visible GPU says nothing about the node: the preset's 8 GPUs per node stay
    write_gpu_cluster(dest, probe_doc | {"device_count": 1})
    assert load_cluster_file(dest).gpus_per_node == get_gpu("h200").gpus_per_node == 8


def test_estimate_runs_on_the_probed_cluster(cli_run, probe_doc, tmp_path):
    dest = tmp_path / "h200-probed.yaml"
    write_gpu_cluster(dest, probe_doc)
    r = cli_run("estimate", "--model", "tiny", "--gpus", "8", "--cluster", dest, "--json")
    assert r.returncode == 0, r.stderr


def test_a_card_without_a_preset_is_refused(probe_doc, tmp_path):
    from autopar.errors import InputError

    with pytest.raises(InputError, match="no GPU preset describes 'NVIDIA GeForce RTX 4090'"):
        write_gpu_cluster(tmp_path / "x.yaml", probe_doc | {"device": "NVIDIA GeForce RTX 4090"})


def test_probe_device_must_be_cpu_or_cuda(cli_run, one_line_error):
    one_line_error(cli_run("probe", "--device", "tpu"), needles=["--device"])
    one_line_error(cli_run("probe", "--device", "cuda", "--ranks", "4"), needles=["--ranks", "--device cpu"])


def test_small_m_rates_that_are_not_a_fall_off_are_refused(probe_doc, tmp_path):
    from autopar.errors import InputError

    noise = [{"m": m, "n": 8192, "k": 8192, "flops_per_s": r} for m, r in ((64, 9e14), (256, 1e9), (1024, 5e14))]
    with pytest.raises(InputError, match="do not follow"):
        write_gpu_cluster(tmp_path / "x.yaml", probe_doc | {"bf16_gemm_small_m": noise})


NVLINK = {
    "nvlink_gpus": 8,
    "nvlink_bytes": [1 << 20, 1 << 30],
    "nvlink_all_reduce_busbw": [40.0, 400.0],
    "nvlink_all_gather_busbw": 300.0,
    "nvlink_all_to_all_busbw": 250.0,
    "nvlink_p2p_gbps": 350.0,
}


def test_measured_node_collectives_price_the_calls_inside_a_node():
    """Inside one node of 8 GPUs: an all-reduce of s bytes takes 2 x 7/8 x s / busbw(s) at the
    measured busbw of that size; an all-gather 7/8 x s over the measured all-gather busbw (below the
    all-reduce's at 1 GiB); an all-to-all's in-node share 7/8 of its buffer at the measured rate."""
    from autopar.cost.collectives import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, Group, Links, collective_seconds

    c = _probed(**NVLINK)
    links = Links.of(c)
    one_node = Group(size=np.array([8]), per_node=np.array([8]), nodes=np.array([1]))
    gib, mib = float(1 << 30), float(1 << 20)
    assert collective_seconds(ALL_REDUCE, gib, one_node, links)[0] == pytest.approx(1.75 * gib / 400e9)
    assert collective_seconds(ALL_REDUCE, mib, one_node, links)[0] == pytest.approx(1.75 * mib / 40e9)
    assert collective_seconds(ALL_GATHER, gib, one_node, links)[0] == pytest.approx(7 / 8 * gib / 300e9)
    assert collective_seconds(ALL_TO_ALL, gib, one_node, links)[0] == pytest.approx(7 / 8 * gib / 250e9)
    assert links.nvlink is not None and links.nvlink.p2p == pytest.approx(350e9)


def test_node_collectives_come_together(cli_run, one_line_error, tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"gpu": "h200", "behaviour": {"nvlink_p2p_gbps": 300.0}}))
    one_line_error(cli_run("estimate", "--model", "8b", "--gpus", "8", "--cluster", path), ["measured together"])


def test_the_node_collectives_probe_becomes_the_nvlink_figures(probe_doc, tmp_path):
    """The collectives worker on 2 CPU ranks (gloo, tiny buffers), its figures as the probe's
    document carries them on a node of 2 GPUs, read back from the cluster file."""
    from autopar.measured.local_profile import node_collectives

    node = node_collectives(2, "cpu", 300, tmp_path, quick=True)
    assert node.get("world_size") == 2, node
    dest = tmp_path / "probed.yaml"
    write_gpu_cluster(dest, probe_doc | {"node_collectives": node})
    m = load_cluster_file(dest).measured
    rows = node["rows"]
    assert m.nvlink_gpus == 2 and m.nvlink_bytes == tuple(float(r["bytes"]) for r in rows)
    assert m.nvlink_all_reduce_busbw == pytest.approx([r["all_reduce_busbw_gbps"] for r in rows])
    assert m.nvlink_all_to_all_busbw == pytest.approx(rows[-1]["all_to_all_busbw_gbps"])
    assert m.nvlink_p2p_gbps == pytest.approx(node["p2p_gbps"])


def test_a_node_of_one_gpu_measures_no_collective_figures(probe_doc, tmp_path):
    """One rank: the worker returns (no send to a missing peer, which would wait forever) and the
    cluster file keeps the published NVLink figures."""
    from autopar.measured.local_profile import node_collectives

    node = node_collectives(1, "cpu", 120, tmp_path, quick=True)
    assert node.get("world_size") == 1 and node["p2p_gbps"] is None, node
    dest = tmp_path / "probed.yaml"
    write_gpu_cluster(dest, probe_doc | {"node_collectives": node})
    assert load_cluster_file(dest).measured.nvlink_bytes is None


def test_hardware_shows_the_probed_figures_beside_the_published(cli_run, one_line_error, tmp_path):
    """`autopar hardware --cluster FILE`: each measured figure beside the published one it replaces
    (the H200's: MAMF 794.5 BF16, the probe's 751.3), nothing for figures the probe did not measure."""
    import json

    from autopar.spec.behaviour import behaviour_of

    path = Path(__file__).resolve().parents[1] / "cost" / "data" / "h200-probed.yaml"
    r = cli_run("hardware", "--cluster", path, "--json")
    assert r.returncode == 0, r.stderr
    rows = {x["figure"]: x for x in json.loads(r.stdout)["figures"]}
    m = load_cluster_file(path).measured
    bf16 = rows["achievable BF16 GEMM"]
    assert bf16["published"] == pytest.approx(behaviour_of(get_gpu("h200")).gemm.bf16_flops / 1e12)
    assert bf16["this_cluster"] == pytest.approx(m.bf16_tflops)
    assert rows["memory-bound kernels"]["this_cluster"] == pytest.approx(m.hbm_gbps)
    assert rows["attention causal fwd @4K (native)"]["this_cluster"] == pytest.approx(519.5315559376138)
    assert not any(name.startswith("NVLink") for name in rows)  # one GPU: no collectives measured
    table = cli_run("hardware", "--cluster", path)
    assert "this cluster" in table.stdout and max(len(x) for x in table.stdout.splitlines()) <= 120
    plain = tmp_path / "plain.yaml"
    plain.write_text("gpu: h200\n")
    assert "nothing measured" in cli_run("hardware", "--cluster", plain).stdout
    one_line_error(cli_run("hardware", "--cluster", tmp_path / "missing.yaml"), ["missing.yaml"])
