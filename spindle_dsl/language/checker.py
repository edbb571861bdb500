"""Check a parsed spec and resolve it: names, values, kinds, graphs, batches and mixes.

Checks run in dependency order (names, cluster, modalities, modules, tasks, mixes, schedule,
the train block, batches),
each reporting into one ``Reporter`` and passing on only what resolved, so the user sees every
independent error of the file in one run, in source order, followed by the warnings. The
result, a ``Checked``, exists only for a spec with no errors.
"""

from __future__ import annotations

from typing import Any

from spindle_dsl.language.ast import (
    Decl,
    Ident,
    MixDecl,
    ModalityDecl,
    ModuleDecl,
    Spec,
    TaskDecl,
)
from spindle_dsl.language.check_cluster import resolve_cluster
from spindle_dsl.language.check_hf import DataContext, check_data
from spindle_dsl.language.check_mixes import Mix, resolve_mixes
from spindle_dsl.language.check_modules import (
    check_tied_embeddings,
    resolve_modalities,
    resolve_modules,
)
from spindle_dsl.language.check_schedule import SchedulePhase, resolve_schedule
from spindle_dsl.language.check_tasks import Names, TaskChecker, TaskDraft
from spindle_dsl.language.check_train import resolve_train
from spindle_dsl.language.reporter import Reporter
from spindle_dsl.language.resolved import Checked, ResolvedPhase, ResolvedTask
from spindle_dsl.language.suggest import did_you_mean


def check(
    spec: Spec,
    *,
    mix: str | None = None,
    cluster_overrides: dict[str, Any] | None = None,
    train_overrides: dict[str, Any] | None = None,
) -> Checked:
    """Resolve ``spec``; raises ``SpecError`` with every error (and the warnings) found.
    ``train_overrides``: ``TrainSettings`` fields the command line sets over the train block.

    With a ``schedule`` the run follows it and the selected mix is its first phase's; naming a
    ``mix`` picks that one mix instead and leaves the schedule aside (the input stages are
    still sized for every phase, so the parameters are the same either way)."""
    r = Reporter(spec.path, spec.source)
    nodes = _unique(spec.modalities + spec.modules, r)
    tasks: list[TaskDecl] = _unique(spec.tasks, r)  # type: ignore[assignment]
    mix_decls: list[MixDecl] = _unique(spec.mixes, r)  # type: ignore[assignment]
    modality_decls = [d for d in nodes if isinstance(d, ModalityDecl)]
    module_decls = [d for d in nodes if isinstance(d, ModuleDecl)]

    cluster = resolve_cluster(spec, r, cluster_overrides)
    modalities = resolve_modalities(modality_decls, r)
    modality_names = {d.name.name for d in modality_decls}
    modules = resolve_modules(module_decls, r, modalities, modality_names)
    names = Names(
        frozenset(modality_names),
        frozenset(d.name.name for d in module_decls),
        frozenset(t.name.name for t in tasks),
        modalities,
        modules,
    )
    checker = TaskChecker(r, names)
    drafts = [checker.check(t) for t in tasks]
    check_tied_embeddings(modules, _modality_reads(drafts, modalities), modalities, r)
    _check_data(drafts, modalities, modules, modality_decls, module_decls, r)
    mixes = resolve_mixes(mix_decls, r, [t.name.name for t in tasks])
    schedule = resolve_schedule(spec.schedules, r, mixes)
    train = resolve_train(spec, r, train_overrides)
    follow = schedule if mix is None else ()
    selected = _select_mix(mix if not follow else follow[0].mix, mixes, r)
    batches = _batches(drafts, selected, mixes, r, scheduled=bool(follow))
    phase_batches = _phase_batches(drafts, schedule, mixes, r)
    if not checker.unknown_names:
        _warn_unused(spec, drafts, r)
    _check_some_samples(tasks, drafts, batches, selected, r)
    r.raise_if_errors()
    assert cluster is not None, "a cluster that failed to resolve reports an error"
    assert train is not None, "train settings that failed to resolve report an error"
    phases = tuple(
        ResolvedPhase(p.first_step, p.mix, _resolved(drafts, phase_batches[p.mix], mixes[p.mix]))
        for p in follow
    )
    most = _largest_batches(phase_batches)
    return Checked(
        spec=spec,
        cluster=cluster,
        modalities=tuple(modalities[d.name.name] for d in modality_decls),
        modules=tuple(modules[d.name.name] for d in module_decls),
        tasks=_resolved(drafts, batches, mixes.get(selected) if selected else None),
        mix=selected,
        warnings=tuple(r.sorted("warning")),
        phases=phases,
        sizing_tasks=_resolved(drafts, most, None),
        train=train,
    )


