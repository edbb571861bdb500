"""Bytes per device to train a slice of a MetaOp: parameters, gradients, optimizer state and
the activations kept for backward.

Training precision follows the contracts: on GPUs mixed precision with Adam (bf16 parameters
and gradients, fp32 master weights and Adam m and v: 2 + 2 + 4 + 4 + 4 = 16 bytes per trainable
parameter, 2 per frozen one); on the ``cpu`` preset plain fp32 (4 params + 4 grads + 8 Adam =
16 per trainable parameter, 4 per frozen one). Tensor parallelism divides parameters and, with
sequence parallelism, activations by its degree; data parallelism divides the batch.
"""

from __future__ import annotations

from spindle_dsl.cluster import Cluster
from spindle_dsl.cost.comm import ceil_div, is_cpu
from spindle_dsl.kinds import get_kind
from spindle_dsl.metagraph import MetaOp


def dtype_bytes(cluster: Cluster) -> int:
    """Bytes per parameter/activation element at the training dtype (fp32 on cpu, else bf16)."""
    return 4 if is_cpu(cluster) else 2


def state_bytes_per_param(cluster: Cluster, trainable: bool) -> int:
    """Parameter + gradient + optimizer bytes per parameter (see the module docstring)."""
    if trainable:
        return 16
    return 4 if is_cpu(cluster) else 2


def activation_elements_per_sample(op: MetaOp) -> float:
    """One layer's saved activations for one sample, as the op's kind counts them."""
    return get_kind(op.kind).activation_elements(dict(op.args), op.tokens)


def slice_memory_bytes(op: MetaOp, layers: int, dp: int, tp: int, cluster: Cluster) -> int:
    """Peak bytes on one device running ``layers`` layers of ``op`` with ``dp`` data-parallel
    replicas of ``tp``-way tensor-parallel layers.

    Without a backward pass only one layer's activations are alive at a time; with one, every
    layer's are kept until its backward runs.
    """
    states = op.params_per_layer * layers * state_bytes_per_param(cluster, not op.frozen) / tp
    per_device_batch = ceil_div(op.batch, dp)
    kept_layers = layers if op.needs_backward else min(layers, 1)
    activations = (
        activation_elements_per_sample(op)
        * dtype_bytes(cluster)
        * per_device_batch
        * kept_layers
        / tp
    )
    return int(states + activations)
