"""The hardware behaviour data (autopar/spec/data/hardware_behaviour.toml): every published figure in
it is one of the bundled microbenchmark rows (data/microbenchmarks.csv, one figure a row with its
source), every GPU preset has published figures or a named stand-in, and the curves the cost model
reads reproduce the published points."""

from __future__ import annotations

import csv
import math
import re
import tomllib
from dataclasses import replace
from importlib import resources

import numpy as np
import pytest

from autopar.spec.behaviour import behaviour, behaviour_of, published_gpus, shared_figures
from autopar.spec.curves import Curve
from autopar.spec.hardware import compute_clock_factor, get_gpu, gpu_names

#: keys of hardware_behaviour.toml whose numbers are measurements (the rest are the settings a
#: measurement was taken at: sizes, sequence lengths, batch, heads, GPU counts)
MEASURED = re.compile(
    r"(tflops|_us$|busbw|_gbps$|^fa2_(non)?causal_hd|^(non)?causal_hd|achieved_tbps|^rdma_gbps|^nvlink_gbps|"
    r"^dense$|^grouped_|^kernels$)"
)
SETTINGS = {"nic_line_gbps", "nvlink_line_gbps"}


def _data() -> dict:
    return tomllib.loads(resources.files("autopar.spec").joinpath("data/hardware_behaviour.toml").read_text())


def _csv_values() -> set[float]:
    text = resources.files("autopar.spec").joinpath("data/microbenchmarks.csv").read_text()
    out = set()
    for row in csv.DictReader(text.splitlines()):
        for field in ("value", "setting", "notes"):
            for m in re.finditer(r"\d+(?:\.\d+)?", row[field] or ""):
                out.add(round(float(m.group(0)), 3))
    return out


