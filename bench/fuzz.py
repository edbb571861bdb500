"""Mutation fuzzer: compile and plan mutated specs; report tracebacks and slow cases.

    .venv/bin/python bench/fuzz.py --minutes 6 [--seed S] [--slow 30] [SPEC...]

The recipe: each case takes a seed spec and applies one to three mutations: a number
set to one of 0, 1, -1, 2, 3, 7, 65536, 1000000, 99999999999, 0.5 or 1e9 (the digits of a size
such as ``80GB`` too), or a token deleted, duplicated or swapped with another; and, since most
of those end at the checker, a number scaled by a power of two from 1/8 to 1024 (mostly still
legal: what stresses the planner). The result is
compiled and planned as ``spindle plan`` would (the default scheduler and time limit, memory
enforced). Any exception but ``SpindleError`` is a *traceback*; a case past ``--slow``
seconds is *slow*; past ``--kill`` seconds its worker process is killed and restarted and
the case counts as a *hang*. Seeds: the shared fixtures (``../shared/spec``, with
``next/``), ``examples/``, ``bench/specs/`` and two generated specs, unless SPEC files are
given. Prints one row per seed spec and every failing case with its mutations.
``tests/planner/test_fuzz.py`` runs the same mutations for a few seconds in the suite.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import re
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SHARED = REPO.parent / "shared" / "spec"
NUMBERS = ("0", "1", "-1", "2", "3", "7", "65536", "1000000", "99999999999", "0.5", "1e9")
TOKEN = re.compile(
    r"\s+|#[^\n]*|\"[^\"\n]*\"|[A-Za-z_][A-Za-z0-9_]*|[0-9][0-9.eE]*[A-Za-z/]*|->|<-|."
)
NUMBER = re.compile(r"^([0-9][0-9.]*(?:[eE][0-9]+)?)([A-Za-z/]*)$")


def tokens(text: str) -> list[str]:
    return TOKEN.findall(text)


def mutate(text: str, rng: random.Random, count: int | None = None) -> tuple[str, list[str]]:
    """``text`` after ``count`` mutations (default: one, at times two or three), and what
    each one did."""
    toks = tokens(text)
    words = [i for i, t in enumerate(toks) if not t.isspace() and not t.startswith("#")]
    done: list[str] = []
    for _ in range(rng.choice((1, 1, 1, 2, 3)) if count is None else count):
        numbers = [i for i in words if NUMBER.match(toks[i])]
        op = rng.choice(["number"] * 3 + ["scale"] * 2 + ["delete", "duplicate", "swap"])
        if op == "scale" and numbers:  # a legal-looking magnitude: the planner's edge cases
            i = rng.choice(numbers)
            digits, unit = NUMBER.match(toks[i]).groups()  # type: ignore[union-attr]
            factor = 2.0 ** rng.randint(-3, 10)
            value = float(digits) * factor
            new = (
                str(max(1, round(value)))
                if "." not in digits and "e" not in digits
                else f"{value:g}"
            )
            done.append(f"line {_line(toks, i)}: {toks[i]} -> {new}{unit}")
            toks[i] = new + unit
        elif op == "number" and numbers:
            i = rng.choice(numbers)
            _, unit = NUMBER.match(toks[i]).groups()  # type: ignore[union-attr]
            new = rng.choice(NUMBERS)
            done.append(f"line {_line(toks, i)}: {toks[i]} -> {new}{unit}")
            toks[i] = new + unit
        elif words:
            i = rng.choice(words)
            line = _line(toks, i)
            if op == "delete":
                done.append(f"line {line}: delete {toks[i]!r}")
                toks[i] = ""
            elif op == "duplicate":
                done.append(f"line {line}: duplicate {toks[i]!r}")
                toks[i] = toks[i] + " " + toks[i]
            else:
                j = rng.choice(words)
                done.append(
                    f"line {line}: swap {toks[i]!r} with {toks[j]!r} (line {_line(toks, j)})"
                )
                toks[i], toks[j] = toks[j], toks[i]
    return "".join(toks), done


def _line(toks: list[str], i: int) -> int:
    return 1 + sum(t.count("\n") for t in toks[:i])


def run_case(text: str, time_limit_s: float | None = None) -> tuple[str, str]:
    """Compile and plan ``text``: ("ok" | "spec error" | "plan error" | "traceback", detail)."""
    from spindle_dsl.cost import make_cost_model
    from spindle_dsl.errors import SpecError, SpindleError
    from spindle_dsl.language import compile_text
    from spindle_dsl.planner import DEFAULT_TIME_LIMIT_S, make_plan

    try:
        graph = compile_text(text, "fuzz.spindle").graph
    except SpecError as exc:
        return "spec error", exc.render().splitlines()[0] if exc.errors else ""
    except Exception:
        return "traceback", traceback.format_exc()
    try:
        limit = DEFAULT_TIME_LIMIT_S if time_limit_s is None else time_limit_s
        plan = make_plan(graph, make_cost_model(graph.cluster), time_limit_s=limit)
        return "ok", f"{plan.iteration_s:.4g} s"
    except SpindleError as exc:
        return "plan error", str(exc).splitlines()[0][:160]
    except Exception:
        return "traceback", traceback.format_exc()


def _serve(conn) -> None:  # the worker process: one case at a time
    import warnings

    warnings.simplefilter("ignore")
    while True:
        try:
            text = conn.recv()
        except EOFError:
            return
        t0 = time.perf_counter()
        status, detail = run_case(text)
        conn.send((status, detail, time.perf_counter() - t0))


class Worker:
    """A worker process that can be killed when a case hangs, and started again."""

    def __init__(self) -> None:
        self.ctx = mp.get_context("spawn")
        self._start()

    def _start(self) -> None:
        self.conn, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_serve, args=(child,), daemon=True)
        self.proc.start()
        child.close()

    def run(self, text: str, kill_s: float) -> tuple[str, str, float]:
        self.conn.send(text)
        if self.conn.poll(kill_s):
            try:
                return self.conn.recv()
            except EOFError:  # the worker died (a crash in native code)
                code = self.proc.exitcode
                self.stop()
                self._start()
                return "traceback", f"worker process died (exit code {code})", 0.0
        self.stop()
        self._start()
        return "hang", f"no answer within {kill_s:.0f} s", kill_s

    def stop(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()


@dataclass
class Tally:
    cases: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    slowest: float = 0.0


def seeds(paths: list[str]) -> dict[str, str]:
    """The seed specs by name (see the module docstring)."""
    if paths:
        return {Path(p).name: Path(p).read_text() for p in paths}
    files = sorted(SHARED.glob("*.spindle")) + sorted(SHARED.glob("next/*.spindle"))
    files += sorted((REPO / "examples").glob("*.spindle"))
    files += sorted((HERE / "specs").glob("*.spindle"))
    out = {f"{p.parent.name}/{p.name}": p.read_text() for p in files}
    sys.path.insert(0, str(HERE))
    from synthetic_spec import synthetic_spec

    out["synthetic 64x10"] = synthetic_spec(64, 10)
    out["synthetic 1024x50"] = synthetic_spec(1024, 50)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*", help="seed specs (default: see the docstring)")
    parser.add_argument("--minutes", type=float, default=6.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--slow", type=float, default=30.0, help="report cases past this (s)")
    parser.add_argument("--kill", type=float, default=90.0, help="kill a case past this (s)")
    args = parser.parse_args()
    corpus = seeds(args.specs)
    rng = random.Random(args.seed)
    tallies = {name: Tally() for name in corpus}
    failures: list[tuple[str, str, list[str], str, float, str]] = []
    worker = Worker()
    deadline = time.monotonic() + 60 * args.minutes
    names = list(corpus)
    print(f"fuzzing {len(names)} seed specs for {args.minutes:g} min (seed {args.seed})")
    try:
        while time.monotonic() < deadline:
            name = rng.choice(names)
            text, done = mutate(corpus[name], rng)
            status, detail, seconds = worker.run(text, args.kill)
            t = tallies[name]
            t.cases += 1
            t.by_status[status] = t.by_status.get(status, 0) + 1
            t.slowest = max(t.slowest, seconds)
            if status in ("traceback", "hang") or seconds > args.slow:
                failures.append((name, status, done, detail, seconds, text))
                print(f"  ! {name}: {status} after {seconds:.1f} s ({'; '.join(done)})", flush=True)
    finally:
        worker.stop()
    kinds = ("ok", "spec error", "plan error", "traceback", "hang")
    print(
        f"\n{'seed spec':<34} {'cases':>6} " + " ".join(f"{k:>10}" for k in kinds) + "  slowest s"
    )
    for name, t in tallies.items():
        counts = " ".join(f"{t.by_status.get(k, 0):>10}" for k in kinds)
        print(f"{name:<34} {t.cases:>6} {counts} {t.slowest:>10.1f}")
    total = sum(t.cases for t in tallies.values())
    slow = sum(1 for f in failures if f[4] > args.slow)
    bad = sum(1 for f in failures if f[1] in ("traceback", "hang"))
    print(f"\n{total} cases: {bad} tracebacks or hangs, {slow} past {args.slow:g} s")
    for name, status, done, detail, seconds, _ in failures:
        print(f"\n--- {name}: {status}, {seconds:.1f} s; mutations: {'; '.join(done)}\n{detail}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
