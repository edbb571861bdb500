"""Sizes and rates with units, as the cluster block writes them: ``80GB``, ``25GB/s``, ``400Gb/s``.

The two families follow the conventions of the datasheets users copy figures from. Memory is
sized the way GPU vendors size it: an "80GB" A100 has 80 GiB, so GB means 2**30 bytes (and MB,
TB likewise binary; KiB, MiB, GiB, TiB are accepted as synonyms). Link rates are decimal, as
network and NVLink figures are: GB/s is 1e9 bytes per second, and a lowercase b counts bits,
so 400Gb/s (an NDR InfiniBand port) is 50e9 bytes per second.
"""

from __future__ import annotations

_BINARY = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_DECIMAL = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


class UnitError(ValueError):
    """A size whose unit does not fit the setting it is given to."""


def _split(unit: str) -> tuple[str, bool, bool, bool]:
    """(prefix, binary 'i' given, counts bits, is a rate) of a unit such as ``GiB/s``."""
    rate = unit.endswith("/s")
    body = unit[:-2] if rate else unit
    bits = body.endswith("b")
    body = body[:-1]
    binary = body.endswith("i")
    prefix = body[:-1] if binary else body
    return prefix, binary, bits, rate


def memory_bytes(amount: float, unit: str) -> int:
    """Bytes in a memory size such as ``80GB``; raises UnitError for a rate or for bits."""
    prefix, _binary, bits, rate = _split(unit)
    if rate:
        raise UnitError(f"{amount}{unit} is a rate; memory takes a size such as 80GB")
    if bits:
        raise UnitError(f"memory is sized in bytes: write {amount}{prefix}B, not {amount}{unit}")
    return int(amount * _BINARY[prefix])


def bytes_per_second(amount: float, unit: str) -> float:
    """Bytes per second in a rate such as ``25GB/s`` or ``400Gb/s``; raises UnitError for a
    size without ``/s``."""
    prefix, binary, bits, rate = _split(unit)
    if not rate:
        raise UnitError(f"{amount}{unit} is a size; a bandwidth takes a rate such as 25GB/s")
    scale = float(_BINARY[prefix]) if binary else _DECIMAL[prefix]
    return amount * scale / (8 if bits else 1)
