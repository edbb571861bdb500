"""The smallest and largest value each number in a spec may take, and why, in one table.

A spec describes a real training job, so every number is checked against what such a job can
have: no model has 10^11 layers, no cluster 10^11 devices. The bounds are generous (several
times the largest figure published for real jobs) and each says why it is where it is. Within
them every derived figure stays far from any numeric edge: a MetaOp's FLOPs or bytes are at
most about 2^100 (a float is finite up to 2^1024; integer byte counts are Python ints, and
numpy only ever holds device ids and float64 byte counts), so whatever passes the checker
compiles and plans without overflow or NaN. The planner's cost does not grow with these
magnitudes (see ``cost.allocations``); the device limit is the scale it is measured at.

Kind arguments are bounded by name (``hidden`` is a width whatever kind takes it), so kinds
added later, built in or registered by users, get the right bounds for the names they share
with the built-in kinds; any other numeric argument gets the generic bound of its type. A
user kind may register a bound for its own argument names with ``register_arg_limit``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal


@dataclass(frozen=True)
class Limit:
    """``low <= value <= high`` for a number of a spec; ``reason`` says why ``high`` is
    the bound (``low`` is the least value that means anything)."""

    low: float
    high: float
    reason: str
    unit: str = ""  # appended to the bounds in messages
    scale: float = 1.0  # the value in messages is divided by this (bytes shown as GiB...)

    def _show(self, x: float) -> str:
        v = Decimal(x) / Decimal(self.scale)  # exact for any integer a spec can hold
        if v == v.to_integral_value() and abs(v) < Decimal(10) ** 15:
            return f"{int(v):,}{self.unit}"
        return f"{float(v):.6g}{self.unit}" if abs(v) < Decimal(10) ** 300 else f"{v:.3E}"

    def problem(self, value: float, what: str, lower: bool = True) -> str | None:
        """Why ``value`` is out of bounds, or None; ``what`` names it for the message.
        ``lower=False`` checks the upper bound only (a kind states its own minimums)."""
        if isinstance(value, float) and not math.isfinite(value):
            return f"{what} must be a finite number, got {value}"
        if lower and value < self.low:
            return f"{what} must be at least {self._show(self.low)}, got {self._show(value)}"
        if value > self.high:
            return (
                f"{what} must be at most {self._show(self.high)}, got {self._show(value)}: "
                f"{self.reason}"
            )
        return None


GiB = 2**30
TiB = 2**40

DEVICES = Limit(
    1,
    65_536,
    "no training job is planned over more devices (the largest published ones use 16,384 "
    "GPUs); this planner is built and measured up to 2^16",
)
DEVICES_PER_NODE = Limit(
    1,
    1024,
    "a node is the devices one fast interconnect joins: 8 in most servers, 72 in the "
    "largest NVLink racks",
)
CORES = Limit(
    1,
    4096,
    "the CPU cores one node's cpu devices share (--cores): the largest servers have a few hundred",
)
TFLOPS = Limit(
    0.001,
    100_000,
    "100 PFLOP/s per device is over ten times the fastest accelerator's dense peak",
    " TFLOP/s",
)
MEMORY = Limit(
    2**20,
    16 * TiB,
    "a GPU carries a few hundred GB and the largest hosts 16 TiB of RAM",
    " GiB",
    GiB,
)
BANDWIDTH = Limit(
    1e6,
    1e14,
    "100 TB/s per device is over 50 times the fastest link (NVLink 5: 1.8 TB/s)",
    " GB/s",
    1e9,
)
TOKENS = Limit(
    1,
    2**20,
    "the longest sequences models train on are about a million tokens",
)
FEATURES = Limit(
    1,
    2**16,
    "raw features per token (mel bins, sensor channels, a patch's pixels) number in the "
    "thousands at most",
)
VOCAB = Limit(
    1,
    2**22,
    "the largest vocabularies in use have about 256,000 entries",
)
BATCH = Limit(
    1,
    2**24,
    "the largest batches trained (contrastive pretraining) are about a million samples",
)
WEIGHT = Limit(
    1e-6,
    1e6,
    "mix weights are relative shares: beyond 10^12 between two tasks one of them gets nothing",
)
LAYERS = Limit(1, 4096, "the deepest transformers trained have about 1,000 layers")
WIDTH = Limit(
    1,
    2**17,
    "the widest models are about 20,000 wide (PaLM 18,432, Megatron-Turing 20,480)",
)
FFN = Limit(1, 2**19, "a feed-forward layer is a few times its model's width (4 x 2^17 at most)")
HEADS = Limit(1, 1024, "the widest models use about 128 attention heads")
PATCH = Limit(1, 1024, "image patches are 8 to 32 pixels a side; 1,024 is a whole large image")
GENERIC_INT = Limit(1, 2**24, "no count or size of one layer comes near 2^24")
GENERIC_FLOAT = Limit(
    -1e12, 1e12, "a real-valued layer argument is a rate or a scale, far below 10^12"
)

# Kind arguments by name: the same name means the same thing in every kind.
_ARGS: dict[str, Limit] = {
    "layers": LAYERS,
    "hidden": WIDTH,
    "in": WIDTH,
    "out": WIDTH,
    "width": WIDTH,
    "ffn": FFN,
    "heads": HEADS,
    "kv_heads": HEADS,
    "patch": PATCH,
    "out_tokens": TOKENS,
    "vocab": VOCAB,
}


def register_arg_limit(name: str, limit: Limit) -> None:
    """Bound a kind argument called ``name`` (for a user kind's own argument names)."""
    _ARGS[name] = limit


def arg_limit(name: str, value: object) -> Limit | None:
    """The bound of a kind argument by its name and the type of its value (None for a
    bool or a string, which have no magnitude)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if name in _ARGS:
        return _ARGS[name]
    return GENERIC_INT if isinstance(value, int) else GENERIC_FLOAT


def table() -> list[tuple[str, Limit]]:
    """Every named bound, for documentation and tests."""
    named = [
        ("devices", DEVICES),
        ("devices_per_node", DEVICES_PER_NODE),
        ("--cores", CORES),
        ("tflops", TFLOPS),
        ("memory", MEMORY),
        ("intra_bandwidth, inter_bandwidth", BANDWIDTH),
        ("tokens, text[N], out_tokens", TOKENS),
        ("features", FEATURES),
        ("vocab", VOCAB),
        ("batch, global_batch", BATCH),
        ("mix weights", WEIGHT),
    ]
    args = [(f"kind argument {k}", v) for k, v in _ARGS.items() if v not in (TOKENS, VOCAB)]
    return [
        *named,
        *args,
        ("other int kind arguments", GENERIC_INT),
        ("other float", GENERIC_FLOAT),
    ]
