"""Step time of ``spindle train`` against the plain PyTorch a user would write instead.

For each case (a spec on N local processes, gloo, one thread each, float32) it trains the same
model four ways and prints their step times side by side:

- ``DDP``: the spec's whole model as one ``nn.Module`` (every task's path, built from the
  project's own layers, parameters and data by the single-process reference model,
  ``backends/torch/reference.py``) wrapped in ``torch.nn.parallel.DistributedDataParallel``;
  each rank takes a contiguous 1/N of every task's batch, and AdamW steps with the runtime's
  settings (``RunConfig``: lr 1e-3, weight decay 0.01, fused);
- ``FSDP2``: the same module under ``torch.distributed.fsdp.fully_shard`` (each layer part a
  unit, the rest in the root unit), where gloo runs it; where it does not, the table says why;
- ``default`` and ``sequential``: ``spindle train`` with its default plan and with its
  sequential plan (``spindle plan --scheduler X``, then ``spindle train --plan``), on the same
  number of processes, timed from its per-step log (``--log-json``).

The two peers run on worker processes the project's own launcher spawns
(``backends/torch/launch.spawn``: loopback-only rendezvous, no orphans). Every round runs the
four in turn, A B C D, then D C B A, ... (``--repeat R`` rounds), so that a machine whose speed
drifts does not favour one; each run is judged by the median of its steps 2..S (``--steps``),
the table shows each variant's median over the rounds with the spread of the rounds, and a
plan's ratio to DDP is the median of the rounds' ratios. As in the runtime, a peer's step
ends with an all-reduce of its losses, which also lines the ranks up. The first step's losses
of the four must agree (same seed, same samples, no update yet): the table's last column is
the largest relative difference from DDP at step 1. A contrastive task gathers every rank's
embeddings (the rank's own keep their gradient), as a DDP user computes a whole-batch
InfoNCE; gradients are scaled so every variant trains exactly the single-process model.

Below the table, where each variant's step goes (medians over the runs): for the peers their
own timers (data, forward with the losses, backward with DDP's overlapped all-reduce,
optimizer, the closing loss all-reduce), for ``spindle train`` its measured trace's terms.

    .venv/bin/python bench/peer_ddp.py [SPEC ...] [--nproc N] [--steps 8] [--repeat 3]
                                       [--json FILE]

With no SPEC it runs the CPU cases that train on a small machine: the shared cpu_medium spec
on 2 processes and examples/tiny_mm.spindle on 4. A SPEC runs on ``--nproc`` processes (2 by
default), or on N where written ``SPEC@N``.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CASES = (
    (REPO / "tests" / "fixtures" / "spec" / "cpu_medium.spindle", 2),  # the reference workload
    (REPO / "examples" / "tiny_mm.spindle", 4),
)
PEERS = ("ddp", "fsdp")
SCHEDULERS = ("default", "sequential")
VARIANTS = (*PEERS, *SCHEDULERS)
LOSS_RTOL = 1e-5  # float32: the four compute the same first-step losses to rounding
HANG_S = 180.0  # a peer rank without a step for this long has hung (4 ranks on 2 busy cores)


@dataclass(frozen=True)
class Case:
    """A spec trained on ``ranks`` local processes."""

    spec: Path
    ranks: int

    @property
    def name(self) -> str:
        return self.spec.stem


@dataclass(frozen=True)
class Run:
    """One training run of one variant: rank 0's step seconds, each step's losses (the whole
    batch's, per task) and rank 0's median seconds per step phase (steps 2..S)."""

    variant: str
    seconds: tuple[float, ...] = ()
    losses: tuple[tuple[tuple[str, float], ...], ...] = ()
    phases: tuple[tuple[str, float], ...] = ()
    error: str | None = None
    round: int = 0
    wall_s: float = 0.0  # the whole launch that ran it (start-up included; peers share one)

    @property
    def step_s(self) -> float:
        """The median of steps 2..S (of the only step where there is one)."""
        return statistics.median(self.seconds[1:] or self.seconds)


# ---------------------------------------------------------------- the peers, on each rank


def _model_class() -> type:
    """The whole spec as one ``nn.Module`` (made here so the parent need not import torch)."""
    import torch
    import torch.distributed as dist

    from spindle_dsl.backends.torch import losses as L
    from spindle_dsl.backends.torch.parts import Part, head_module

    class SpecModule(torch.nn.Module):
        """Every task's path of the reference model (its parts are this module's children);
        ``forward`` takes each task's rows on this rank and returns (the rank's objective,
        each task's loss share: the shares of all ranks add up to the whole batch's loss)."""

        def __init__(self, ref: Any, rank: int, world: int):
            super().__init__()
            self.parts = ref.store
            self.ref, self.rank, self.world = ref, rank, world

        def forward(self, raws: Mapping[str, Mapping[str, torch.Tensor]]) -> tuple:
            objective, shares = 0.0, {}
            for task in self.ref.tasks:
                raw, acts = raws[task.name], self.ref.forward(task, raws[task.name])
                if task.loss == "contrastive":
                    a, b = (self._gathered(L.readout(acts[s]), task.batch) for s in task.sinks)
                    loss = L.infonce(a, b)
                    shares[task.name] = loss.detach() / self.world
                    objective = objective + self.world * loss  # only own rows carry gradient
                    continue
                if task.loss == "lm":
                    share = sum(
                        L.lm_loss_part(self._head(s), acts[s], raw[L.lm_target(self.ref.graph, s)
                                       .modality], L.lm_target(self.ref.graph, s), task.batch)
                        for s in task.sinks
                    )  # fmt: skip
                else:
                    share = sum(
                        L.mse_loss_part(acts[s], raw[f"target:{s}"], task.batch) for s in task.sinks
                    )
                shares[task.name] = share.detach()
                objective = objective + self.world * share  # DDP and FSDP average gradients
            return objective, shares

        def _head(self, sink: str) -> torch.nn.Module:
            return self.ref.store[Part(head_module(self.ref.graph.op(sink)), "head")]

        def _gathered(self, x: torch.Tensor, batch: int) -> torch.Tensor:
            """The whole batch's rows of ``x`` from every rank, this rank's with their graph."""
            sizes = [hi - lo for lo, hi in (shard(batch, r, self.world) for r in range(self.world))]
            pad = max(sizes) - x.shape[0]
            mine = torch.cat([x.detach(), x.new_zeros(pad, *x.shape[1:])]) if pad else x.detach()
            got = [torch.empty_like(mine) for _ in sizes]
            dist.all_gather(got, mine.contiguous())
            pieces = [
                x if r == self.rank else g[:n]
                for r, (g, n) in enumerate(zip(got, sizes, strict=True))
            ]
            return torch.cat(pieces)

    return SpecModule


def shard(batch: int, rank: int, world: int) -> tuple[int, int]:
    """Rows ``[lo, hi)`` of a batch of ``batch`` that ``rank`` of ``world`` takes."""
    return batch * rank // world, batch * (rank + 1) // world


@dataclass(frozen=True)
class PeerJob:
    """What a peer worker runs: the plain-PyTorch variants ``kinds``, in that order, for
    ``steps`` steps each. Pickled to the workers, which import this file as ``peer_ddp``;
    ``launch.spawn`` calls ``run_rank`` on each and reads ``config.collective_timeout_s``."""

    graph: Any  # MetaGraph
    steps: int
    kinds: tuple[str, ...]
    config: Any  # RunConfig: seed, AdamW settings, collective timeout
    keep_freed: bool = False  # the runtime's allocator settings (``allocator.py``) for the peers

    def run_rank(
        self, rank: int, world: int, local: int, *, store: Any, heartbeat: Callable[[str], None]
    ) -> tuple[Run, ...] | None:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        if self.keep_freed:
            from spindle_dsl.backends.torch.allocator import keep_freed_host_memory

            keep_freed_host_memory()
        heartbeat("joining the process group")
        timeout = timedelta(seconds=self.config.collective_timeout_s)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
        try:
            runs = tuple(self._one(kind, rank, world, heartbeat) for kind in self.kinds)
        finally:
            dist.destroy_process_group()
        return runs if rank == 0 else None

    def _one(self, kind: str, rank: int, world: int, beat: Callable[[str], None]) -> Run:
        """One variant from a fresh model; an error (FSDP2 on a gloo lacking a collective)
        comes back as the run's ``error``."""
        import warnings

        import torch.distributed as dist

        # FSDP2 warns of every unit whose output is a view (an in-place op on it would skip
        # the unit's backward hook): none follows here, and the losses stay DDP's step by step
        warnings.filterwarnings("ignore", message=".*returned a view tensor")
        beat(f"{kind}: building the model")
        try:
            model, opt, ref = self._build(kind, rank, world)
            run = train_peer(kind, model, opt, ref, self.steps, rank, world, beat)
        except Exception as exc:  # every rank fails alike: the same model, the same collectives
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return Run(kind, error=f"{type(exc).__name__}: {first}"[:300])
        dist.barrier()
        return run

    def _build(self, kind: str, rank: int, world: int) -> tuple[Any, Any, Any]:
        from torch.nn.parallel import DistributedDataParallel

        from spindle_dsl.backends.torch import ReferenceModel
        from spindle_dsl.backends.torch.optim import make_optimizer

        c = self.config
        ref = ReferenceModel(self.graph, seed=c.seed, dtype=c.dtype)
        module = _model_class()(ref, rank, world)
        if kind == "ddp":
            model = DistributedDataParallel(module)
        else:
            model = _fully_shard(module, ref, world)
        params = (t for t in model.parameters() if t.requires_grad)
        hyper = dict(lr=c.lr, weight_decay=c.weight_decay, betas=c.betas, eps=c.eps)
        return model, make_optimizer(params, **hyper), ref


