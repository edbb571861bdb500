"""A fake pipeline for the planning session: counts its calls, fails where a test asks it to.

The real stages are exercised by the widget tests; these fakes pin down the session's own logic
(caching, keeping the last good plan, weight overrides) independently of the planner's figures.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from spindle_dsl.cluster import Cluster, preset
from spindle_dsl.errors import Diagnostic, PlanError, SourceSpan, SpecError
from spindle_dsl.metagraph import MetaGraph, TaskInfo
from spindle_dsl.plan.model import ClusterRef, Plan, SolverInfo, SpecRef
from spindle_dsl.widgets.mixes import MixInfo
from spindle_dsl.widgets.state import Compiled, Pictures, Pipeline, PlanOptions

MIXES = (
    MixInfo("default", 32, (("a", 3.0), ("b", 1.0))),
    MixInfo("even", 32, (("a", 1.0), ("b", 1.0))),
)


@dataclass
class FakeStages:
    """Stage functions that record how often they ran and with what."""

    compiles: list[tuple[str, str | None, dict[str, Any]]] = field(default_factory=list)
    plans: list[tuple[int, str]] = field(default_factory=list)
    draws: int = 0
    refines: list[tuple[int, float]] = field(default_factory=list)
    full_factor: float = 0.8

    def compile(self, text: str, path: str, mix: str | None, overrides: dict[str, Any]):
        self.compiles.append((text, mix, dict(overrides)))
        bad = [
            Diagnostic("error", "this line is wrong", SourceSpan(path, i + 1, 1, 6))
            for i, line in enumerate(text.splitlines())
            if "ERROR" in line
        ]
        if bad:
            raise SpecError(bad, source=text)
        weights = dict(MIXES[0].weights)
        block = re.search(r"mix (\w+) \{\n  global_batch = \d+\n((?:  \w+ = [\d.]+\n)*)\}", text)
        if block and mix == block.group(1):
            weights = {k: float(v) for k, v in re.findall(r"  (\w+) = ([\d.]+)", block.group(2))}
        cluster = Cluster(4, 4, preset("cpu")).with_overrides(**overrides)
        total = sum(weights.values())
        tasks = tuple(
            TaskInfo(t, round(32 * wt / total), wt, "lm", ()) for t, wt in weights.items()
        )
        graph = MetaGraph((), tasks, (), (), cluster, mix or "default", 4, path)
        return Compiled(graph, ("warning: a fake warning",), MIXES)

    def plan(self, graph: MetaGraph, options: PlanOptions) -> Plan:
        n, scheduler = graph.cluster.devices, options.scheduler
        self.plans.append((n, scheduler))
        if n > 100 and options.check_memory:
            raise PlanError(f"{n} devices: the fake planner gives up above 100")
        batch_a = next((t.batch for t in graph.tasks if t.name == "a"), 0)
        it = (1.0 + batch_a / 32) / n
        return Plan(
            spec=SpecRef(graph.spec_path, "", graph.mix),
            cluster=ClusterRef(n, graph.cluster.device.name, graph.cluster.devices_per_node, 1),
            metaops=(),
            waves=(),
            iteration_s=it,
            lower_bound_s=it / 2,
            baselines=(("sequential_s", 2.0 * it),),
            solver=SolverInfo(scheduler, "heuristic", 0.001),
        )

    def refine(self, graph: MetaGraph, options: PlanOptions) -> Plan:
        """The full search: the quick plan times ``full_factor`` (below 1: quicker)."""
        self.refines.append((graph.cluster.devices, options.time_limit_s))
        plan = self.plan(graph, options)
        self.plans.pop()
        return replace(plan, iteration_s=plan.iteration_s * self.full_factor)

    def draw(self, plan: Plan, graph: MetaGraph) -> Pictures:
        self.draws += 1
        tag = f"{plan.cluster.devices}/{plan.iteration_s:.6f}"
        return Pictures(f"<svg>waves {tag}</svg>", f"<svg>timeline {tag}</svg>", "<svg/>")


@pytest.fixture
def fake() -> FakeStages:
    return FakeStages()


@pytest.fixture
def fake_pipeline(fake: FakeStages) -> Pipeline:
    return Pipeline(fake.compile, fake.plan, fake.draw, ("default", "other"))


@pytest.fixture
def refining_pipeline(fake: FakeStages) -> Pipeline:
    """The fake stages with a full search that finds plans ``fake.full_factor`` as long."""
    return Pipeline(fake.compile, fake.plan, fake.draw, ("default", "other"), refine=fake.refine)
