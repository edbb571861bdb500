"""Memory as a planning decision: micro-batches, ZeRO stage and recompute chosen together.

The memory-model spec (``tests/conftest.py``) on 16 A800s with the device memory cut down
until each lever has to be pulled; the plans must fit, validate, say which levers they pull
and why, and price each lever where it acts.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from spindle_dsl.cost import make_cost_model
from spindle_dsl.cost.analytic import backward_multiplier
from spindle_dsl.cost.step import PieceTime
from spindle_dsl.errors import PlanError, PlanFormatError
from spindle_dsl.language import compile_file, compile_text
from spindle_dsl.plan.model import Plan
from spindle_dsl.plan.validate import validate_plan
from spindle_dsl.planner import make_plan
from spindle_dsl.planner.bound.floors import step_floor
from spindle_dsl.planner.bound.lp_bound import lp_bound
from spindle_dsl.planner.evaluate.build import alone_bytes_of, context, evaluate
from spindle_dsl.planner.model.levers import (
    Levers,
    micro_batch_choices,
    micro_graph,
    pass_curves,
    pass_problem,
    reduction_share,
)
from spindle_dsl.planner.model.problem import Piece, Schedule
from spindle_dsl.planner.search.leversearch import Fit, Judge, LeverSearch
from spindle_dsl.planner.search.make import _lever_notes
from spindle_dsl.planner.search.memfit import memory_floor, memory_room
from spindle_dsl.planner.starts.wavefront import paper_schedule

MiB = 2**20


@pytest.fixture(scope="module")
def graph(memory_spec):
    return compile_text(memory_spec(768)).graph


def with_memory(graph, mib: int):
    return replace(graph, cluster=graph.cluster.with_overrides(memory_bytes=mib * MiB))


def plan_at(graph, mib: int, **kw):
    g = with_memory(graph, mib)
    return g, make_plan(g, make_cost_model(g.cluster), time_limit_s=2.0, **kw)


def levers_of(plan: Plan) -> Levers:
    rc = frozenset(m.id for m in plan.metaops if m.recompute)
    return Levers(plan.micro_batches, plan.zero_stage, rc)


def test_a_plan_that_fits_pulls_no_lever(graph) -> None:
    plan = make_plan(graph, make_cost_model(graph.cluster), time_limit_s=0.3)
    assert levers_of(plan) == Levers()
    assert not any(n.startswith("memory levers") for n in plan.notes)
    assert "recompute" not in json.dumps([m.to_dict() for m in plan.metaops])


def test_a_lever_asked_for_is_said_to_be_asked_for(graph) -> None:
    """A plan that fits without levers, made with one fixed by the caller, does not claim that
    nothing fits without it."""
    plan = make_plan(graph, make_cost_model(graph.cluster), time_limit_s=0.3, zero_stage=0)
    assert plan.zero_stage == 0
    (note,) = [n for n in plan.notes if n.startswith("memory levers")]
    assert "Why: asked for (--zero-stage 0)." in note and "no plan fits" not in note


def test_more_passes_chosen_for_speed_are_not_said_to_be_needed_for_memory(graph) -> None:
    """Where k=1 fits and more passes were kept because they are quicker (qwen_val at 128
    devices plans k=2), the note says so instead of claiming nothing fits without them."""
    search = LeverSearch(graph, make_cost_model(graph.cluster))
    judge = Judge(("paper",), lambda _name, problem: paper_schedule(problem))
    fit = Fit()
    for k in (1, 2):
        fit.record(k, search.trial(Levers(k), judge))
    assert fit.per_k[1].fitting is not None
    (note,) = [n for n in _lever_notes(fit.per_k[2].ctx, fit, {}) if n.startswith("memory")]
    assert "Why: not memory: k=1 fits too" in note and "no plan fits" not in note


def _one_by_one(problem) -> Schedule:
    """Every MetaOp whole on its smallest allocation, one after another: slow, and valid."""
    return Schedule("slow", tuple((Piece(o.id, 0, o.layers, o.ns[0]),) for o in problem.ops))


def test_one_pass_under_zero2_prices_as_zero1_so_the_search_fits_it_once(graph) -> None:
    # at k = 1 ZeRO-2 is ZeRO-1 in every figure priced: the same allocations offered, the
    # same plans, the same memory on every device, with or without recompute ...
    g = with_memory(graph, 300)  # fits at k = 1 with recompute
    judge = Judge(("paper",), lambda name, problem: paper_schedule(problem))
    search = LeverSearch(g, make_cost_model(g.cluster))
    order = [c.op for c in search.candidates(1)]
    assert order
    for j in (0, len(order) // 2, len(order)):
        rc = frozenset(order[:j])
        one, two = search.trial(Levers(1, 1, rc), judge), search.trial(Levers(1, 2, rc), judge)
        assert (one.ctx is None) == (two.ctx is None)
        if one.ctx is None or two.ctx is None:
            continue
        assert one.ctx.problem.ops == two.ctx.problem.ops
        priced = [[(e.iteration_s, e.placement.memory) for e in t.judged] for t in (one, two)]
        assert priced[0] == priced[1]
    # ... so the search fits recompute at k = 1 under ZeRO-1 alone
    fresh = LeverSearch(g, make_cost_model(g.cluster))
    fresh.search(judge)
    tried = set(fresh._contexts)
    assert any(lv.micro_batches == 1 and lv.recompute for lv in tried)
    assert not any(lv.micro_batches == 1 and lv.zero_stage == 2 for lv in tried)


def test_the_judge_places_no_schedule_that_cannot_beat_a_plan_that_fits(graph) -> None:
    """Schedules are judged least compute first, whatever order they are named in; once a
    judged plan fits, a schedule whose compute alone is no quicker is not placed (it could
    change neither the quickest plan nor the quickest or closest to fitting one); where none
    fits, every schedule is."""
    made = {"paper": paper_schedule, "slow": _one_by_one}
    judge = Judge(("slow", "paper"), lambda name, problem: made[name](problem))
    ctx = LeverSearch(graph, make_cost_model(graph.cluster)).context(Levers())
    (paper,) = judge(ctx)
    assert paper.schedule.name == "paper"
    assert paper.fits and _one_by_one(ctx.problem).compute_s(ctx.problem) > paper.iteration_s
    tight = with_memory(graph, 300)  # the paper plan overflows, every layer fits somewhere
    ctx = LeverSearch(tight, make_cost_model(tight.cluster)).context(Levers())
    judged = judge(ctx)
    assert not judged[0].fits and [e.schedule.name for e in judged] == ["paper", "slow"]


@pytest.mark.parametrize("mib", [300, 60, 40])
def test_tight_memory_pulls_levers_and_the_plan_fits(graph, mib) -> None:
    g, plan = plan_at(graph, mib)
    assert validate_plan(plan) == []
    assert max(plan.memory_bytes) <= mib * MiB
    lv = levers_of(plan)
    assert lv != Levers()
    assert all(g.op(i).needs_backward for i in lv.recompute)
    note = next(n for n in plan.notes if n.startswith("memory levers"))
    assert "per number of micro-batches" in note
    if lv.recompute:
        assert all(f"'{i}'" in note for i in lv.recompute)
    # the plan's curves are one pass's curves under its levers (invariant 4 holds on them)
    curves = pass_curves(g, make_cost_model(g.cluster), lv)
    for m in plan.metaops:
        assert m.batch == g.op(m.id).batch  # the plan keeps the whole batch
        for n, s in m.seconds_per_layer:
            assert s == curves[m.id].at(n), (m.id, n)


def test_less_memory_costs_time(graph) -> None:
    plans = [plan_at(graph, mib)[1] for mib in (100000, 150, 40)]
    # each lever pulled costs compute where it acts (recompute: a second forward; micro-
    # batches: k passes of smaller kernels) ...
    compute = [dict(p.breakdown)["compute_s"] for p in plans]
    assert compute[0] < compute[1] < compute[2]
    # ... and the tightest budget costs iteration time. (A middle budget's plan may come out
    # a little faster than the unconstrained one: the schedulers weigh compute, and the
    # optimizer term, here as large as compute, only follows from where placement puts
    # parts, so a different schedule can win it back.)
    times = [p.iteration_s for p in plans]
    assert max(times[0], times[1]) < times[2]


def test_forced_micro_batches_price_one_pass_of_the_micro_batch(graph) -> None:
    cost = make_cost_model(graph.cluster)
    plan = make_plan(graph, cost, time_limit_s=0.3, micro_batches=4, check_memory=False)
    assert plan.micro_batches == 4 and validate_plan(plan) == []
    waves = sum(w.duration_s for w in plan.waves)
    assert dict(plan.breakdown)["compute_s"] == pytest.approx(4 * waves)
    assert plan.iteration_s >= 4 * waves
    micro = micro_graph(graph, 4)
    one = cost.curves(micro)
    for m in plan.metaops:
        op = graph.op(m.id)
        assert micro.op(m.id).batch == -(-op.batch // 4)
        # on one device there is no gradient all-reduce to share out: the micro-batch's time
        assert dict(m.seconds_per_layer).get(1, one[m.id].at(1)) == pytest.approx(one[m.id].at(1))


@pytest.mark.parametrize(("k", "stage"), [(4, 2), (2, 1), (1, 0)])
def test_the_step_model_prices_the_levers_evaluated(graph, k, stage) -> None:
    """One timing path: the step model prices k passes under the setting's ZeRO stage (not
    a default), and the plan's breakdown adds up to its iteration time."""
    cost = make_cost_model(graph.cluster)
    ctx = context(graph, cost, Levers(k, stage))
    assert ctx.step is not None
    ev = evaluate(ctx, paper_schedule(ctx.problem))
    t = ev.timing
    waves = [
        [
            PieceTime(p.op, p.first, p.end, p.devices, p.layers * ctx.problem.op(p.op).t(p.n))
            for p in w
        ]
        for w in ev.placement.waves
    ]
    price = ctx.step.price(waves, micro_batches=k, zero_stage=stage)
    assert t.compute_s == pytest.approx(k * sum(price.durations))
    assert t.loss_s == pytest.approx(k * price.loss_s) and t.optimizer_s == price.optimizer_s
    assert sum(v for _, v in t.breakdown()) == pytest.approx(t.iteration_s)
    plan = make_plan(graph, cost, time_limit_s=0.3, micro_batches=k, zero_stage=stage)
    assert validate_plan(plan) == []
    assert sum(v for _, v in plan.breakdown) == pytest.approx(plan.iteration_s)
    assert {"wave_overhead_s", "loss_s", "optimizer_s"} <= dict(plan.breakdown).keys()