def _fully_shard(module: Any, ref: Any, world: int) -> Any:
    """FSDP2: each layer part a unit of its own, the input stages and heads in the root's
    (a tied head reads its input stage's embedding, so the two must be gathered together)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for part in ref.store.parts:
        if part.role.startswith("layer."):
            fully_shard(ref.store[part], mesh=mesh)
    return fully_shard(module, mesh=mesh)


PEER_PHASES = ("data", "forward + losses", "backward", "optimizer", "loss all-reduce")


def train_peer(
    kind: str,
    model: Any,
    opt: Any,
    ref: Any,
    steps: int,
    rank: int,
    world: int,
    beat: Callable[[str], None],
) -> Run:
    """``steps`` steps: this rank's rows of every task, forward, backward, AdamW, then the
    losses summed over the ranks (as the runtime ends a step); rank 0's timings."""
    import torch
    import torch.distributed as dist

    tasks = list(ref.tasks)
    seconds, phases, losses = [], [], []
    for step in range(steps):
        beat(f"{kind}: step {step + 1}")
        marks = [time.perf_counter()]
        raws = {t.name: ref.data.rows(t.name, step, *shard(t.batch, rank, world)) for t in tasks}
        marks.append(time.perf_counter())
        objective, shares = model(raws)
        marks.append(time.perf_counter())
        objective.backward()
        marks.append(time.perf_counter())
        opt.step()
        opt.zero_grad(set_to_none=True)
        marks.append(time.perf_counter())
        totals = torch.stack([shares[t.name].to(torch.float64) for t in tasks])
        dist.all_reduce(totals)
        marks.append(time.perf_counter())
        seconds.append(marks[-1] - marks[0])
        phases.append([b - a for a, b in itertools.pairwise(marks)])
        losses.append(tuple(zip((t.name for t in tasks), totals.tolist(), strict=True)))
    kept = phases[1:] or phases
    medians = tuple(
        (name, statistics.median(p[i] for p in kept)) for i, name in enumerate(PEER_PHASES)
    )
    return Run(kind, tuple(seconds), tuple(losses), medians)


