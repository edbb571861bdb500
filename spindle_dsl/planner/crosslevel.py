"""Cross-level improvement: let a MetaOp run as soon as its own inputs are done.

The paper's scheduler finishes a whole MetaLevel before the next starts, so the tail waves of
a level leave devices idle that later MetaOps could already use. ``backfill`` fills those
holes: walking the waves in order, it moves the next layers of a MetaOp whose deps are done
into a wave with idle devices (or extends a MetaOp's entry that ends before its wave does),
never lengthening the wave it fills, and keeps a move only if the sum of wave durations falls.
The result is a valid wave schedule again, so it can seed the global MILP (``milp.py`` with
``precedence=True``) as a warm start.
"""

from __future__ import annotations

from spindle_dsl.planner.problem import EPS, Piece, Problem, Schedule

_PASSES = 4


def _duration(problem: Problem, wave: list[Piece]) -> float:
    return max((p.layers * problem.op(p.op).t(p.n) for p in wave), default=0.0)


class _State:
    """The waves being edited, with each op's later pieces indexed for quick moves."""

    def __init__(self, problem: Problem, waves: list[list[Piece]]):
        self.problem = problem
        self.waves = waves
        self.dur = [_duration(problem, w) for w in waves]

    def index(self) -> tuple[dict[str, list[int]], dict[str, int]]:
        """Wave indices holding each op, in order, and the wave of its last piece."""
        where: dict[str, list[int]] = {}
        for wi, wave in enumerate(self.waves):
            for p in wave:
                where.setdefault(p.op, []).append(wi)
        return where, {op: ws[-1] for op, ws in where.items()}

    def take_front(self, op_id: str, waves_after: list[int], k: int) -> list[tuple[int, int]]:
        """Plan removing the first ``k`` later layers of ``op_id``: (wave, layers taken)."""
        out = []
        for wi in waves_after:
            if k == 0:
                break
            p = next(p for p in self.waves[wi] if p.op == op_id)
            take = min(k, p.layers)
            out.append((wi, take))
            k -= take
        return out

    def gain(self, op_id: str, takes: list[tuple[int, int]]) -> float:
        """How much the later waves shorten if ``takes`` are removed from them."""
        total = 0.0
        for wi, take in takes:
            wave = [
                Piece(p.op, p.first + take, p.end, p.n) if p.op == op_id else p
                for p in self.waves[wi]
            ]
            wave = [p for p in wave if p.layers > 0]
            total += self.dur[wi] - _duration(self.problem, wave)
        return total

    def apply(self, op_id: str, takes: list[tuple[int, int]]) -> None:
        for wi, take in takes:
            wave = [
                Piece(p.op, p.first + take, p.end, p.n) if p.op == op_id else p
                for p in self.waves[wi]
            ]
            self.waves[wi] = [p for p in wave if p.layers > 0]
            self.dur[wi] = _duration(self.problem, self.waves[wi])


