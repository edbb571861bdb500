"""Predicted peak memory per device as a bar chart against the device's capacity, and the
memory levers the plan pulls (micro-batches, ZeRO stage, activation recompute).

A plan that fits with 2% headroom and one that fits with 60% look the same in a table of
iteration times; this chart shows which devices are tight. Bars over capacity are red (a plan
should never have them, but a hand-edited or measured plan might).
"""

from __future__ import annotations

import io

from spindle_dsl.plan.model import Plan
from spindle_dsl.render.fmt import sig3

GiB = 2**30


def memory_summary(plan: Plan) -> dict[str, float] | None:
    """Peak, mean and least bytes per device and the capacity; None if the plan has none."""
    mem = plan.memory_bytes
    if not mem:
        return None
    return {
        "peak": float(max(mem)),
        "mean": sum(mem) / len(mem),
        "least": float(min(mem)),
        "capacity": float(plan.cluster.memory_bytes),
    }


ZERO_WORDS = {
    0: "nothing sharded: every device holding a parameter part keeps its weights, gradients "
    "and optimizer state whole",
    1: "optimizer state sharded over the devices holding each parameter part (ZeRO-1)",
    2: "optimizer state and gradients sharded over the devices holding each parameter part "
    "(ZeRO-2: gradients reduce-scattered every pass)",
}


def levers_text(plan: Plan) -> str:
    """'k=4, ZeRO-2, recompute 3/12': the memory levers in a few words."""
    rc = sum(m.recompute for m in plan.metaops)
    return f"k={plan.micro_batches}, ZeRO-{plan.zero_stage}, recompute {rc}/{len(plan.metaops)}"


def memory_levers(plan: Plan) -> list[tuple[str, str]]:
    """The memory levers the plan pulls, one (lever, what it does here) row each; then the
    levers each baseline was tuned with, when the planner recorded them."""
    k = plan.micro_batches
    rc = [m.id for m in plan.metaops if m.recompute]
    rows = [
        (
            "micro-batches",
            f"k = {k}: the waves run {k} times per iteration, each on 1/{k} of every task's "
            "batch, gradients accumulating to one optimizer step"
            if k > 1
            else "k = 1: the waves run once per iteration, on the whole batch",
        ),
        ("ZeRO stage", f"{plan.zero_stage}: {ZERO_WORDS.get(plan.zero_stage, '?')}"),
        (
            "activation recompute",
            f"{len(rc)} of {len(plan.metaops)} MetaOps: {', '.join(rc)}" if rc else "none",
        ),
    ]
    for name, lv in plan.extra.get("baseline_levers", {}).items():
        rows.append(
            (
                f"{name} (baseline)",
                f"k={lv['micro_batches']}, ZeRO-{lv['zero_stage']}, "
                f"recompute {len(lv['recompute'])}/{len(plan.metaops)}",
            )
        )
    return rows


def memory_svg(plan: Plan) -> bytes | None:
    """The chart as SVG bytes, or None when the plan records no memory figures."""
    if not plan.memory_bytes:
        return None
    import matplotlib
    from matplotlib.figure import Figure

    mem = [b / GiB for b in plan.memory_bytes]
    cap = plan.cluster.memory_bytes / GiB
    fig = Figure(figsize=(13, 3.2), dpi=110, layout="constrained")
    ax = fig.add_subplot()
    colours = ["#d62728" if m > cap else "#4e79a7" for m in mem]
    ax.bar(range(len(mem)), mem, color=colours, width=0.8)
    ax.axhline(cap, color="#222222", linestyle="--", linewidth=1)
    ax.text(len(mem) - 0.5, cap, f"capacity {sig3(cap)} GiB", ha="right", va="bottom", fontsize=8)
    per_node = plan.cluster.devices_per_node
    for b in range(per_node, len(mem), per_node):
        ax.axvline(b - 0.5, color="#999999", linewidth=0.6)
    ax.set_xlim(-0.6, len(mem) - 0.4)
    ax.set_ylim(0, max(max(mem), cap) * 1.12)
    ax.set_xlabel("device")
    ax.set_ylabel("predicted peak (GiB)")
    ax.set_title("memory per device", fontsize=10)
    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "spindle"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return buf.getvalue()
