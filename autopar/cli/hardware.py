"""`autopar hardware`: the GPU presets with their key figures."""

from __future__ import annotations

from autopar.cli import app
from autopar.cli import options as o
from autopar.json_out import dumps


@app.command()
def hardware(as_json: o.Json = False, cluster: o.ClusterFile = None) -> None:
    """List GPU presets: dense peaks, the achievable GEMM rates the cost model uses (published MAMF),
    HBM, NVLink, NIC and host-link bandwidth (per GPU, per direction), the host memory bandwidth
    per GPU (what an offloaded optimizer step streams through), and which published figures stand
    in for the ones a GPU has none of. With --cluster: what `autopar probe` measured on that
    cluster beside the published figures it replaces.

    Example: autopar hardware --cluster ~/.autopar/h200-probed.yaml
    """
    if cluster is not None:
        _probed(cluster, as_json)
        return
    from dataclasses import asdict

    from autopar.spec.behaviour import behaviour
    from autopar.spec.hardware import get_gpu, gpu_names

    gpus = [get_gpu(n) for n in gpu_names()]
    beh = {g.key: behaviour(g.key) for g in gpus}
    if as_json:
        out = [
            asdict(g)
            | {
                "mamf_bf16_tflops": beh[g.key].gemm.bf16_flops / 1e12,
                "mamf_fp8_tflops": beh[g.key].gemm.fp8_flops / 1e12,
                "stand_ins": list(beh[g.key].stand_ins),
            }
            for g in gpus
        ]
        print(dumps(out, indent=2))
        return

    from autopar.cli.render import compact_table, console, note

    t = compact_table("GPU presets (each row's source: autopar hardware --json, autopar/spec/data/gpus.toml)")
    for col in (
        "key",
        "BF16",
        "FP8",
        "MAMF BF16",
        "MAMF FP8",
        "HBM GiB",
        "HBM GB/s",
        "NVLink",
        "NIC",
        "host",
        "DRAM",
        "/node",
        "name",
    ):
        # the key stays whole in a narrow terminal: it is what `--gpu` takes
        t.add_column(col, justify="left" if col in ("key", "name") else "right", no_wrap=col == "key")
    for g in gpus:
        t.add_row(
            g.key,
            f"{g.bf16_tflops:g}",
            f"{g.fp8_tflops:g}" if g.fp8_tflops else "-",
            f"{beh[g.key].gemm.bf16_flops / 1e12:.0f}",
            f"{beh[g.key].gemm.fp8_flops / 1e12:.0f}" if beh[g.key].gemm.fp8_flops else "-",
            f"{g.hbm_gib:g}",
            f"{g.hbm_gbps:g}",
            f"{g.intra_node_gbps:g}" + ("/link" if g.intra_node_topology == "full-mesh" else ""),
            f"{g.nic_gbps:g}",
            f"{g.host_link_gbps:g}" if g.host_link_gbps is not None else "-",
            f"{g.host_memory_gbps:g}" if g.host_memory_gbps is not None else "-",
            str(g.gpus_per_node),
            g.name,
        )
    console().print(t)
    console().print(
        "BF16, FP8: dense peak TFLOP/s; MAMF: the achievable GEMM rate, TFLOP/s (published; "
        "autopar/spec/data/hardware_behaviour.toml); NVLink (/link: per link of a full mesh), NIC, host (the "
        "GPU-host link: PCIe x16 or NVLink-C2C): GB/s per GPU per direction; DRAM: the host memory's GB/s per GPU "
        "(the vendor's reference system; - not stated: set host_link_gbps and host_memory_gbps in a cluster file); "
        "/node: GPUs per node."
    )
    for g in gpus:
        for stand_in in beh[g.key].stand_ins:
            console().print(note(f"{g.key}: {stand_in}"))


def _probed(path: str, as_json: bool) -> None:
    from autopar.cost.kernels import probed_figures
    from autopar.spec.resolve import resolve_cluster

    c = resolve_cluster(cluster_file=path)
    rows = probed_figures(c)
    if as_json:
        print(dumps({"cluster": c.name, "gpu": c.gpu.key, "source": c.measured.source, "figures": rows}, indent=2))
        return
    from autopar.cli.render import compact_table, console

    if not rows:
        console().print(
            f"{path}: nothing measured (no behaviour:, which autopar probe --device cuda writes); "
            f"the published figures of {c.gpu.key} price it"
        )
        return
    t = compact_table(f"{c.name or path}: measured by {c.measured.source or 'autopar probe'}")
    for col in ("figure", "unit", f"published ({c.gpu.key})", "this cluster", "ratio"):
        t.add_column(col, justify="left" if col == "figure" else "right")

    def show(v: float | None) -> str:
        return "-" if v is None else f"{v:,.0f}" if v >= 10 else f"{v:.3g}"

    for r in rows:
        pub, here = r["published"], r["this_cluster"]
        ratio = f"{here / pub:.2f}" if pub and here is not None else "-"
        t.add_row(r["figure"], r["unit"], show(pub), show(here), ratio)
    console().print(t)