def _numbers(key: str, value) -> list[float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [float(value)]
    if isinstance(value, list):
        if key in ("dense", "grouped_large", "grouped_small"):  # [M, N, K, TFLOPS]
            return [float(r[3]) for r in value]
        return [float(v) for v in value]
    return []


def _measurements(table: dict, path: str = ""):
    for key, value in table.items():
        if isinstance(value, dict):
            yield from _measurements(value, f"{path}{key}.")
        elif key not in SETTINGS and MEASURED.search(key):
            for v in _numbers(key, value):
                yield f"{path}{key}", v


def test_every_published_figure_is_a_bundled_microbenchmark_row():
    known = _csv_values()
    figures = list(_measurements(_data()))
    assert len(figures) > 150
    missing = [(k, v) for k, v in figures if round(v, 3) not in known]
    assert not missing, f"figures not in microbenchmarks.csv: {missing[:10]}"


def test_every_figure_names_its_source():
    for name, table in _data().items():
        if not isinstance(table, dict):
            continue
        for sub, t in ((name, table), *((f"{name}.{k}", v) for k, v in table.items() if isinstance(v, dict))):
            measured = [k for k in t if not isinstance(t[k], dict) and MEASURED.search(k) and k not in SETTINGS]
            if measured and "stand_in" not in t:
                assert any(k.startswith("source") or k == "stand_in_why" for k in t), sub


def test_every_gpu_preset_has_published_figures_or_a_named_stand_in():
    assert set(gpu_names()) == set(published_gpus())
    for key in gpu_names():
        b = behaviour(key)
        assert b.gemm.bf16_flops > 0 and 0 < b.hbm_fraction <= 1
        entry = _data()[key]
        if "stand_in" in entry:
            assert entry["stand_in_why"] and any(entry["stand_in"] in s for s in b.stand_ins)


def test_curves_interpolate_in_log_log_and_stay_flat_beyond():
    c = Curve((1.0, 100.0), (10.0, 1000.0))
    assert float(c(10.0)) == pytest.approx(100.0)  # sqrt(10 * 1000)
    assert float(c(0.01)) == pytest.approx(10.0) and float(c(1e6)) == pytest.approx(1000.0)


def test_h100_attention_curve_is_tritonbench():
    """FA3 causal forward at S=4096, B=4, H=48, D=128: 4 B S^2 H D / 2 FLOPs in 1236.9 us; the
    backward does 2.5 x those FLOPs in 4643.46 us (meta-pytorch/tritonbench PR #1267)."""
    a = behaviour("h100-sxm").attention
    flops = 4 * 4 * 4096**2 * 48 * 128 / 2
    assert float(a.native_fwd(4096)) == pytest.approx(flops / 1236.9e-6)
    assert float(a.native_bwd(4096)) == pytest.approx(2.5 * flops / 4643.46e-6)
    # unmasked blocks: the causal rate x the FA3 README's unmasked / causal ratio at the same length
    assert float(a.native_fwd_full(4096)) == pytest.approx(flops / 1236.9e-6 * 638 / 579)


def test_nvlink_all_reduce_is_the_dgxc_table():
    nv = behaviour("h100-sxm").nvlink
    assert float(nv.all_reduce_s(67108864)) == pytest.approx(324.7e-6)
    # between two points: log-log interpolation of the time
    mid = math.sqrt(67108864 * 268435456)
    assert float(nv.all_reduce_s(mid)) == pytest.approx(math.sqrt(324.7e-6 * 1112.5e-6))


def test_stand_ins_scale_as_stated():
    """H800: the H100's NVLink curve x 200/450 (the presets' rates); H100 96GB at 500 W: the H100's
    figures, its compute ones at the clock a 500 W cap of a 700 W board leaves, sqrt(5/7)."""
    h100, h800 = behaviour("h100-sxm"), behaviour("h800")
    assert h800.nvlink.ring_busbw == pytest.approx(h100.nvlink.ring_busbw * 0.444)
    assert h800.gemm.bf16_flops == h100.gemm.bf16_flops
    assert behaviour("h100-96gb-hbm2e").gemm.bf16_flops == 794.5e12  # the table's: the silicon's
    capped = behaviour_of(get_gpu("h100-96gb-hbm2e"))
    assert capped.gemm.bf16_flops == pytest.approx(794.5e12 * math.sqrt(5 / 7))
    assert float(capped.attention.native_fwd(8192)) == pytest.approx(
        float(h100.attention.native_fwd(8192)) * math.sqrt(5 / 7)
    )
    assert capped.hbm_fraction == h100.hbm_fraction and capped.nvlink == h100.nvlink  # no clock falls there
    # GB300 has no figure of its own: the GB200's, and the GB200's attention is the B200's scaled
    assert behaviour("gb300").gemm == behaviour("gb200").gemm
    b200, gb200 = behaviour("b200").attention, behaviour("gb200").attention
    assert float(gb200.native_fwd(8192)) == pytest.approx(float(b200.native_fwd(8192)) * 1.111)


def test_shape_points_are_the_deepgemm_ratios():
    """M = 64: the mean over the six N, K of rate(M=64) / rate(M=4096), by hand from the README."""
    pts = dict(shared_figures().shape_points)
    by_hand = np.mean([206 / 1127, 289 / 1212, 219 / 775, 336 / 1520, 287 / 1410, 295 / 1168])
    assert pts[64.0] == pytest.approx(by_hand)
    assert pts[256.0] == pytest.approx(np.mean([932 / 1346, 815 / 1214]))
    assert pts[4096.0] == 1.0


@pytest.mark.parametrize(
    "tdp,cap,published,source",
    [
        # MLPerf Inference v4.0, 8x H100 SXM, MaxQ vs MaxP (power-caps reference): ResNet-50 at 300 W,
        # RetinaNet at 350 W, BERT-99 at 400 W
        (700, 300, 0.673, "MLPerf v4.0 ResNet-50"),
        (700, 350, 0.712, "MLPerf v4.0 RetinaNet"),
        (700, 400, 0.766, "MLPerf v4.0 BERT-99"),
        # HGX B200 (1000 W) against GB200 (1200 W): dense BF16 2250 against 2500 TFLOPS
        (1200, 1000, 0.900, "NVIDIA B200 / GB200 specifications"),
        # B100 (700 W) against B200 (1000 W): 1.75 against 2.25 PFLOPS dense FP16
        (1000, 700, 0.778, "NVIDIA B100 / B200 specifications"),
    ],
)
def test_power_cap_throughput_matches_published_pairs(tdp, cap, published, source):
    """Compute throughput under a power cap against the published pairs the exponent was fitted to,
    within 8 % (the pairs' own exponents spread over 0.35-0.7 around its 0.5)."""
    gpu = replace(get_gpu("h100-sxm"), tdp_w=float(tdp), power_limit_w=float(cap))
    assert compute_clock_factor(gpu) == pytest.approx(published, rel=0.08), source


def test_power_cap_leaves_an_uncapped_gpu_alone():
    h100 = get_gpu("h100-sxm")
    assert h100.tdp_w == 700.0 and h100.power_limit_w is None and h100.power_w == 700.0
    assert compute_clock_factor(h100) == 1.0
    assert compute_clock_factor(replace(h100, power_limit_w=800.0)) == 1.0  # above the TDP: no boost
    assert behaviour_of(h100) == behaviour("h100-sxm")
