"""The plan format's invariants (shared/docs/plan-format.md), checked on a ``Plan`` value.

``validate_plan`` returns one line per broken invariant (empty when the plan is valid), so
the CLI can list them all and tests can assert on them. It checks the five invariants of the
format, plus the sanity of the optional fields this project writes: predicted memory per
device within the device's memory, and a breakdown whose compute part is the waves' sum.
Times compare with a relative tolerance, since they went through JSON and sums.
"""

from __future__ import annotations

from spindle_dsl.plan.model import Plan

REL = 1e-6


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= REL * max(abs(a), abs(b)) + 1e-12


def _le(a: float, b: float) -> bool:
    return a <= b + REL * max(abs(a), abs(b)) + 1e-12


def validate_plan(plan: Plan) -> list[str]:
    """Every broken invariant of ``plan``, as readable lines."""
    errs: list[str] = []
    ops = {}
    for m in plan.metaops:
        if m.id in ops:
            errs.append(f"metaops: id '{m.id}' appears twice")
        ops[m.id] = m
    for m in plan.metaops:
        errs.extend(
            f"metaops: '{m.id}' depends on unknown MetaOp '{d}'" for d in m.deps if d not in ops
        )
        if m.layers < 1:
            errs.append(f"metaops: '{m.id}' has {m.layers} layers")
    errs += _coverage_and_deps(plan, ops)
    errs += _devices(plan)
    errs += _times(plan, ops)
    errs += _bounds(plan)
    errs += _extras(plan)
    return errs


def _coverage_and_deps(plan: Plan, ops: dict) -> list[str]:
    """Invariants 1 (coverage) and 2 (dependencies)."""
    errs: list[str] = []
    nxt = {i: 0 for i in ops}
    waves_of: dict[str, list[int]] = {i: [] for i in ops}
    for pos, w in enumerate(plan.waves):
        if w.index != pos:
            errs.append(f"wave {pos}: index is {w.index}, expected {pos}")
        seen: set[str] = set()
        for e in w.entries:
            if e.metaop not in ops:
                errs.append(f"wave {pos}: entry for unknown MetaOp '{e.metaop}'")
                continue
            if e.metaop in seen:
                errs.append(f"coverage: '{e.metaop}' has two entries in wave {pos}")
            seen.add(e.metaop)
            if e.first != nxt[e.metaop] or e.end <= e.first:
                errs.append(
                    f"coverage: '{e.metaop}' runs layers [{e.first}, {e.end}) in wave {pos}, "
                    f"expected to start at layer {nxt[e.metaop]}"
                )
            nxt[e.metaop] = max(nxt[e.metaop], e.end)
            waves_of[e.metaop].append(pos)
    for i, m in ops.items():
        if nxt[i] != m.layers:
            errs.append(f"coverage: '{i}' covers layers up to {nxt[i]} of {m.layers}")
    for i, m in ops.items():
        if not waves_of[i]:
            continue
        first = min(waves_of[i])
        for d in m.deps:
            if d in waves_of and waves_of[d] and max(waves_of[d]) >= first:
                errs.append(
                    f"dependencies: '{i}' starts in wave {first} but its input '{d}' "
                    f"still runs in wave {max(waves_of[d])}"
                )
    return errs


def _devices(plan: Plan) -> list[str]:
    """Invariant 3: disjoint device ids within a wave, each in [0, devices)."""
    errs: list[str] = []
    N = plan.cluster.devices
    for pos, w in enumerate(plan.waves):
        owner: dict[int, str] = {}
        for e in w.entries:
            if not e.devices:
                errs.append(f"devices: '{e.metaop}' in wave {pos} has no devices")
            if len(set(e.devices)) != len(e.devices):
                errs.append(f"devices: '{e.metaop}' in wave {pos} lists a device twice")
            for d in e.devices:
                if not 0 <= d < N:
                    errs.append(f"devices: wave {pos} uses device {d}, outside [0, {N})")
                elif d in owner and owner[d] != e.metaop:
                    errs.append(
                        f"devices: device {d} runs both '{owner[d]}' and '{e.metaop}' in wave {pos}"
                    )
                owner.setdefault(d, e.metaop)
    ids = {m.id for m in plan.metaops}
    for sink, devices in plan.loss_devices:
        if sink not in ids:
            errs.append(f"loss_devices: unknown MetaOp '{sink}'")
        errs.extend(
            f"loss_devices: '{sink}' scores on device {d}, outside [0, {N})"
            for d in devices
            if not 0 <= d < N
        )
    return errs


