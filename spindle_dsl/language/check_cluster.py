"""The cluster block and the command line's overrides, resolved to a ``Cluster``.

Precedence is command line over file over defaults, field by field. ``devices_per_node``
defaults to ``min(8, devices)`` *after* the device count is final, so ``--devices 32`` on a
spec written for 4 devices gives four 8-device nodes rather than eight 4-device ones.
"""

from __future__ import annotations

import math
from typing import Any

from spindle_dsl.cluster import PRESETS, Cluster
from spindle_dsl.language import limits
from spindle_dsl.language.ast import Setting, Spec
from spindle_dsl.language.reporter import Reporter
from spindle_dsl.language.suggest import did_you_mean
from spindle_dsl.language.units import UnitError, bytes_per_second, memory_bytes

DEFAULT_DEVICES = 8
DEFAULT_DEVICE = "A100-80GB"
MAX_DEVICES_PER_NODE = 8
KEYS = (
    "devices",
    "device",
    "devices_per_node",
    "tflops",
    "memory",
    "intra_bandwidth",
    "inter_bandwidth",
)
_LIMITS = {
    "devices": limits.DEVICES,
    "devices_per_node": limits.DEVICES_PER_NODE,
    "peak_flops": limits.TFLOPS,  # checked in TFLOP/s
    "memory": limits.MEMORY,
    "memory_bytes": limits.MEMORY,
    "intra_bandwidth": limits.BANDWIDTH,
    "inter_bandwidth": limits.BANDWIDTH,
    "cores": limits.CORES,
}
_OVERRIDE_KEYS = (
    "devices",
    "devices_per_node",
    "device",
    "peak_flops",
    "memory_bytes",
    "intra_bandwidth",
    "inter_bandwidth",
    "cores",  # command line only: the CPU cores cpu devices share (``Cluster.cores``)
)


def resolve_cluster(spec: Spec, r: Reporter, overrides: dict[str, Any] | None) -> Cluster | None:
    """The cluster the spec and the overrides describe; None after reporting an error."""
    blocks = spec.clusters
    for extra in blocks[1:]:
        r.error(
            "a spec has one cluster block; this is the second",
            extra.loc.head(len("cluster")),
            hint=f"merge it into the cluster block on line {blocks[0].loc.line}",
        )
    fields = _read_block(blocks[0].settings if blocks else (), r)
    cli = _check_overrides(overrides or {}, r)
    if fields is None or cli is None:
        return None
    merged = {**fields, **cli}
    devices = int(merged.get("devices", DEFAULT_DEVICES))
    per_node = int(merged.get("devices_per_node", min(MAX_DEVICES_PER_NODE, devices)))
    base = Cluster(devices, min(per_node, devices), PRESETS[DEFAULT_DEVICE.lower()])
    figures = {k: merged[k] for k in _OVERRIDE_KEYS[2:] if k in merged}
    return base.with_overrides(**figures)


def _read_block(settings: tuple[Setting, ...], r: Reporter) -> dict[str, Any] | None:
    """The cluster block as ``Cluster.with_overrides`` keywords (plus ``devices``)."""
    out: dict[str, Any] = {}
    seen: dict[str, Setting] = {}
    ok = True
    for s in settings:
        key = s.key.name
        if key not in KEYS:
            r.error(f"unknown cluster setting '{key}'{did_you_mean(key, KEYS)}", s.key.loc)
            ok = False
            continue
        if key in seen:
            r.error(f"'{key}' is set twice in the cluster block", s.key.loc)
            ok = False
            continue
        seen[key] = s
        value = _read(key, s, r)
        if value is None:
            ok = False
        else:
            out.update(value)
    if "devices" in out and "devices_per_node" in out and out["devices_per_node"] > out["devices"]:
        r.error(
            f"devices_per_node = {out['devices_per_node']} exceeds devices = {out['devices']}",
            seen["devices_per_node"].loc,
        )
        ok = False
    return out if ok else None


def _read(key: str, s: Setting, r: Reporter) -> dict[str, Any] | None:
    v = s.value
    if key in ("devices", "devices_per_node"):
        n = r.integer(v, key, at=s.loc, limit=_LIMITS[key])
        return None if n is None else {key: n}
    if key == "device":
        name = r.word(v, "device")
        if name is None:
            return None
        if name.lower() not in PRESETS:
            known = [p.name for p in PRESETS.values()]
            r.error(
                f"unknown device preset '{name}'{did_you_mean(name, known)}",
                v.loc,
                hint="known presets: " + ", ".join(known),
            )
            return None
        return {"device": name}
    if key == "tflops":
        tflops = r.positive(v, "tflops (peak TFLOP/s per device)", at=s.loc, limit=limits.TFLOPS)
        return None if tflops is None else {"peak_flops": tflops * 1e12}
    if v.kind != "size":
        example = "80GB" if key == "memory" else "25GB/s"
        r.error(f"{key} needs a unit, as in {key} = {example}; got {v.describe()}", v.loc)
        return None
    if not v.value > 0:
        r.error(f"{key} must be greater than 0, got {v.describe()}", s.loc)
        return None
    try:
        number = float(v.value)
        if key == "memory":
            field, amount = "memory_bytes", memory_bytes(number, v.unit or "")
        else:
            field, amount = key, bytes_per_second(number, v.unit or "")
    except UnitError as exc:
        r.error(str(exc), v.loc)
        return None
    except OverflowError:  # an integer with hundreds of digits
        amount = math.inf
    ok = r.within(amount, f"{key} = {v.describe()}", _LIMITS[key], s.loc)
    return {field: amount} if ok else None


def _check_overrides(overrides: dict[str, Any], r: Reporter) -> dict[str, Any] | None:
    """Command-line overrides (no source location): known keys, values within ``limits``."""
    ok = True
    for key, value in overrides.items():
        flag = "--" + key.replace("_", "-")
        if key not in _OVERRIDE_KEYS:
            r.error(f"unknown cluster override '{key}'{did_you_mean(key, _OVERRIDE_KEYS)}")
            ok = False
        elif key == "device":
            if not isinstance(value, str) or value.lower() not in PRESETS:
                known = [p.name for p in PRESETS.values()]
                r.error(
                    f"unknown device preset '{value}' in --device{did_you_mean(str(value), known)}",
                    hint="known presets: " + ", ".join(known),
                )
                ok = False
        elif key in ("devices", "devices_per_node", "cores"):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                r.error(f"{flag} must be a whole number of at least 1, got {value!r}")
                ok = False
            else:
                ok = r.within(value, flag, _LIMITS[key], None) and ok
        elif isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            r.error(f"cluster override {key} must be a number greater than 0, got {value!r}")
            ok = False
        else:
            number = value / 1e12 if key == "peak_flops" else value
            what = "--tflops" if key == "peak_flops" else f"cluster override {key}"
            ok = r.within(number, what, _LIMITS[key], None) and ok
    return dict(overrides) if ok else None
