"""The per-machine profile cache: what ``spindle profile --nproc N`` measures, kept per machine.

One file per machine key (``cost.machine``) in the cache folder (``cache_dir``), holding a
profile of every layer shape, input stage, loss head and optimizer part measured on this
machine so far, whatever spec it came from, and the terms every spec shares (collectives,
exchange, copies, a stage's fixed cost). Layer entries are keyed by ``shape_key`` as in a
profile file; the other terms by their cache keys (``cost.profile_needs``). The file:

```
{"format": "spindle-profile-cache", "version": 1,
 "machine": {"cpu": str, "cores": int, "torch": str, "threads": int, "ranks": int},
 "profile": {...}}   # the profile file's format (``cost.profile``), terms under cache keys
```

``CachedProfile.missing`` says what a graph needs that the cache lacks; ``merged`` files a
profiling run's results in; ``for_needs`` gives the graph's own profile, in its own names, for
``ProfiledCostModel``. Writes are atomic (``atomic.write_atomic``): two runs writing at once
leave one's file whole (the other's new terms are measured again the next time); a file that
cannot be read back is reported (``read_cache``) and rebuilt, never trusted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from spindle_dsl.atomic import write_atomic
from spindle_dsl.cost.fit import fit_piecewise
from spindle_dsl.cost.machine import MachineKey
from spindle_dsl.cost.overheads import StepOverheads
from spindle_dsl.cost.profile import Profile, ProfileEntry, Sample, data_parallel_rate
from spindle_dsl.cost.profile_needs import ProfileNeeds, ProfileSelection, ShapeNeed
from spindle_dsl.errors import SpindleError

FORMAT = "spindle-profile-cache"
VERSION = 1
CACHE_ENV = "SPINDLE_CACHE_DIR"
# the overheads' terms filed by name (the rest are the machine's, shared by every spec)
_NAMED = ("inputs", "losses", "parts", "parts_alone")


def cache_dir(env: Mapping[str, str] = os.environ) -> Path:
    """``$SPINDLE_CACHE_DIR``, else ``$XDG_CACHE_HOME/spindle``, else ``~/.cache/spindle``."""
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV]).expanduser()
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]).expanduser() / "spindle"
    return Path.home() / ".cache" / "spindle"


def cache_path(key: MachineKey, env: Mapping[str, str] = os.environ) -> Path:
    return cache_dir(env) / key.file_name()


@dataclass(frozen=True)
class CachedProfile:
    """The cache file's contents: the machine it holds for and what was measured there."""

    machine: MachineKey
    profile: Profile  # inputs, losses and parts under their cache keys

    @classmethod
    def empty(cls, machine: MachineKey) -> CachedProfile:
        return cls(machine, Profile("cpu", "cpu", machine.torch, machine.threads, "", "", ()))

    def missing(self, needs: ProfileNeeds) -> ProfileSelection:
        """What ``needs`` asks for that the cache lacks, in the spec's names."""
        o = self.profile.overheads
        have: dict[str, dict] = {k: dict(getattr(o, k)) if o else {} for k in _NAMED}
        return ProfileSelection(
            shapes=frozenset(s.key for s in needs.shapes if not self._covers(s)),
            inputs=frozenset(n for n, key in needs.inputs if key not in have["inputs"]),
            losses=frozenset(n for n, key in needs.losses if key not in have["losses"]),
            parts=frozenset(n for n, key in needs.parts if key not in have["parts"]),
            machine=o is None,
        )

    def _covers(self, need: ShapeNeed) -> bool:
        """The shape's entry spans the batches the planner asks about (a fit read outside its
        samples is a guess), with the first layer's ratio where it is needed."""
        entry = self._entry(need.key)
        if entry is None or (need.first_layer_ratio and entry.first_layer_ratio is None):
            return False
        if not need.batches:
            return True
        batches = [s.batch for s in entry.samples]
        return bool(batches) and min(batches) <= min(need.batches) <= max(need.batches) <= max(
            batches
        )

    def _entry(self, key: tuple) -> ProfileEntry | None:
        return next((e for e in self.profile.entries if e.key == key), None)

    def for_needs(self, needs: ProfileNeeds, source: str) -> Profile:
        """The profile of the graph ``needs`` was read from, in its own names (``missing``
        must be empty); ``source`` names the cache file in what the plan records."""
        o = self.profile.overheads
        if o is None or not self.missing(needs).empty:
            raise SpindleError(f"the profile cache {source} lacks terms of {needs.spec}")
        entries = []
        for need in needs.shapes:
            entry = self._entry(need.key)
            assert entry is not None
            entries.append(replace(entry, metaops=need.metaops))
        d = o.to_dict()
        for field, pairs in (("inputs", needs.inputs), ("losses", needs.losses)):
            d[field] = {name: d[field][key] for name, key in pairs}
        for field in ("parts", "parts_alone"):
            d[field] = {name: d[field][key] for name, key in needs.parts if key in d[field]}
        rate = data_parallel_rate(entries)
        d["seconds_per_flop"] = d["seconds_per_flop"] if rate is None else rate
        return replace(
            self.profile,
            spec=needs.spec,
            entries=tuple(entries),
            overheads=StepOverheads.from_dict(d, source),
        )

    def merged(
        self, measured: Profile, needs: ProfileNeeds, selection: ProfileSelection
    ) -> CachedProfile:
        """The cache with what a profiling run of ``selection`` measured filed in: its layer
        entries beside (or merged into) the cached ones, its named terms under their cache
        keys, and, where ``selection.machine``, its machine terms in place of the cached."""
        entries = {e.key: e for e in self.profile.entries}
        for e in measured.entries:
            had = entries.get(e.key)
            entries[e.key] = e if had is None else merge_entries(had, e)
        base = measured.overheads if selection.machine else self.profile.overheads
        if base is None or measured.overheads is None:
            raise SpindleError("a profile of worker processes came back without its overheads")
        d = base.to_dict()
        new = measured.overheads.to_dict()
        old = self.profile.overheads.to_dict() if self.profile.overheads else {}
        names = {"inputs": needs.inputs, "losses": needs.losses, "parts": needs.parts,
                 "parts_alone": needs.parts}  # fmt: skip
        for field in _NAMED:
            keys = dict(names[field])
            d[field] = {**old.get(field, {}), **{keys[n]: v for n, v in new[field].items()
                                                 if n in keys}}  # fmt: skip
        profile = replace(
            measured,
            spec="",
            entries=tuple(entries.values()),
            overheads=StepOverheads.from_dict(d, "profile cache"),
        )
        return CachedProfile(self.machine, profile)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "machine": self.machine.to_dict(),
                "profile": self.profile.to_dict()}  # fmt: skip