def _importable() -> ModuleType:
    """This file as the module ``peer_ddp``: the workers unpickle the job from it (they take
    this process's ``sys.path``, which then holds ``bench/``)."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    return importlib.import_module("peer_ddp")


def run_peers(case: Case, graph: Any, kinds: Sequence[str], steps: int, keep: bool) -> list[Run]:
    """The peers ``kinds`` in turn on one set of ``case.ranks`` spawned workers."""
    from spindle_dsl.backends.base import RunConfig
    from spindle_dsl.backends.torch.launch import spawn

    config = RunConfig(steps=steps, collective_timeout_s=HANG_S, hang_timeout_s=HANG_S)
    job = _importable().PeerJob(graph, steps, tuple(kinds), config, keep)
    try:
        return list(spawn(job, case.ranks, hang_timeout_s=HANG_S))
    except Exception as exc:  # a worker died: the round's peers have no figures
        text = str(exc).strip().splitlines()[0]
        return [Run(k, error=f"{type(exc).__name__}: {text}") for k in kinds]


# ---------------------------------------------------------------- spindle train, as a user runs it


def spindle(*args: str) -> subprocess.CompletedProcess:
    """One spindle command as a user runs it; stops the bench if it fails."""
    done = subprocess.run(
        [sys.executable, "-m", "spindle_dsl", *args], capture_output=True, text=True, check=False
    )
    if done.returncode:
        sys.exit(f"spindle {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done


def make_plans(case: Case, work: Path) -> dict[str, Path]:
    """The plans ``spindle train`` makes for the case, once: the default and the sequential."""
    plans = {}
    for scheduler in SCHEDULERS:
        plans[scheduler] = work / f"{case.name}-{case.ranks}-{scheduler}-plan.json"
        spindle("plan", str(case.spec), "--devices", str(case.ranks), "--scheduler", scheduler,
                "--out", str(plans[scheduler]), "--quiet")  # fmt: skip
    return plans


TRACE_TERMS = (  # measured trace term -> the name the breakdown shows
    ("compute_s", "layers fwd+bwd"),
    ("transfer_s", "exchanges"),
    ("loss_s", "losses"),
    ("grad_sync_s", "grad reduction"),
    ("optimizer_s", "optimizer"),
)


def run_spindle(case: Case, scheduler: str, plan: Path, steps: int, work: Path, tag: str) -> Run:
    """``spindle train --plan`` of one plan: its logged step seconds and losses, and rank 0's
    trace terms per step (``rank0_terms``)."""
    log, trace = work / f"{tag}.jsonl", work / f"{tag}-trace.json"
    spindle("train", str(case.spec), "--devices", str(case.ranks), "--nproc", str(case.ranks),
            "--steps", str(steps), "--plan", str(plan), "--log-json", str(log),
            "--trace", str(trace), "--no-progress")  # fmt: skip
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    seconds = tuple(float(r["seconds"]) for r in records)
    losses = tuple(tuple((k, float(v)) for k, v in r["loss"].items()) for r in records)
    return Run(scheduler, seconds, losses, rank0_terms(trace))


def rank0_terms(trace: Path) -> tuple[tuple[str, float], ...]:
    """Rank 0's seconds per step in each term of a measured trace (``render.measured`` names
    the categories), and the rest of its step as ``other``: medians of steps 2..S, as the
    peers are timed (rank 0 alone, so a rank's wait for a peer shows in its collectives)."""
    from spindle_dsl.render.measured import TERMS, load_trace

    spans = [e for e in load_trace(trace)["traceEvents"] if e.get("ph") == "X" and e["tid"] == 0]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in spans if e.get("cat") == "step")
    per_step = [dict.fromkeys((*(n for _, n in TRACE_TERMS), "other"), 0.0) for _ in steps]
    names = dict(TRACE_TERMS)
    for e in spans:
        if e.get("cat") in TERMS:
            mid = e["ts"] + e["dur"] / 2
            i = next((i for i, (a, b) in enumerate(steps) if a <= mid <= b), None)
            if i is not None:
                per_step[i][names[TERMS[e["cat"]]]] += e["dur"] / 1e6
    for sums, (a, b) in zip(per_step, steps, strict=True):
        sums["other"] = (b - a) / 1e6 - sum(sums.values())
    kept = per_step[1:] or per_step
    return tuple((n, statistics.median(s[n] for s in kept)) for n in kept[0])


