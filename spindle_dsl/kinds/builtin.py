"""The built-in kinds: importing this module registers all four.

``get_kind`` imports it on first use. Each kind lives in its own module; none imports torch at
module level (the PyTorch layers in ``layers.py`` load only when a layer is built), so the
checker and the planner stay cheap to start.
"""

from spindle_dsl.kinds.mlp import MlpKind
from spindle_dsl.kinds.resampler import ResamplerKind
from spindle_dsl.kinds.transformer import TransformerKind, VitKind

BUILTIN_KINDS = (TransformerKind, VitKind, MlpKind, ResamplerKind)

__all__ = ["BUILTIN_KINDS", "MlpKind", "ResamplerKind", "TransformerKind", "VitKind"]