def test_the_lower_bound_is_the_least_over_the_k_tried(graph) -> None:
    """k x the LP of one pass at k (every allocation, the quickest curves at k, the memory
    room at k: recompute where the ops' kept bytes must shrink), least over the k the lever
    search tried that some plan fits: below the plan, whichever levers it pulled."""
    g, plan = plan_at(graph, 60)
    b = plan.extra["bounds"]
    assert plan.micro_batches > 1 and plan.micro_batches in b["micro_batches"]
    assert len(b["micro_batches"]) > 1
    cost = make_cost_model(g.cluster)
    search = LeverSearch(g, cost)
    rooms = {k: memory_room(search, k) for k in b["micro_batches"]}
    fitting = [k for k, r in rooms.items() if r.least_kept() <= r.room]
    assert any(rooms[k].binds() for k in fitting)  # memory shapes the bound here
    offered = {k: rooms[k].either(pass_problem(g, cost, Levers(k))) for k in fitting}
    each = {k: lp_bound(offered[k], k, memory=rooms[k]).lower_bound_s for k in fitting}
    step = cost.step_model(g)
    whole = {}
    for k, lp in each.items():
        f = step_floor(step, k)
        joint = lp_bound(
            offered[k], k, None, f.holder_work, rooms[k], holder_groups=f.holder_groups
        )
        whole[k] = max(lp + f.total_s(k), joint.seconds + f.beside_lp_s(k))
    assert plan.lower_bound_s == pytest.approx(min(whole.values()), rel=1e-9)
    assert b["lp_s"] == pytest.approx(min(each.values()), rel=1e-9)
    assert b["area_path_s"] <= b["lp_s"] * (1 + 1e-9)
    assert plan.lower_bound_s <= plan.iteration_s and validate_plan(plan) == []


