"""Cross-level improvement: let a MetaOp run as soon as its own inputs are done.

The paper's scheduler finishes a whole MetaLevel before the next starts, so the tail waves of
a level leave devices idle that later MetaOps could already use. ``backfill`` fills those
holes: walking the waves in order, it moves the next layers of a MetaOp whose deps are done
into a wave with idle devices (or extends a MetaOp's entry that ends before its wave does),
and keeps a move only if the sum of wave durations falls: what the later waves lose beats
what the filled wave gains (nothing where its pieces split their time alike and each device
has a core; a frozen tower's forward-only piece can lengthen a wave's forward, and on shared
cores, ``Problem.lanes``, every layer added to a wave adds to its work).
The result is a valid wave schedule again, so it can seed the global MILP (``milp.py`` with
``precedence=True``) as a warm start.
"""

from __future__ import annotations

from spindle_dsl.planner.isolate import crash_count
from spindle_dsl.planner.minmax import min_max
from spindle_dsl.planner.passes import ALL_PASSES, PassOptions
from spindle_dsl.planner.problem import (
    EPS,
    OpSpec,
    Piece,
    Problem,
    Schedule,
    piece_wave_seconds,
    wave_seconds,
)
from spindle_dsl.planner.resplit import resplit
from spindle_dsl.planner.solver import SolverChoice

_PASSES = 4


class _State:
    """The waves being edited: per wave a dict op -> piece, per op the waves holding it."""

    def __init__(self, problem: Problem, waves: tuple[tuple[Piece, ...], ...]):
        self.problem = problem
        self.waves: list[dict[str, Piece]] = [{p.op: p for p in w} for w in waves]
        self.dur = [self.duration(w) for w in self.waves]
        self.reindex()

    def duration(self, wave: dict[str, Piece]) -> float:
        return piece_wave_seconds(self.problem, wave.values())

    def reindex(self) -> None:
        self.waves = [w for w in self.waves if w]
        self.dur = [self.duration(w) for w in self.waves]
        self.where: dict[str, list[int]] = {}
        for wi, w in enumerate(self.waves):
            for op in w:
                self.where.setdefault(op, []).append(wi)

    def later(self, op: str, w: int) -> list[int]:
        return [wi for wi in self.where[op] if wi > w]

    def left(self, op: str, waves: list[int]) -> int:
        return sum(self.waves[wi][op].layers for wi in waves)

    def take_front(self, op: str, waves_after: list[int], k: int) -> list[tuple[int, int]]:
        """Plan removing the first ``k`` later layers of ``op``: (wave, layers taken)."""
        out = []
        for wi in waves_after:
            if k == 0:
                break
            take = min(k, self.waves[wi][op].layers)
            out.append((wi, take))
            k -= take
        return out

    def _shrunk(self, op: str, wi: int, take: int) -> dict[str, Piece]:
        p = self.waves[wi][op]
        wave = dict(self.waves[wi])
        if take == p.layers:
            del wave[op]
        else:
            wave[op] = Piece(op, p.first + take, p.end, p.n)
        return wave

    def gain(self, op: str, takes: list[tuple[int, int]]) -> float:
        """How much the later waves shorten if ``takes`` are removed from them."""
        return sum(self.dur[wi] - self.duration(self._shrunk(op, wi, t)) for wi, t in takes)

    def apply(self, op: str, takes: list[tuple[int, int]]) -> None:
        for wi, take in takes:
            self.waves[wi] = self._shrunk(op, wi, take)
            self.dur[wi] = self.duration(self.waves[wi])
            if op not in self.waves[wi]:
                self.where[op].remove(wi)

    def grown(self, w: int, piece: Piece) -> float:
        """How much wave ``w`` lengthens with ``piece`` in it (replacing its op's piece)."""
        return max(0.0, self.duration({**self.waves[w], piece.op: piece}) - self.dur[w])

    def put(self, w: int, piece: Piece) -> None:
        """Put ``piece`` into wave ``w`` (replacing its op's piece there)."""
        if piece.op not in self.waves[w]:
            self.where[piece.op] = sorted([*self.where.get(piece.op, []), w])
        self.waves[w][piece.op] = piece
        self.dur[w] = self.duration(self.waves[w])


def _try_wave(st: _State, w: int) -> bool:
    """Fill wave ``w``'s slack; True if the sum of durations went down."""
    problem = st.problem
    improved = False
    dur = st.dur[w]
    # 1) extend entries that end before the wave does (same devices, no new entry)
    for p in list(st.waves[w].values()):
        op = problem.op(p.op)
        later = st.later(p.op, w)
        k = min(st.left(p.op, later), int((dur - p.layers * op.t(p.n)) / op.t(p.n) + EPS))
        if k <= 0:
            continue
        takes = st.take_front(p.op, later, k)
        longer = Piece(p.op, p.first, p.end + k, p.n)
        if st.gain(p.op, takes) - st.grown(w, longer) > EPS * dur:
            st.apply(p.op, takes)
            st.put(w, longer)
            improved = True
    free = problem.devices - sum(p.n for p in st.waves[w].values())
    if free <= 0:
        return improved
    # 2) start MetaOps whose inputs are done, on the idle devices
    cands = [
        op
        for op in problem.ops
        if st.where[op.id][0] > w and all(st.where[dep][-1] < w for dep in op.deps)
    ]
    cands.sort(key=lambda o: -problem.height[o.id])
    for op in cands:
        if free <= 0:
            break
        later = st.where[op.id]
        left = st.left(op.id, later)
        best: tuple[int, int] | None = None  # (n, layers): most layers, then fewest devices
        for n in op.pareto:
            if n > free:
                break
            k = min(left, int(dur / op.t(n) + EPS))
            if k >= 1 and (best is None or k > best[1]):
                best = (n, k)
        if best is None:
            continue
        n, k = best
        takes = st.take_front(op.id, later, k)
        nxt = st.waves[later[0]][op.id].n
        price = op.switch_s if n != nxt else 0.0
        first = st.waves[later[0]][op.id].first
        new = Piece(op.id, first, first + k, n)
        if st.gain(op.id, takes) - st.grown(w, new) > price + EPS * dur:
            st.apply(op.id, takes)
            st.put(w, new)
            free -= n
            improved = True
    return improved


