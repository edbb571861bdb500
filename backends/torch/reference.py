"""The oracle: the whole spec as one plain PyTorch model, trained in one process.

No plan, no shards, no exchanges: each task's MetaOps run in topological order on the whole
batch, the losses are the plain whole-batch means, one ``backward`` of their sum fills every
gradient, ``torch.nn.utils.clip_grad_norm_`` clips it (with ``clip_grad``), and AdamW steps at
the schedule's learning rate (``recipe.lr_at``, times each module's ``lr_scale`` as a parameter
group's rate). The distributed runtime must reproduce its losses and parameters; the tests
compare the two. It shares with the runtime only what defines the model and the job (part
initialisation, the data source, the loss formulas, the recipe), never how work is split.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from spindle_dsl.errors import ExecutionError
from spindle_dsl.metagraph import MetaGraph, TaskInfo
from spindle_dsl.phases import MixSchedule
from spindle_dsl.recipe import LrDecay, lr_at

from . import losses as L
from . import masks as M
from .data import TaskData
from .optim import make_optimizer, scale_of, set_lr
from .params import DTYPES, PartStore, build_part
from .parts import Part, graph_parts, head_module
from .weights import check_weights, compare_keys, flat_key, read_header


@dataclass(frozen=True)
class OracleStep:
    """What the oracle's step ``step`` (1-based) trained with: its base learning rate and the
    global gradient norm before clipping (what the runtime logs)."""

    step: int
    lr: float
    grad_norm: float


class ReferenceModel:
    """Every part of the spec in one process."""

    def __init__(
        self,
        graph: MetaGraph,
        *,
        seed: int = 0,
        dtype: str = "float32",
        datasets: Mapping[str, Any] | None = None,
        store: PartStore | None = None,
        data: TaskData | None = None,
    ):
        """``store``/``data``: parts and data shared with other models of the same spec (the
        phases of a schedule, ``ScheduleReference``)."""
        self.graph = graph
        if store is None:
            check_weights(graph, graph_parts(graph))
        self.store = store or PartStore(graph, graph_parts(graph), seed, DTYPES[dtype])
        self.data = data or TaskData(graph, seed, datasets, DTYPES[dtype])
        self.tasks = [t for t in graph.tasks if t.batch > 0]
        for task in self.tasks:
            L.check_task(graph, task)

    def forward(self, task: TaskInfo, raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every MetaOp output of ``task`` on the raw rows ``raw``, by MetaOp id."""
        acts: dict[str, torch.Tensor] = {}
        lengths = M.lengths_of(raw)
        for op in self.graph.metaops:
            if op.task != task.name:
                continue
            pieces = []
            for inp in op.inputs:
                if inp.from_modality:
                    stage = self.store[Part(op.segments[0][0], f"input.{inp.source}")]
                    pieces.append(stage(raw[inp.source][:, : inp.tokens]))
                    M.check_stage_tokens(op.id, pieces[-1], inp.tokens, inp.source in lengths)
                else:
                    pieces.append(acts[inp.source])
            x = torch.cat(pieces, dim=1)
            mask = M.input_mask(self.graph, op, lengths, x.shape[0])
            for module, count in op.segments:
                for j in range(count):
                    x, mask = M.call_layer(self.store[Part(module, f"layer.{j}")], x, mask)
            acts[op.id] = x
        return acts

    def lm_logits(self, task: str, first: int, count: int) -> torch.Tensor:
        """Next-token logits of an lm task's text on ``count`` samples from global position
        ``first``: (count, text tokens - 1, vocab), position i predicting text token i + 1."""
        info = self.graph.task(task)
        sink = info.sinks[0]
        where = L.lm_target(self.graph, sink)
        acts = self.forward(info, self.data.rows_at(task, first, 0, count))
        head = self.store[Part(head_module(self.graph.op(sink)), "head")]
        return head(acts[sink][:, where.offset : where.offset + where.count - 1])

    def losses(self, step: int) -> dict[str, torch.Tensor]:
        """Each task's mean loss on its whole batch of step ``step`` (0-based)."""
        out: dict[str, torch.Tensor] = {}
        for task in self.tasks:
            raw = self.data.rows(task.name, step, 0, task.batch)
            acts = self.forward(task, raw)
            if task.loss == "lm":
                out[task.name] = sum(self._lm_loss(task, s, acts[s], raw) for s in task.sinks)
            elif task.loss == "mse":
                out[task.name] = sum(
                    L.mse_loss_part(acts[s], raw[f"target:{s}"], task.batch) for s in task.sinks
                )
            else:
                lengths, rows = M.lengths_of(raw), task.batch
                a, b = (
                    L.readout(acts[s], M.output_mask(self.graph, self.graph.op(s), lengths, rows))
                    for s in task.sinks
                )
                out[task.name] = L.infonce(a, b)
        return out

    def _lm_loss(
        self, task: TaskInfo, sink: str, out: torch.Tensor, raw: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """The mean next-token loss of an lm sink over the real targets of its whole batch."""
        where = L.lm_target(self.graph, sink)
        targets = M.lm_targets(raw, where.modality, where.count)
        head = self.store[Part(head_module(self.graph.op(sink)), "head")]
        return L.lm_loss_part(
            head, out, raw[where.modality], where, task.batch, targets=targets,
            scored=M.scored(targets, task.batch, where.count),
        )  # fmt: skip

    def train(
        self,
        steps: int,
        *,
        lr: float = 1e-3,
        weight_decay: float = 0.01,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        **recipe: Any,
    ) -> list[dict[str, float]]:
        """``steps`` AdamW steps from the start; the per-task losses of each step. ``recipe``:
        ``warmup_steps``, ``lr_decay``, ``min_lr``, ``clip_grad``, ``lr_scales`` as
        ``RunConfig`` has them, and ``schedule_steps`` (the run's length, when the oracle
        follows only its first steps); ``self.trained`` keeps each step's rate and norm."""
        hyper = dict(lr=lr, weight_decay=weight_decay, betas=betas, eps=eps)
        fill = self.store.fill_missing_grads
        self.trained: list[OracleStep] = []
        return adamw_steps(
            self.store, steps, self.losses, lambda _step: fill(), hyper, self.trained, **recipe
        )

    def load_weights(self, path: str) -> None:
        """Load every parameter from a safetensors file with ``MODULE.ROLE.PARAM`` keys (what
        ``spindle export`` writes), strictly: a missing, extra or mis-shaped key is an error
        listing each."""
        from safetensors import safe_open

        params = {
            flat_key(p, n): t for p in self.store.parts for n, t in self.store[p].named_parameters()
        }
        problems = compare_keys({k: tuple(t.shape) for k, t in params.items()}, read_header(path))
        if problems:
            raise ExecutionError(f"{path} does not fit the model:\n  " + "\n  ".join(problems))
        with safe_open(path, framework="pt") as f, torch.no_grad():
            for key, t in params.items():
                t.copy_(f.get_tensor(key).to(t.dtype))

    def state(self) -> dict[str, dict[str, torch.Tensor]]:
        """Every parameter, by part key then parameter name (as checkpoints store them)."""
        return {
            p.key: {n: t.detach().clone() for n, t in self.store[p].named_parameters()}
            for p in self.store.parts
        }


class ScheduleReference:
    """The oracle of a run that follows a schedule of mixes: every part of every phase in one
    process, each step computed by its phase's model on the samples the schedule assigns.

    Parts are built once, from their seeds, and shared by the phases; one AdamW steps them
    all, and a step gives gradients only to its phase's parts (zeros where a part got none, as
    the runtime's holders do), so the parts of an absent task keep their weights, moments and
    step counts until the task returns, which is what the runtime's parking must reproduce."""

    def __init__(
        self,
        schedule: MixSchedule,
        *,
        seed: int = 0,
        dtype: str = "float32",
        datasets: Mapping[str, Any] | None = None,
    ):
        self.schedule = schedule
        built: dict[Part, torch.nn.Module] = {}
        for phase in schedule.phases:
            for part in graph_parts(phase.graph):
                if part not in built:
                    built[part] = build_part(phase.graph, part, seed, DTYPES[dtype])
        graph = schedule.phases[0].graph
        self.store = PartStore(graph, tuple(built), seed, DTYPES[dtype], given=built)
        at = schedule.first_sample
        self.models = [
            ReferenceModel(
                p.graph,
                store=self.store,
                data=TaskData(p.graph, seed, datasets, DTYPES[dtype], positions=at),
            )
            for p in schedule.phases
        ]
        self.phase_parts = [graph_parts(p.graph) for p in schedule.phases]

    def train(
        self,
        steps: int,
        *,
        lr: float = 1e-3,
        weight_decay: float = 0.01,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        **recipe: Any,
    ) -> list[dict[str, float]]:
        """``steps`` AdamW steps from the start through the schedule; each step's losses
        (``recipe`` and ``self.trained`` as ``ReferenceModel.train``)."""

        def losses(step: int) -> dict[str, torch.Tensor]:
            return self.models[self.schedule.index_at(step)].losses(step)

        def fill(step: int) -> None:  # only the phase's parts: the others must not move
            for part in self.phase_parts[self.schedule.index_at(step)]:
                for t in self.store[part].parameters():
                    if t.requires_grad and t.grad is None:
                        t.grad = torch.zeros_like(t)

        hyper = dict(lr=lr, weight_decay=weight_decay, betas=betas, eps=eps)
        self.trained: list[OracleStep] = []
        return adamw_steps(self.store, steps, losses, fill, hyper, self.trained, **recipe)

    def state(self) -> dict[str, dict[str, torch.Tensor]]:
        """Every parameter of every phase, by part key then parameter name."""
        return ReferenceModel.state(self)  # type: ignore[arg-type]  (reads only .store)


def adamw_steps(
    store: PartStore,
    steps: int,
    losses: Callable[[int], dict[str, torch.Tensor]],
    fill_missing_grads: Callable[[int], None],
    hyper: dict[str, Any],
    trained: list[OracleStep] | None = None,
    *,
    warmup_steps: int = 0,
    lr_decay: LrDecay = "constant",
    min_lr: float = 0.0,
    clip_grad: float = 0.0,
    lr_scales: tuple[tuple[str, float], ...] = (),
    schedule_steps: int | None = None,
) -> list[dict[str, float]]:
    """The oracle's loop: per step, one backward of the summed losses, zero gradients where
    ``fill_missing_grads`` says, the global norm clipped to ``clip_grad`` (when positive), one
    AdamW step over every trainable parameter of ``store`` (those left without a gradient are
    skipped, state and all) at the rate of a schedule ``schedule_steps`` long (default:
    ``steps``); each step's rate and norm go to ``trained``."""
    params = list(store.trainable())
    scale = scale_of(lr_scales)
    opt = make_optimizer(
        (t for _, _, t in params), scales=[scale(p) for p, _, _ in params], **hyper
    )
    history = []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        got = losses(step)
        total = sum(got.values())
        if isinstance(total, torch.Tensor) and total.requires_grad:
            total.backward()
        fill_missing_grads(step)
        grads = [t for _, _, t in params if t.grad is not None]
        if clip_grad > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(grads, clip_grad))
        else:
            norm = float(torch.nn.utils.get_total_norm([t.grad for t in grads])) if grads else 0.0
        rate = lr_at(step, lr=hyper["lr"], steps=schedule_steps or steps, warmup_steps=warmup_steps,
                     decay=lr_decay, min_lr=min_lr)  # fmt: skip
        set_lr(opt, rate)
        opt.step()
        if trained is not None:
            trained.append(OracleStep(step + 1, rate, norm))
        history.append({k: float(v.detach()) for k, v in got.items()})
    return history