# ---------------------------------------------------------------- rounds, figures and the table


def predicted_steps(plans: dict[str, Path]) -> dict[str, float]:
    """Each plan's predicted step (its ``iteration_s``), as ``spindle train`` prints it."""
    return {k: float(json.loads(p.read_text())["iteration_s"]) for k, p in plans.items()}


def run_case(
    case: Case, plans: dict[str, Path], steps: int, repeat: int, work: Path, keep: bool
) -> list[Run]:
    """``repeat`` rounds of the four variants, in turn, the order reversed every other round
    (the peers of a round share one set of workers); FSDP2 is dropped after it fails."""
    from spindle_dsl.language import compile_file

    graph = compile_file(str(case.spec), cluster_overrides={"devices": case.ranks}).graph
    runs: list[Run] = []
    peers = list(PEERS)
    for r in range(max(1, repeat)):
        order = VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS))
        done: set[str] = set()
        for variant in order:
            if variant in done or (variant in PEERS and variant not in peers):
                continue
            t0 = time.perf_counter()
            if variant in PEERS:
                got = run_peers(case, graph, [k for k in order if k in peers], steps, keep)
            else:
                tag = f"{case.name}-{case.ranks}-{variant}-{r}"
                got = [run_spindle(case, variant, plans[variant], steps, work, tag)]
            wall = time.perf_counter() - t0
            for run in (replace(g, round=r, wall_s=wall) for g in got):
                runs.append(run)
                done.add(run.variant)
                _progress(case, r, run)
                if run.variant == "fsdp" and run.error:
                    peers.remove("fsdp")
    return runs


