"""tiny_mm trained with tensor-parallel entries, against the single-process oracle (float64).

Every plan here is a planner's plan with the layouts of its MetaOps replaced: each entry of a
kind that splits K-way on at least K devices runs K-way, fewer devices data parallel, so the
language model's MetaOps run K-way in one entry and data parallel in another (a shared module
whose groups use different degrees). The runtime must give the oracle's losses and weights
whatever the degree, the ZeRO stage and the micro-batches, and its checkpoints must resume
under a data-parallel plan.
"""

from __future__ import annotations

import dataclasses

import pytest
from runtime_helpers import checkpoint_state, loss_errors, worst_relative

from spindle_dsl.backends.base import RunConfig
from spindle_dsl.backends.torch import TorchBackend
from spindle_dsl.kinds.tp_split import tp_ok

pytestmark = pytest.mark.slow

STEPS = 4
TOL = 1e-9


def _plan(graph, scheduler: str):
    from spindle_dsl.cost import make_cost_model
    from spindle_dsl.planner import make_plan

    return make_plan(graph, make_cost_model(graph.cluster, tp=1), scheduler=scheduler)


def _with_tp(graph, plan, tp: int, **levers):
    """``plan`` with every entry of a kind that splits ``tp``-way on ``tp`` or more devices
    running ``tp``-way (the plan's other levers replaced by ``levers``)."""

    def layouts(m):
        info = graph.module(m.module)
        if tp_ok(info.kind, dict(info.args), tp) is not None:
            return ()
        return tuple((n, (n // tp, tp)) for n, _ in m.seconds_per_layer if n >= tp)

    ops = tuple(dataclasses.replace(m, layout_per_layer=layouts(m)) for m in plan.metaops)
    return dataclasses.replace(plan, metaops=ops, **levers)


def _degrees(plan) -> set[int]:
    return {plan.layout_of(e)[1] for w in plan.waves for e in w.entries}


def _check(result, root, oracle) -> None:
    history, state = oracle
    assert loss_errors(history, result.steps) < TOL
    worst, where = worst_relative(state, checkpoint_state(root))
    assert worst < TOL, f"{where}: {worst}"


@pytest.mark.parametrize(
    ("scheduler", "tp", "levers"),
    [
        ("sequential", 2, {"zero_stage": 1, "micro_batches": 1}),
        ("sequential", 4, {"zero_stage": 0, "micro_batches": 1}),
        ("sequential", 2, {"zero_stage": 2, "micro_batches": 2}),
        ("default", 2, {"zero_stage": 1, "micro_batches": 1}),
    ],
)
def test_tensor_parallel_plans_train_the_oracle_model(
    tmp_path, tiny_mm_graph, tiny_mm_oracle, scheduler, tp, levers
):
    graph, oracle = tiny_mm_graph, tiny_mm_oracle
    plan = _with_tp(graph, _plan(graph, scheduler), tp, **levers)
    assert tp in _degrees(plan)
    config = RunConfig(steps=STEPS, dtype="float64", checkpoint_dir=str(tmp_path), progress=False)
    _check(TorchBackend().train(graph, plan, config, nproc=4), tmp_path, oracle)


def test_a_tensor_parallel_checkpoint_resumes_under_a_data_parallel_plan(
    tmp_path, tiny_mm_graph, tiny_mm_oracle
):
    graph, oracle = tiny_mm_graph, tiny_mm_oracle
    sequential = _plan(graph, "sequential")
    split = _with_tp(graph, sequential, 2, zero_stage=1)
    first = RunConfig(steps=2, dtype="float64", checkpoint_dir=str(tmp_path), progress=False)
    TorchBackend().train(graph, split, first, nproc=4)
    assert _degrees(sequential) == {1}
    rest = dataclasses.replace(first, steps=STEPS)
    result = TorchBackend().train(graph, sequential, rest, nproc=4)
    assert result.resumed_from == 2
    history, state = oracle
    assert loss_errors(history[2:], result.steps) < TOL
    worst, where = worst_relative(state, checkpoint_state(tmp_path))
    assert worst < TOL, f"{where}: {worst}"