def _try_wave(st: _State, w: int) -> bool:
    """Fill wave ``w``'s slack; True if the sum of durations went down."""
    problem = st.problem
    improved = False
    dur = st.dur[w]
    where, last = st.index()
    # 1) extend entries that end before the wave does (same devices, no new entry)
    for j, p in enumerate(list(st.waves[w])):
        op = problem.op(p.op)
        later = [wi for wi in where[p.op] if wi > w]
        left = sum(next(q for q in st.waves[wi] if q.op == p.op).layers for wi in later)
        k = min(left, int((dur - p.layers * op.t(p.n)) / op.t(p.n) + EPS))
        if k <= 0:
            continue
        takes = st.take_front(p.op, later, k)
        if st.gain(p.op, takes) > EPS * dur:
            st.apply(p.op, takes)
            st.waves[w][j] = Piece(p.op, p.first, p.end + k, p.n)
            improved = True
    free = problem.devices - sum(p.n for p in st.waves[w])
    if free <= 0:
        return improved
    # 2) start (or continue) MetaOps whose inputs are done, on the idle devices
    cands = [
        op for op in problem.ops if where[op.id][0] > w and all(last[dep] < w for dep in op.deps)
    ]
    cands.sort(key=lambda o: -problem.height[o.id])
    for op in cands:
        if free <= 0:
            break
        later = where[op.id]
        left = sum(next(q for q in st.waves[wi] if q.op == op.id).layers for wi in later)
        best: tuple[int, int] | None = None
        for n in op.ns:
            if n > free:
                break
            k = min(left, int(dur / op.t(n) + EPS))
            if k >= 1 and (best is None or k > best[1]):
                best = (n, k)
        if best is None:
            continue
        n, k = best
        takes = st.take_front(op.id, later, k)
        nxt = next(q for q in st.waves[later[0]] if q.op == op.id).n
        price = op.switch_s if n != nxt else 0.0
        if st.gain(op.id, takes) > price + EPS * dur:
            first = next(q for q in st.waves[later[0]] if q.op == op.id).first
            st.apply(op.id, takes)
            st.waves[w].append(Piece(op.id, first, first + k, n))
            free -= n
            improved = True
    return improved


def backfill(problem: Problem, sched: Schedule) -> Schedule:
    """Move layers into earlier waves' idle time across MetaLevels (see module docstring)."""
    st = _State(problem, [list(w) for w in sched.waves])
    for _ in range(_PASSES):
        changed = False
        w = 0
        while w < len(st.waves):
            if st.waves[w] and _try_wave(st, w):
                changed = True
                keep = [i for i, x in enumerate(st.waves) if x]
                st.waves = [st.waves[i] for i in keep]
                st.dur = [st.dur[i] for i in keep]
            w += 1
        if not changed:
            break
    waves = tuple(tuple(w) for w in st.waves if w)
    return Schedule(sched.name, waves, sched.status, sched.gap, sched.notes)


def rebalance(problem: Problem, sched: Schedule) -> Schedule:
    """Re-pick each wave's allocations to shorten it, keeping its pieces' layers.

    For fixed layer counts, the min-max allocation is found greedily: every piece starts on
    its smallest allocation and the slowest piece keeps taking its next faster one while it
    fits; when the slowest cannot speed up, no allocation makes the wave shorter. A wave is
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
        alloc = {p.op: ops[p.op].pareto[0] for p in wave}
        k = {p.op: p.layers for p in wave}
        free = problem.devices - sum(alloc.values())
        while True:
            slow = max(alloc, key=lambda i: k[i] * ops[i].t(alloc[i]))
            nxt = ops[slow].next_faster(alloc[slow], alloc[slow] + free)
            if nxt is None:
                break
            free -= nxt - alloc[slow]
            alloc[slow] = nxt
        # pieces the new allocation does not slow past the new duration keep their n
        new = max(k[i] * ops[i].t(alloc[i]) for i in alloc)
        for p in wave:
            room = problem.devices - sum(alloc.values()) + alloc[p.op]
            if p.n != alloc[p.op] and k[p.op] * ops[p.op].t(p.n) <= new and p.n <= room:
                alloc[p.op] = p.n
        old = max(p.layers * ops[p.op].t(p.n) for p in wave)
        added = sum(switches(wi, p.op, alloc[p.op]) - switches(wi, p.op, p.n) for p in wave)
        if sum(alloc.values()) <= problem.devices and new + added < old * (1 - 1e-9):
            out.append(tuple(Piece(p.op, p.first, p.end, alloc[p.op]) for p in wave))
        else:
            out.append(wave)
    return Schedule(sched.name, tuple(out), sched.status, sched.gap, sched.notes)


def improve(problem: Problem, sched: Schedule) -> Schedule:
    """Rebalance the waves, then backfill across levels."""
    return backfill(problem, rebalance(problem, sched))