def _progress(case: Case, r: int, run: Run) -> None:
    what = run.error or f"{run.step_s:.4f} s/step ({run.wall_s:.1f} s launch)"
    print(f"{case.name}@{case.ranks} round {r + 1}: {run.variant:<10} {what}", file=sys.stderr)


@dataclass(frozen=True)
class Row:
    """A case's figures: each variant's step median over rounds with their min and max, each
    plan's median ratio to DDP over the rounds, the first-step loss check."""

    spec: str
    ranks: int
    steps: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    ratios: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    predicted: dict[str, float] = field(default_factory=dict)  # each plan's predicted step
    loss_rel: float = float("nan")  # at step 1
    last_rel: float = float("nan")  # at the last step: after S-1 updates, the runs still agree
    phases: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def losses_agree(self) -> bool:
        return self.loss_rel <= LOSS_RTOL


def summarise(case: Case, runs: Sequence[Run], predicted: dict[str, float]) -> Row:
    ok = [r for r in runs if r.error is None]
    steps, ratios, phases = {}, {}, {}
    for v in VARIANTS:
        mine = [r for r in ok if r.variant == v]
        if mine:
            each = [r.step_s for r in mine]
            steps[v] = (statistics.median(each), min(each), max(each))
            names = [n for n, _ in mine[0].phases]
            phases[v] = {n: statistics.median(dict(r.phases)[n] for r in mine) for n in names}
    ddp = {r.round: r for r in ok if r.variant == "ddp"}
    for v in VARIANTS[1:]:
        each = [r.step_s / ddp[r.round].step_s for r in ok if r.variant == v and r.round in ddp]
        if each:
            ratios[v] = statistics.median(each)
    errors = {r.variant: r.error for r in runs if r.error}
    first, last = _loss_rel(ok, 0), _loss_rel(ok, -1)
    return Row(case.name, case.ranks, steps, ratios, errors, predicted, first, last, phases)


def _loss_rel(runs: Sequence[Run], step: int) -> float:
    """The largest relative difference of a loss at ``step`` (an index) from the first DDP
    run's (or the first run's), over every task and run; nan with fewer than two runs, or
    where the tasks differ."""
    if len(runs) < 2:
        return float("nan")
    base = next((r for r in runs if r.variant == "ddp"), runs[0])
    want = dict(base.losses[step])
    worst = 0.0
    for run in runs:
        got = dict(run.losses[step])
        if got.keys() != want.keys():
            return float("nan")
        worst = max([worst, *(abs(got[t] - w) / max(abs(w), 1e-12) for t, w in want.items())])
    return worst


def _cell(row: Row, v: str) -> str:
    if v not in row.steps:
        return "n/a"
    mid, lo, hi = row.steps[v]
    return f"{mid:.4f} ({lo:.3f}-{hi:.3f})"