def _modality_reads(drafts: list[TaskDraft], modalities: dict[str, Any]) -> dict[str, set[str]]:
    """The modalities each module reads directly (by module name), from the tasks' edges:
    what tied embeddings are checked against."""
    reads: dict[str, set[str]] = {}
    for t in drafts:
        for e in t.edges:
            if e.from_modality and e.source in modalities:
                reads.setdefault(e.target, set()).add(e.source)
    return reads


def _check_data(
    drafts: list[TaskDraft],
    modalities: dict[str, Any],
    modules: dict[str, Any],
    modality_decls: list[ModalityDecl],
    module_decls: list[ModuleDecl],
    r: Reporter,
) -> None:
    """Check the data against what Hugging Face configs fix, and the stages that add
    tokens, reporting into ``r``."""
    check_data(
        DataContext(
            modules,
            modalities,
            {d.name.name: d for d in modality_decls},
            {d.name.name: d for d in module_decls},
            tuple((t.name, tuple(t.edges)) for t in drafts),
        ),
        r,
    )


def _check_some_samples(
    tasks: list[TaskDecl],
    drafts: list[TaskDraft],
    batches: dict[str, int],
    selected: str | None,
    r: Reporter,
) -> None:
    """Report a spec with no task, or (when nothing else is wrong) one whose selected mix
    gives no task any samples: there would be nothing to train."""
    if not tasks:
        r.error("the spec declares no task", hint="add one: task NAME { text -> lm; batch = 8 }")
    elif not r.has_errors and not any(batches.get(t.name, 0) > 0 for t in drafts):
        r.error(f"no task gets any samples under mix '{selected}'")


def _largest_batches(phase_batches: dict[str, dict[str, int]]) -> dict[str, int]:
    """Each task's largest batch over the phases' mixes: what the input stages are sized
    for, so the parameters are the same whichever phase runs."""
    most: dict[str, int] = {}
    for per_task in phase_batches.values():
        for task, batch in per_task.items():
            most[task] = max(most.get(task, 0), batch)
    return most


def _resolved(
    drafts: list[TaskDraft], batches: dict[str, int], mix: Mix | None
) -> tuple[ResolvedTask, ...]:
    """The tasks that get samples under ``batches``, resolved (declaration order)."""
    weights = dict(mix.weights) if mix is not None else {}
    return tuple(
        ResolvedTask(
            name=t.name,
            modules=tuple(t.modules),
            edges=tuple(t.edges),
            sinks=tuple(t.sinks),
            loss=_known(t.loss),
            batch=batches[t.name],
            weight=weights.get(t.name),
            loc=t.decl.name.loc,
            data=t.data,
            eval_data=t.eval_data,
        )
        for t in drafts
        if batches.get(t.name, 0) > 0
    )


def _known(loss):
    assert loss is not None, "a task without a loss reports an error"
    return loss


def _describe(d: Decl) -> str:
    if isinstance(d, ModuleDecl):
        return d.keyword if d.keyword != "shared" else "shared module"
    return {ModalityDecl: "modality", TaskDecl: "task", MixDecl: "mix"}[type(d)]


def _unique(decls: list, r: Reporter) -> list:
    """The first declaration of each name; a later one is an error at its name."""
    first: dict[str, Decl] = {}
    for d in sorted(decls, key=lambda d: (d.loc.line, d.loc.column)):
        name: Ident = d.name
        if name.name in first:
            earlier = first[name.name]
            r.error(
                f"duplicate name '{name.name}': already declared as {_describe(earlier)} "
                f"on line {earlier.name.loc.line}",
                name.loc,
                hint="rename one of them",
            )
        else:
            first[name.name] = d
    return list(first.values())