def backfill(problem: Problem, sched: Schedule) -> Schedule:
    """Move layers into earlier waves' idle time across MetaLevels (see module docstring)."""
    st = _State(problem, sched.waves)
    for _ in range(_PASSES):
        changed = False
        w = 0
        while w < len(st.waves):
            if st.waves[w] and _try_wave(st, w):
                changed = True
                if any(not x for x in st.waves):
                    st.reindex()
            w += 1
        if not changed:
            break
    waves = tuple(tuple(w.values()) for w in st.waves if w)
    return Schedule(sched.name, waves, sched.status, sched.gap, sched.notes)


def rebalance(problem: Problem, sched: Schedule) -> Schedule:
    """Re-pick each wave's allocations to shorten it, keeping its pieces' layers.

    For fixed layer counts, each wave gets the min-max allocation of its pieces (``minmax``:
    the least time within which every piece, on its least allocation ending it so, fits; the
    devices left over go to the piece that ends last, while it can speed up). A wave is
    changed only if the time it saves beats the allocation changes it adds (each one moves
    an op's activations, ``OpSpec.switch_s``).
    """
    prev_n: dict[tuple[int, str], int] = {}  # n of the op's piece before / after wave w
    next_n: dict[tuple[int, str], int] = {}
    last: dict[str, int] = {}
    for wi, wave in enumerate(sched.waves):
        for p in wave:
            if p.op in last:
                prev_n[wi, p.op] = last[p.op]
            last[p.op] = p.n
    last = {}
    for wi in reversed(range(len(sched.waves))):
        for p in sched.waves[wi]:
            if p.op in last:
                next_n[wi, p.op] = last[p.op]
            last[p.op] = p.n

    def switches(wi: int, op: str, n: int) -> float:
        count = (prev_n.get((wi, op), n) != n) + (next_n.get((wi, op), n) != n)
        return count * problem.op(op).switch_s

    out = []
    for wi, wave in enumerate(sched.waves):
        ops = {p.op: problem.op(p.op) for p in wave}
        k = {p.op: p.layers for p in wave}
        least = min_max(list(ops.values()), problem.devices, k)
        if least is None:  # the pieces do not fit side by side at their least allocations
            out.append(wave)
            continue
        alloc = least
        # pieces the new allocation does not slow past the new duration keep their n
        new = _lasts(ops, k, alloc, problem.lanes)
        # pieces alike on cores of their own: the wave is its slowest piece
        alike = len({o.backward_share for o in ops.values()}) <= 1 and problem.lanes is None
        for p in wave:
            room = problem.devices - sum(alloc.values()) + alloc[p.op]
            if p.n == alloc[p.op] or p.n > room:
                continue
            if alike:  # the wave is its slowest piece: a piece within it keeps it
                keeps = k[p.op] * ops[p.op].t(p.n) <= new
            else:
                keeps = _lasts(ops, k, {**alloc, p.op: p.n}, problem.lanes) <= new
            if keeps:
                alloc[p.op] = p.n
        old = piece_wave_seconds(problem, wave)
        added = sum(switches(wi, p.op, alloc[p.op]) - switches(wi, p.op, p.n) for p in wave)
        shorter = new < old * (1 - 1e-9) and new + added < old * (1 - 1e-9)
        if sum(alloc.values()) <= problem.devices and shorter:
            out.append(tuple(Piece(p.op, p.first, p.end, alloc[p.op]) for p in wave))
        else:
            out.append(wave)
    return Schedule(sched.name, tuple(out), sched.status, sched.gap, sched.notes)


def improve(
    problem: Problem,
    sched: Schedule,
    time_limit_s: float = 0.1,
    solver: SolverChoice | None = None,
    passes: PassOptions = ALL_PASSES,
) -> Schedule:
    """Re-split layers, rebalance the waves, backfill across levels, re-split again (not if
    the first re-split's solver crashed: see ``isolate.crash_count``). ``passes`` may switch
    the re-splits or the backfill off."""
    half = time_limit_s / 2 if passes.resplit else 0.0  # resplit with no time: unchanged
    crashes = crash_count()
    s = rebalance(problem, resplit(problem, sched, half, solver))
    second = half if crash_count() == crashes else 0.0
    return resplit(problem, backfill(problem, s) if passes.backfill else s, second, solver)


def _lasts(
    ops: dict[str, OpSpec], layers: dict[str, int], alloc: dict[str, int], lanes: int | None
) -> float:
    """How long a wave of these ops' pieces (``layers`` each, on ``alloc``) lasts."""
    return wave_seconds(((ops[i], layers[i] * ops[i].t(alloc[i]), alloc[i]) for i in alloc), lanes)