@pytest.mark.parametrize("mib", [300, 60, 40, 25])
def test_the_memory_room_holds_every_fitting_plan(graph, mib) -> None:
    """The premise of the memory room: a plan that fits has its devices' peaks summing to
    at least the floor of its recompute set at its k, so its kept bytes fit in the room; and
    the bound it yields stays below the plan whatever levers the plan pulled."""
    g, plan = plan_at(graph, mib)
    lv = levers_of(plan)
    search = LeverSearch(g, make_cost_model(g.cluster))
    floor = search.floor(lv.micro_batches)
    assert sum(plan.memory_bytes) >= floor.total(lv.recompute)
    room = memory_room(search, lv.micro_batches)
    kept = sum(floor.by_op(lv.recompute).values())
    assert kept <= room.room
    assert plan.lower_bound_s <= plan.iteration_s


@pytest.mark.parametrize("mib", [300, 120, 60, 40])
def test_every_entry_runs_on_an_allocation_offered_at_its_k(graph, mib) -> None:
    """The premise of the LP's one-device rule (``planner.search.memfit``): a plan runs each
    MetaOp on an allocation its spec offers at the plan's k without recompute, or with it
    if the MetaOp recomputes (at some ZeRO stage), never on one that one device cannot hold
    where another can."""
    g, plan = plan_at(graph, mib)
    lv = levers_of(plan)
    room = memory_room(LeverSearch(g, make_cost_model(g.cluster)), lv.micro_batches)
    assert room.plain is not None
    for wave in plan.waves:
        for e in wave.entries:
            offered = room.recompute if e.metaop in lv.recompute else room.plain
            assert len(e.devices) in offered[e.metaop].ns, (e.metaop, len(e.devices))


