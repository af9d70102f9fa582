"""The order the measured stage runs its candidates in: spread over layouts (`diverse`), and the
plans the model cannot separate from the leader first (`unresolved_first`, from the 80 % intervals
of autopar.calibration.uncertainty)."""

from __future__ import annotations


def diverse(keys: list[str], cands: dict[str, dict]) -> list[str]:
    """The ranking reordered round-robin over layouts (axes, schedule, recomputation), fastest first
    within each, so the top-K measured spans axes, schedules, recomputation, micro-batches and ZeRO
    stages, not one layout's near-ties."""
    groups: dict[str, list[str]] = {}
    for k in keys:
        p = cands[k]["plan"]
        layout = (p["tp"], p["pp"], p["vpp"], p.get("cp", 1), p["dp"], p.get("pp_schedule"), p.get("recompute"))
        groups.setdefault(".".join(map(str, layout)), []).append(k)
    out: list[str] = []
    i = 0
    while len(out) < len(keys):
        for g in groups.values():
            if i < len(g):
                out.append(g[i])
        i += 1
    return out


def unresolved_first(ranking: list[str], cands: dict[str, dict]) -> list[str]:
    """The order the measured stage runs plans in: the leader (the ranking's first) first; then the
    plans the model cannot tell from it, those whose step-time interval overlaps the leader's, the
    extrapolated before the calibrated (a measurement settles most where the model knows least);
    then the rest. Each group keeps the ranking's order. Candidates without intervals count as
    overlapping and calibrated."""
    if not ranking:
        return []
    lead = cands[ranking[0]]["predicted"]
    lead_high = lead.get("step_time_s_interval", [0.0, float("inf")])[1]

    def group(k: str) -> int:
        p = cands[k]["predicted"]
        low = p.get("step_time_s_interval", [p["step_time_s"]])[0]
        if low > lead_high:
            return 3
        return 1 if p.get("support") == "extrapolated" else 2

    rest = sorted(ranking[1:], key=lambda k: group(k))  # stable: the ranking's order within a group
    return ranking[:1] + rest