def print_table(rows: Sequence[Row], steps: int, repeat: int) -> None:
    print(
        f"\nstep seconds: median over {repeat} round(s) of each run's median of steps "
        f"2..{steps} (min-max of the rounds); /DDP: median of the rounds' ratios"
    )
    print(
        f"{'spec':<14}{'ranks':>6}  {'DDP step s':<24}{'FSDP2 step s':<24}"
        f"{'default step s':<24}{'pred':>7}{'/DDP':>6}  {'sequential step s':<24}{'pred':>7}"
        f"{'/DDP':>6}  losses vs DDP, step 1 (max rel diff)"
    )
    for row in rows:
        ratio = {v: f"{row.ratios[v]:.2f}" if v in row.ratios else "-" for v in SCHEDULERS}
        pred = {v: f"{row.predicted[v]:.3f}" if v in row.predicted else "-" for v in SCHEDULERS}
        check = "ok" if row.losses_agree else "DIFFER"
        print(
            f"{row.spec:<14}{row.ranks:>6}  {_cell(row, 'ddp'):<24}{_cell(row, 'fsdp'):<24}"
            f"{_cell(row, 'default'):<24}{pred['default']:>7}{ratio['default']:>6}  "
            f"{_cell(row, 'sequential'):<24}{pred['sequential']:>7}{ratio['sequential']:>6}  "
            f"{check} ({row.loss_rel:.1e}; step {steps}: "
            f"{row.last_rel:.1e})"
        )
    for row in rows:
        for v, why in row.errors.items():
            label = {"fsdp": "FSDP2", "ddp": "DDP"}.get(v, v)
            print(f"  {row.spec}@{row.ranks}: {label} left out: {why}")


def print_phases(rows: Sequence[Row]) -> None:
    print("\nwhere a step goes (seconds, medians over the runs)")
    for row in rows:
        for v, phases in row.phases.items():
            parts = ", ".join(f"{n} {s:.4f}" for n, s in phases.items())
            print(f"  {row.spec}@{row.ranks} {v:<10} {parts}")


def parse_cases(specs: Sequence[str], nproc: int) -> list[Case]:
    if not specs:
        return [Case(p, n) for p, n in DEFAULT_CASES if p.exists()]
    cases = []
    for s in specs:
        path, _, n = s.rpartition("@") if "@" in s else (s, "", "")
        if n and not n.isdigit():
            sys.exit(f"bad case {s!r}: write SPEC or SPEC@N")
        cases.append(Case(Path(path), int(n) if n else nproc))
    for c in cases:
        if not c.spec.is_file():
            sys.exit(f"no such spec: {c.spec}")
    return cases


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("specs", nargs="*", metavar="SPEC[@N]", help="default: the CPU cases")
    ap.add_argument("--nproc", type=int, default=2, help="processes for a SPEC without @N")
    ap.add_argument("--steps", type=int, default=8, help="steps per run (default 8)")
    ap.add_argument("--repeat", type=int, default=3, metavar="R", help="rounds (default 3)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures and runs as JSON")
    ap.add_argument(
        "--peer-keep-freed",
        action="store_true",
        help="give the peers the runtime's malloc settings (backends/torch/allocator.py)",
    )
    args = ap.parse_args(argv)
    cases = parse_cases(args.specs, args.nproc)
    load = [os.getloadavg()[0]]
    t0 = time.perf_counter()
    rows, every = [], []
    with tempfile.TemporaryDirectory(prefix="peer-ddp-") as work:
        for case in cases:
            plans = make_plans(case, Path(work))
            runs = run_case(case, plans, args.steps, args.repeat, Path(work), args.peer_keep_freed)
            rows.append(summarise(case, runs, predicted_steps(plans)))
            every += [{"spec": case.name, "ranks": case.ranks, **asdict(r)} for r in runs]
    load.append(os.getloadavg()[0])
    print(
        f"\n{len(os.sched_getaffinity(0))} CPU cores, gloo, 1 thread per rank, float32; "
        f"load average {load[0]:.1f} before, {load[1]:.1f} after; "
        f"{time.perf_counter() - t0:.0f} s in all"
    )
    print_table(rows, args.steps, args.repeat)
    print_phases(rows)
    if args.json:
        out = {"load_average": load, "rows": [asdict(r) for r in rows], "runs": every}
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0 if all(r.losses_agree for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