def test_one_device_memory_narrows_the_lp_where_the_room_cannot(graph) -> None:
    """At 120 MiB and k = 2 the MetaOps' kept bytes fit the cluster's room, so the room
    cannot bind, but some MetaOps cannot run on their smallest allocations without
    recompute: the LP over the allocations offered is above the LP over every allocation
    the curves list (what the bound took before), and the plan's bound stays below it."""
    g = with_memory(graph, 120)
    cost = make_cost_model(g.cluster)
    search = LeverSearch(g, cost)
    room = memory_room(search, 2)
    every = pass_problem(g, cost, Levers(2), search.pricing)
    offered = room.either(every)
    assert not room.binds() and offered is not None
    assert any(len(offered.op(o.id).ns) < len(o.ns) for o in every)
    assert lp_bound(offered, 2).seconds > lp_bound(every, 2).seconds * 1.001
    _, plan = plan_at(graph, 120)
    assert plan.lower_bound_s <= plan.iteration_s


def test_micro_graph_carries_the_ceil_split(graph) -> None:
    micro = micro_graph(graph, 5)
    for op, mop in zip(graph.metaops, micro.metaops, strict=True):
        assert mop.batch == -(-op.batch // 5)
        per_sample = op.forward_flops_per_layer / op.batch
        assert mop.forward_flops_per_layer == pytest.approx(per_sample * mop.batch)
        assert mop.params_per_layer == op.params_per_layer
    assert [t.batch for t in micro.tasks] == [-(-t.batch // 5) for t in graph.tasks]
    assert micro_graph(graph, 1) is graph
    assert micro_batch_choices(graph)[:3] == (1, 2, 4)
    largest = max(op.batch for op in graph.metaops)
    assert micro_batch_choices(graph)[-1] >= largest or micro_batch_choices(graph)[-1] == 256


def test_the_gradient_all_reduce_is_shared_out_over_the_passes(graph) -> None:
    """A pass pays 1/k of the all-reduce under ZeRO-1 and (k+1)/2k under ZeRO-2 (a
    reduce-scatter each pass, one all-gather): between the bare and the full curve."""
    cost = make_cost_model(graph.cluster)
    assert reduction_share(Levers(4, 1)) == 0.25
    assert reduction_share(Levers(4, 2)) == 5 / 8
    assert reduction_share(Levers(1, 2)) == 1
    full = cost.curves(micro_graph(graph, 4))
    op = graph.op("caption/lm")
    z1 = pass_curves(graph, cost, Levers(4, 1))[op.id]
    z2 = pass_curves(graph, cost, Levers(4, 2))[op.id]
    for n in (4, 16):
        assert z1.at(n) < z2.at(n) <= full[op.id].at(n) + 1e-15


def test_a_contrastive_task_pays_its_extra_forward_per_micro_batch() -> None:
    text = """
cluster { devices = 4  device = "A800-80GB" }
modality image { tokens = 16 }
modality text  { tokens = 8  vocab = 100 }
encoder vision : vit(layers = 2, hidden = 64, heads = 4, patch = 4) <- image
encoder words  : transformer(layers = 2, hidden = 64, heads = 4) <- text
task match { image -> vision; text -> words; loss = contrastive }
task see   { image -> vision; loss = mse }
mix m { global_batch = 64; match = 1; see = 1 }
"""
    g = compile_text(text).graph
    cost = make_cost_model(g.cluster)
    for k in (2, 4):
        micro = cost.curves(micro_graph(g, k))
        passes = pass_curves(g, cost, Levers(k))
        for op in g.metaops:  # on one device no all-reduce: only the extra forward differs
            extra = 1 + 1 / backward_multiplier(op) if op.task == "match" else 1
            assert passes[op.id].at(1) == pytest.approx(extra * micro[op.id].at(1))


def test_allocations_offered_hold_the_whole_metaop(graph) -> None:
    """With memory enforced, each MetaOp is only offered allocations on which all its
    layers fit alone (its minimum device count), where any does."""
    g = with_memory(graph, 150)
    cost = make_cost_model(g.cluster)
    ctx = context(g, cost, Levers(), enforce=True)
    loose = context(g, cost, Levers(), enforce=False)
    cap = g.cluster.device.memory_bytes
    narrowed = 0
    for op in g.metaops:
        ns = range(1, g.cluster.devices + 1)
        whole = alone_bytes_of(op, g, cost, Levers(), 0, op.layers, ns)
        offered = ctx.problem.op(op.id).ns
        if any(whole[n - 1] <= cap for n in loose.problem.op(op.id).ns):
            assert all(whole[n - 1] <= cap for n in offered), op.id
        narrowed += len(offered) < len(loose.problem.op(op.id).ns)
    assert narrowed


def test_the_floor_ranks_recompute_by_bytes_per_second(graph) -> None:
    g = with_memory(graph, 120)  # 16 x 120 MiB is below what the MetaOps keep in all
    search = LeverSearch(g, make_cost_model(g.cluster))
    floor = memory_floor(g, search.cost)
    assert floor.total(()) > 16 * 120 * MiB >= floor.total(floor.kept)
    ranked = search.candidates(1)
    eff = [c.efficiency for c in ranked]
    assert eff == sorted(eff, reverse=True)
    need, why = search.start(1)
    prefix = [c.op for c in ranked[:need]]
    assert why and floor.total(prefix) <= 16 * 120 * MiB < floor.total(prefix[:-1])


def test_when_nothing_fits_the_error_names_the_levers_and_the_devices(graph) -> None:
    g = with_memory(graph, 20)
    with pytest.raises(PlanError) as err:
        make_plan(g, make_cost_model(g.cluster), scheduler="paper")
    text = str(err.value)
    assert "does not fit" in text and "every memory lever is at its limit" in text
    assert "micro-batches" in text and "ZeRO-2" in text and "recompute" in text
    assert "GiB" in text and "devices of this kind" in text


def test_forced_levers_are_kept_or_the_error_says_they_were_asked(graph) -> None:
    _, plan = plan_at(graph, 60, micro_batches=8, zero_stage=2)
    assert (plan.micro_batches, plan.zero_stage) == (8, 2)
    g = with_memory(graph, 40)
    with pytest.raises(PlanError, match=r"1 micro-batches \(as asked\)"):
        make_plan(g, make_cost_model(g.cluster), micro_batches=1, zero_stage=1)
    with pytest.raises(PlanError, match="micro_batches must be"):
        make_plan(graph, make_cost_model(graph.cluster), micro_batches=0)
    with pytest.raises(PlanError, match="zero_stage must be"):
        make_plan(graph, make_cost_model(graph.cluster), zero_stage=3)


def test_baselines_are_tuned_with_the_same_levers(graph) -> None:
    # budgets this job never reaches: a cold start (the solver process, first imports) can
    # take 70% of a 2 s budget on a slow minute, and the baselines then go untuned
    g = with_memory(graph, 60)
    cost = make_cost_model(g.cluster)
    plan = make_plan(g, cost, time_limit_s=60.0)
    tuned = plan.extra["baseline_levers"]
    assert set(tuned) <= {"sequential", "distmm", "optimus"} and "sequential" in tuned
    seq = make_plan(g, cost, scheduler="sequential", time_limit_s=60.0)
    assert seq.iteration_s == pytest.approx(plan.baseline("sequential_s"))
    assert tuned["sequential"]["micro_batches"] == seq.micro_batches
    assert plan.iteration_s <= plan.baseline("sequential_s") * (1 + 1e-9)
    assert any(n.startswith("baselines tuned with the same levers") for n in plan.notes)


def test_without_the_memory_check_no_lever_is_pulled(graph) -> None:
    _, plan = plan_at(graph, 150, check_memory=False, scheduler="paper")
    assert levers_of(plan) == Levers()
    assert any(n.startswith("memory check off") for n in plan.notes)


def test_a_shared_module_counts_once_per_device(graph) -> None:
    """Sequential runs every MetaOp on all 16 devices: lm's parts are held once each."""
    cost = make_cost_model(graph.cluster)
    plan = make_plan(graph, cost, scheduler="sequential")
    parts: dict[str, tuple[int, int, int, int]] = {}
    kept = loss = working = 0
    for op in graph.metaops:
        sm = cost.slice_memory(graph, op, 16, 0, op.layers)
        parts.update({p.key: (p.replicated, p.sharded, p.grads, p.grads_sharded) for p in sm.parts})
        kept, loss, working = kept + sm.kept, loss + sm.loss, max(working, sm.working)
    state = sum(r + s / 16 for r, s, _, _ in parts.values())
    grads = sum(g for _, _, g, _ in parts.values())
    shards = sum(gs / 16 for _, _, _, gs in parts.values())
    alive = sm.life.peak(kept + loss, grads, shards)
    assert plan.memory_bytes[0] == pytest.approx(state + alive + working, abs=1)
    per_op = sum(cost.slice_memory(graph, op, 16, 0, op.layers).alone(16) for op in graph.metaops)
    assert max(plan.memory_bytes) < per_op - 1  # counting lm once per MetaOp would be more


def test_levers_round_trip_through_the_plan_file(graph, tmp_path) -> None:
    _, plan = plan_at(graph, 40)
    path = tmp_path / "plan.json"
    plan.write(path)
    data = json.loads(path.read_text())
    assert data["micro_batches"] == plan.micro_batches > 1
    back = Plan.read(path)
    assert levers_of(back) == levers_of(plan)
    assert validate_plan(back) == []
    data["metaops"][0]["recompute"] = "yes"
    with pytest.raises(PlanFormatError, match="recompute must be true or false"):
        Plan.from_dict(data)


def test_paper_scale_fixtures_fit_with_levers(spec_dir) -> None:
    spec = spec_dir
    for name, devices in [("qwen_val", 16), ("multitask_clip", 8)]:
        g = compile_file(spec / f"{name}.spindle", cluster_overrides={"devices": devices}).graph
        plan = make_plan(g, make_cost_model(g.cluster), time_limit_s=0.3)
        assert validate_plan(plan) == [], name
        assert levers_of(plan) != Levers(), name
        # the memory room takes part in the bound and keeps it below the plan
        assert plan.lower_bound_s <= plan.iteration_s, name


@pytest.mark.parametrize("guess", [None, 0, 1, 3, 7, 12, 40])
def test_galloping_finds_the_shortest_prefix_from_any_guess(guess) -> None:
    from spindle_dsl.planner.search.leversearch import _first

    for need in range(0, 14):
        asked: list[int] = []

        def ok(j: int, need: int = need, asked: list[int] = asked) -> bool:
            asked.append(j)
            return j >= need

        got = _first(0, 12, ok, guess)
        assert got == (need if need <= 12 else None), (need, guess)
        assert len(set(asked)) <= 10  # galloping, then bisection: a handful of probes


def test_a_room_that_no_plan_fits_leaves_out_every_k_but_the_plans(graph, monkeypatch) -> None:
    """Were the memory floor ever above a fitting plan, the room would call the plan's own
    k infeasible: the bound then leaves the room out at that k instead of reporting an
    infinite bound, and every other k, which it calls infeasible too, is not bounded."""
    import spindle_dsl.planner.search.make as planner

    def nothing_fits(search, k):
        room = memory_room(search, k)
        return replace(room, room=-1.0)

    monkeypatch.setattr(planner, "memory_room", nothing_fits)
    _, plan = plan_at(graph, 60, jobs=0)  # (the bound taken here, where the patch holds)
    assert plan.extra["bounds"]["micro_batches"] == [plan.micro_batches]
    assert 0 < plan.lower_bound_s <= plan.iteration_s


class _Overheads:
    """A cost model whose step is priced from given figures, as a profile's is (the
    collectives priced by the step model itself), everything else the analytic model's."""

    def __init__(self, base, overheads):
        self.base, self.overheads = base, overheads

    def __getattr__(self, name):
        return getattr(self.base, name)

    def step_model(self, graph):
        from spindle_dsl.cost.step import make_step_model

        return make_step_model(graph, self.overheads, grad_in_curves=False)


def _with_step(g, **changes):
    from spindle_dsl.cost.overheads import analytic_overheads

    figures = replace(analytic_overheads(g.cluster), **changes)
    return _Overheads(make_cost_model(g.cluster), figures)


def test_the_optimizer_state_is_replicated_where_it_fits_and_is_quicker(graph) -> None:
    """Step 3 of the search: ZeRO-0 at the best setting, kept only if it fits and is quicker.
    A slow all-gather after the update makes it so; a slow AdamW per byte (every holder then
    updates whole parts) does not."""
    from spindle_dsl.cost.overheads import Collective, Line

    slow_gather = Collective(((2, Line(5e-2, 1e-9)),))
    plan = make_plan(graph, _with_step(graph, all_gather=slow_gather), time_limit_s=0.3)
    assert plan.zero_stage == 0 and validate_plan(plan) == []
    assert any(n.startswith("optimizer state replicated") for n in plan.notes)
    assert not any(n.startswith("memory levers") for n in plan.notes)
    slow_adamw = _with_step(graph, optimizer=Line(1e-4, 1e-6))
    assert make_plan(graph, slow_adamw, time_limit_s=0.3).zero_stage == 1
    # where replicated state does not fit, it is not taken, however slow the gather
    tight = with_memory(graph, 60)
    plan = make_plan(tight, _with_step(tight, all_gather=slow_gather), time_limit_s=0.3)
    assert plan.zero_stage != 0 and validate_plan(plan) == []
