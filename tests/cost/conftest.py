"""Build MetaOps by hand so the cost tests do not depend on the spec language."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from spindle_dsl.cluster import PRESETS, Cluster
from spindle_dsl.kinds import get_kind
from spindle_dsl.metagraph import MetaOp


def _build_op(
    kind: str,
    args: dict,
    *,
    batch: int,
    tokens: int,
    layers: int = 1,
    frozen: bool = False,
    needs_backward: bool = True,
    dtype_bytes: int = 2,
    op_id: str = "t/m",
) -> MetaOp:
    k = get_kind(kind)
    resolved = k.resolve(args)
    params = k.layer_params(resolved)
    task, module = op_id.split("/")
    return MetaOp(
        id=op_id,
        task=task,
        module=module,
        segments=((module, layers),),
        kind=kind,
        args=tuple(sorted(resolved.items())),
        layers=layers,
        batch=batch,
        tokens=tokens,
        out_tokens=k.out_tokens(resolved, tokens),
        in_width=k.in_width(resolved),
        out_width=k.out_width(resolved),
        inputs=(),
        level=0,
        frozen=frozen,
        needs_backward=needs_backward,
        forward_flops_per_layer=k.forward_flops(resolved, tokens) * batch,
        params_per_layer=params,
        param_bytes_per_layer=params * dtype_bytes,
    )


@pytest.fixture(scope="session")
def build_op() -> Callable[..., MetaOp]:
    """A MetaOp of one kind with the given batch and tokens, lowered as the contracts say."""
    return _build_op


def _cluster(devices: int, device: str = "a800-80gb", per_node: int = 8) -> Cluster:
    return Cluster(devices=devices, devices_per_node=min(per_node, devices), device=PRESETS[device])


@pytest.fixture(scope="session")
def cluster() -> Callable[..., Cluster]:
    """A cluster of a preset: cluster(devices, device="a800-80gb", per_node=8)."""
    return _cluster