def _select_mix(wanted: str | None, mixes: dict[str, Mix | None], r: Reporter) -> str | None:
    """The mix named on the command line, else the first in the file, else None."""
    if wanted is None:
        return next(iter(mixes), None)
    if wanted not in mixes:
        listed = ", ".join(mixes) if mixes else "none"
        r.error(
            f"unknown mix '{wanted}'{did_you_mean(wanted, mixes)}",
            hint=f"the spec's mixes: {listed}",
        )
        return None
    return wanted


def _batches(
    drafts: list[TaskDraft],
    selected: str | None,
    mixes: dict[str, Mix | None],
    r: Reporter,
    *,
    scheduled: bool = False,
) -> dict[str, int]:
    """Each task's batch: from the selected mix, or from its own ``batch`` without mixes.
    ``scheduled``: the mix is a schedule's first phase, where leaving a task out is a plan
    (``_phase_batches`` warns about tasks that no phase trains instead)."""
    if not mixes:
        out: dict[str, int] = {}
        for t in drafts:
            if t.batch is not None:
                out[t.name] = t.batch
            elif t.batch_setting is None:
                r.error(
                    f"task '{t.name}' needs a batch: the spec has no mix",
                    t.decl.name.loc,
                    hint="add 'batch = N' to the task, or a mix that lists it",
                )
        return out
    chosen = mixes.get(selected) if selected is not None else None
    if chosen is None:
        return {}  # the mix is unknown or has errors, reported already
    batches = chosen.batches()
    for t in drafts:
        if t.batch_setting is not None:
            r.warning(
                f"batch of task '{t.name}' is ignored: mix '{chosen.name}' sets the batches",
                t.batch_setting.loc,
            )
        if t.name not in batches:
            if scheduled:
                continue
            r.warning(
                f"task '{t.name}' is not in mix '{chosen.name}': it gets no samples",
                t.decl.name.loc,
            )
        elif batches[t.name] == 0:
            r.warning(
                f"task '{t.name}' gets 0 of the {chosen.global_batch} samples of mix "
                f"'{chosen.name}' and is left out",
                t.decl.name.loc,
                hint="raise its weight or the global batch",
            )
    return batches


def _phase_batches(
    drafts: list[TaskDraft],
    schedule: tuple[SchedulePhase, ...],
    mixes: dict[str, Mix | None],
    r: Reporter,
) -> dict[str, dict[str, int]]:
    """Each scheduled mix's batches; warns about a task that no phase gives samples to, and
    reports a phase in which no task gets any."""
    out: dict[str, dict[str, int]] = {}
    for p in schedule:
        chosen = mixes.get(p.mix)
        if chosen is None or p.mix in out:
            continue
        out[p.mix] = chosen.batches()
        if not any(out[p.mix].values()):
            r.error(
                f"no task gets any samples under mix '{p.mix}' (schedule step {p.first_step})",
                p.loc,
            )
    if schedule and len(out) == len({p.mix for p in schedule}):
        for t in drafts:
            if not any(b.get(t.name, 0) > 0 for b in out.values()):
                r.warning(
                    f"task '{t.name}' is in no phase of the schedule: it never trains",
                    t.decl.name.loc,
                    hint="give it a weight in a mix the schedule uses, or remove it",
                )
    return out


def _warn_unused(spec: Spec, drafts: list[TaskDraft], r: Reporter) -> None:
    """Modalities and modules no task uses; ``shared`` modules that only one task uses."""
    used_by: dict[str, list[str]] = {}
    for t in drafts:
        for name in t.refs:
            used_by.setdefault(name, []).append(t.name)
    for d in spec.modalities:
        if d.name.name not in used_by:
            r.warning(f"modality '{d.name.name}' is not used by any task", d.name.loc)
    for d in spec.modules:
        users = used_by.get(d.name.name, [])
        if not users:
            r.warning(f"{d.keyword} '{d.name.name}' is not used by any task", d.name.loc)
        elif d.keyword == "shared" and len(users) == 1:
            r.warning(
                f"shared module '{d.name.name}' is used only by task '{users[0]}'",
                d.name.loc,
                hint="'shared' says several tasks use it; write 'module' for one task",
            )
