"""Module kinds: one class per layer type, with its shapes, costs and PyTorch layers."""

from spindle_dsl.kinds.base import REQUIRED, ArgSpec, Kind, get_kind, kind_names, register_kind

__all__ = ["REQUIRED", "ArgSpec", "Kind", "get_kind", "kind_names", "register_kind"]
