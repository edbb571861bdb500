"""A plan per phase of a schedule, in one file: the plan bundle (``docs/plan-bundle.md``).

A spec with a ``schedule`` trains a different mix from some steps on, and each mix needs its
own wave plan. The bundle keeps them together as one JSON object, so that a run is started
from one file (``spindle train --plan bundle.json``), written atomically in one piece, and
cannot lose one phase's plan while keeping another's. Each phase's ``plan`` is a complete
plan-format plan: anything that reads plans reads it unchanged, and ``validate_bundle`` checks
each one with ``validate_plan`` plus what the bundle adds (phases from step 0 in increasing
order, one spec, one cluster, each plan made for its phase's mix).
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spindle_dsl.atomic import write_atomic
from spindle_dsl.errors import PlanFormatError
from spindle_dsl.plan.model import Plan, SpecRef
from spindle_dsl.plan.validate import validate_plan

BUNDLE_FORMAT = "spindle-plan-bundle"
BUNDLE_VERSION = 1


@dataclass(frozen=True)
class BundlePhase:
    """From ``first_step`` completed optimizer steps on, the run follows ``plan`` (``mix``)."""

    first_step: int
    mix: str
    plan: Plan


@dataclass(frozen=True)
class PlanBundle:
    """The phases of a scheduled run, each with its plan, by increasing ``first_step``."""

    spec: SpecRef  # the spec's path and hash (``mix`` is None: each phase names its own)
    phases: tuple[BundlePhase, ...]
    # How the bundle was planned (wall time, processes, plans shared by phases); informative.
    planning: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def phase_at(self, step: int) -> BundlePhase:
        """The phase that runs 0-based step ``step``."""
        return [p for p in self.phases if p.first_step <= step][-1]

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": BUNDLE_FORMAT,
            "version": BUNDLE_VERSION,
            "spec": {"path": self.spec.path, "sha256": self.spec.sha256},
            "phases": [
                {"first_step": p.first_step, "mix": p.mix, "plan": p.plan.to_dict()}
                for p in self.phases
            ],
            **({"planning": self.planning} if self.planning else {}),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def write(self, path: str | os.PathLike[str]) -> None:
        write_atomic(Path(path), self.to_json() + "\n")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PlanBundle:
        if d.get("format") != BUNDLE_FORMAT or d.get("version") != BUNDLE_VERSION:
            raise PlanFormatError(
                f"not a {BUNDLE_FORMAT} version {BUNDLE_VERSION} file "
                f"(format={d.get('format')!r}, version={d.get('version')!r})"
            )
        try:
            raw = d["phases"]
            if not isinstance(raw, list) or not raw:
                raise PlanFormatError("malformed plan bundle: 'phases' must be a non-empty list")
            phases = []
            for i, p in enumerate(raw):
                step = p["first_step"]
                if isinstance(step, bool) or not isinstance(step, int):
                    raise PlanFormatError(
                        f"malformed plan bundle: phase {i + 1}'s first_step must be an "
                        f"integer, got {step!r}"
                    )
                try:
                    plan = Plan.from_dict(p["plan"])
                except PlanFormatError as exc:
                    why = "; ".join(d.message for d in exc.diagnostics)
                    raise PlanFormatError(f"phase {i + 1} ({p.get('mix')}): {why}") from None
                phases.append(BundlePhase(step, str(p["mix"]), plan))
            return cls(
                SpecRef(str(d["spec"]["path"]), str(d["spec"]["sha256"]), None),
                tuple(phases),
                dict(d.get("planning", {})),
            )
        except PlanFormatError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise PlanFormatError(f"malformed plan bundle: {type(exc).__name__}: {exc}") from None


def read_plan_file(path: str | os.PathLike[str]) -> Plan | PlanBundle:
    """A plan or a plan bundle, whichever the file holds (by its ``format`` field)."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise PlanFormatError(f"{path}: cannot read plan: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise PlanFormatError(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise PlanFormatError(f"{path}: a plan is a JSON object")
    if data.get("format") == BUNDLE_FORMAT:
        return PlanBundle.from_dict(data)
    return Plan.from_dict(data)


def validate_bundle(bundle: PlanBundle) -> list[str]:
    """Every broken invariant of the bundle and of each phase's plan, one line each."""
    errs: list[str] = []
    steps = [p.first_step for p in bundle.phases]
    if steps[0] != 0:
        errs.append(f"phases: the first phase must start at step 0, not {steps[0]}")
    for a, b in itertools.pairwise(steps):
        if b <= a:
            errs.append(f"phases: first_step {b} does not come after {a}")
    first = bundle.phases[0].plan
    for i, p in enumerate(bundle.phases, start=1):
        name = f"phase {i} ({p.mix}, from step {p.first_step})"
        if p.plan.spec.mix != p.mix:
            errs.append(f"{name}: the plan is for mix {p.plan.spec.mix!r}, not {p.mix!r}")
        if bundle.spec.sha256 and p.plan.spec.sha256 != bundle.spec.sha256:
            errs.append(f"{name}: the plan is for another version of the spec (sha256 differs)")
        if p.plan.cluster != first.cluster:
            errs.append(
                f"{name}: the plan is for {p.plan.cluster.devices} x {p.plan.cluster.device}, "
                f"phase 1's for {first.cluster.devices} x {first.cluster.device}: one run "
                f"keeps its devices"
            )
        errs.extend(f"{name}: {e}" for e in validate_plan(p.plan))
    return errs