def _times(plan: Plan, ops: dict) -> list[str]:
    """Invariant 4: entry times from the curves, wave lengths, waves back to back."""
    errs: list[str] = []
    total = 0.0
    clock = plan.waves[0].start_s if plan.waves else 0.0
    for pos, w in enumerate(plan.waves):
        if not _close(w.start_s, clock):
            errs.append(f"time: wave {pos} starts at {w.start_s:.6g} s, expected {clock:.6g} s")
        clock = w.start_s + w.duration_s
        total += w.duration_s
        for e in w.entries:
            m = ops.get(e.metaop)
            if m is None:
                continue
            curve = dict(m.seconds_per_layer)
            n = len(e.devices)
            if n not in curve:
                errs.append(f"time: '{e.metaop}' has no seconds_per_layer for {n} devices")
                continue
            want = (e.end - e.first) * curve[n]
            if not _close(e.time_s, want):
                errs.append(
                    f"time: '{e.metaop}' in wave {pos} takes {e.time_s:.6g} s, "
                    f"expected {want:.6g} s"
                )
            if not _le(e.time_s, w.duration_s):
                errs.append(
                    f"time: wave {pos} lasts {w.duration_s:.6g} s, shorter than its entry "
                    f"'{e.metaop}' ({e.time_s:.6g} s)"
                )
    passes = plan.micro_batches * total  # the waves describe one micro-batch pass
    if not _le(passes, plan.iteration_s):
        errs.append(
            f"time: iteration_s {plan.iteration_s:.6g} s is less than the waves' {total:.6g} s "
            f"times micro_batches ({plan.micro_batches})"
        )
    return errs


def _bounds(plan: Plan) -> list[str]:
    """Invariant 5: the bound below, the sequential baseline above (or a note saying why)."""
    errs: list[str] = []
    if not _le(plan.lower_bound_s, plan.iteration_s):
        errs.append(
            f"bounds: lower_bound_s {plan.lower_bound_s:.6g} s exceeds "
            f"iteration_s {plan.iteration_s:.6g} s"
        )
    base = dict(plan.baselines)
    if "sequential_s" not in base:
        errs.append("bounds: baselines lack 'sequential_s'")
    elif not _le(plan.iteration_s, base["sequential_s"]) and not any(
        "sequential" in n for n in plan.notes
    ):
        errs.append(
            f"bounds: iteration_s {plan.iteration_s:.6g} s exceeds sequential_s "
            f"{base['sequential_s']:.6g} s and no note says why"
        )
    return errs


def _extras(plan: Plan) -> list[str]:
    """Optional fields this project writes: memory per device and the time breakdown."""
    errs: list[str] = []
    if plan.memory_bytes:
        if len(plan.memory_bytes) != plan.cluster.devices:
            errs.append(
                f"memory: {len(plan.memory_bytes)} figures for {plan.cluster.devices} devices"
            )
        cap = plan.cluster.memory_bytes
        bad = [d for d, b in enumerate(plan.memory_bytes) if b < 0 or b > cap]
        if bad:
            worst = max(bad, key=lambda d: abs(plan.memory_bytes[d]))
            errs.append(
                f"memory: {len(bad)} device(s) are predicted to hold more than their "
                f"{cap / 2**30:.1f} GiB (or a negative amount); worst: device {worst} with "
                f"{plan.memory_bytes[worst] / 2**30:.1f} GiB"
            )
    parts = dict(plan.breakdown)
    if "compute_s" in parts:
        waves = plan.micro_batches * sum(w.duration_s for w in plan.waves)
        if not _close(parts["compute_s"], waves):
            errs.append(
                f"breakdown: compute_s {parts['compute_s']:.6g} s is not the waves' sum "
                f"{waves:.6g} s (times micro_batches, {plan.micro_batches})"
            )
        if not _le(sum(parts.values()), plan.iteration_s):
            errs.append("breakdown: its parts add up to more than iteration_s")
    if plan.solver.wall_s < 0:
        errs.append("solver: negative wall_s")
    return errs