def merge_entries(old: ProfileEntry, new: ProfileEntry) -> ProfileEntry:
    """One shape's samples from two runs, the newer at a batch both timed, refitted; the
    newer first-layer ratio where it has one."""
    by_batch: dict[int, Sample] = {s.batch: s for s in old.samples}
    by_batch.update({s.batch: s for s in new.samples})
    samples = tuple(by_batch[b] for b in sorted(by_batch))
    return replace(
        new,
        samples=samples,
        fit=fit_piecewise([(s.flops, s.seconds) for s in samples]),
        first_layer_ratio=(
            new.first_layer_ratio if new.first_layer_ratio is not None else old.first_layer_ratio
        ),
    )


def read_cache(path: Path, machine: MachineKey) -> tuple[CachedProfile, str | None]:
    """The cache file at ``path``, or an empty cache and, where a file is there but cannot be
    used (unreadable, not JSON, not a cache, another machine's), a warning saying why."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return CachedProfile.empty(machine), None
    except OSError as exc:
        return CachedProfile.empty(machine), _ignored(path, exc.strerror or str(exc))
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or (data.get("format"), data.get("version")) != (
            FORMAT,
            VERSION,
        ):
            raise SpindleError(f"not a {FORMAT} version {VERSION} file")
        found = MachineKey.from_dict(data["machine"])
        if found != machine:
            raise SpindleError(f"it holds for another machine key, {found}")
        profile = Profile.from_dict(data["profile"], where=str(path))
    except json.JSONDecodeError as exc:
        return CachedProfile.empty(machine), _ignored(path, f"invalid JSON: {exc.msg}")
    except (SpindleError, KeyError, TypeError, ValueError) as exc:
        return CachedProfile.empty(machine), _ignored(path, str(exc))
    return CachedProfile(machine, profile), None


def _ignored(path: Path, why: str) -> str:
    return f"ignoring the profile cache {path} ({why}): measuring again"


def write_cache(path: Path, cached: CachedProfile) -> None:
    """Write the cache file atomically (a temporary file beside it, fsynced, renamed over)."""
    write_atomic(path, json.dumps(cached.to_dict(), indent=1) + "\n")
