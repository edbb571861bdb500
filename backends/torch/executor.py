"""One training step on one rank: ``k`` micro-batch passes of forward, losses and backward.

A pass runs on micro-batch ``m`` of every task: rows ``shard_bounds(B, k)[m]`` of a task's batch
``B``, which each stage splits over its devices as it would a whole batch (``k = 1``: the whole
batch). Forward, for each wave in order: run the wave's exchange phase (every flow whose
consumer is in this wave; the rows of each arrive as a leaf tensor), then the stage this rank
runs in the wave on its data-parallel shard. The losses follow (a contrastive task first gathers
its readouts). Backward, for each wave in reverse: back-propagate this rank's stage from the
gradient its output collected, then send each received leaf's gradient back along its flow,
where the producer adds it to its own output gradient. Parameter gradients accumulate in
``.grad`` over every stage, task and pass. After the loss and after each wave's backward the
executor tells the gradient synchroniser (``grads.GradSync``) which backward tick is over, so
it can start reducing the buckets that are final.

A stage's autograd graph spans only its own layers (inputs are leaves), so backward of a wave
needs nothing from any other rank beyond the output gradients already delivered, and, in a
tensor-parallel stage, its group: the lead assembles the stage's input and broadcasts it, the
ranks run their slices of the layers (``tensor_parallel.ShardView``, whose all-reduces they
run together), the lead alone sends the output on and broadcasts the output's gradient back
to the group before the stage's backward. An lm sink's group scores its loss together, split
by vocabulary (``losses.vocab_parallel_lm_loss_part``), and sums its output's gradient.

Micro-batches keep the losses' whole-batch normalisation (an ``lm`` or ``mse`` shard divides its
sum by the task's whole batch), so the passes' gradients add up to the one-pass gradient. A
contrastive loss couples every pair of the batch, so with ``k > 1`` the step first caches it,
as OpenCLIP's ``accum_freq`` and GradCache do: one forward without autograd of the contrastive
tasks' MetaOps over all ``k`` micro-batches, the readouts gathered on the loss device, the
loss and its gradient with respect to the whole batch's readouts computed there; each pass then
runs those MetaOps with autograd, sends every sink its micro-batch's cached readout gradient
back along the loss flows, and back-propagates it. The extra cost per step is that one
forward of the contrastive tasks' MetaOps (on the whole batch, as ``k`` micro-batch passes)
and ``k`` more readout gathers.

Evaluation (``evaluate``) runs the same forward waves, exchanges and losses on a held-out
batch, for the tasks that have held-out data only (every rank skips the others' stages and
flows alike), under ``torch.no_grad``: no backward, no gradient, no report to the gradient
synchroniser, nothing traced or metered, so it changes nothing a training step sees.

Activation recompute: the layers of a MetaOp in ``recompute`` run one by one under
``torch.utils.checkpoint`` (non-reentrant) whenever they build a graph, so only each layer's
input stays alive between forward and backward and the layer runs its forward again inside
the backward. The recomputed forward is the same computation on the same input, so gradients
are bit for bit those without recompute; input stages and LM heads always run plainly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from spindle_dsl.errors import ExecutionError
from spindle_dsl.metagraph import MetaGraph, MetaOp, TaskInfo

from . import losses as L
from . import masks as M
from .data import TaskData
from .exchange import ReceivePool, exchange
from .memory import MemoryMeter
from .params import PartStore
from .parts import Part, head_module
from .schedule import (
    LM_LOSS_FLOW,
    Flow,
    Schedule,
    Stage,
    layer_module,
    shape_after,
    shard_bounds,
    unit_bounds,
)
from .tensor_parallel import ShardView
from .trace import Tracer

StageKey = tuple[str, int]


class BackwardListener:
    """What the executor reports during a step (``grads.GradSync`` listens); does nothing."""

    def begin_pass(self, index: int, count: int) -> None:
        pass

    def backward_begin(self, tick: int) -> None:
        pass

    def backward_done(self, tick: int) -> None:
        pass


@dataclass(frozen=True)
class ContrastiveCache:
    """A step's contrastive losses, computed on the whole batch before the passes: each task's
    loss (on its loss device) and the gradient of each readout flow's whole batch there."""

    losses: dict[str, float]
    grads: dict[str, torch.Tensor]


class StepExecutor:
    """Runs steps of one rank's share of the plan."""

    def __init__(
        self,
        graph: MetaGraph,
        schedule: Schedule,
        rank: int,
        store: PartStore,
        data: TaskData,
        *,
        dtype: torch.dtype,
        device: torch.device,
        tracer: Tracer | None = None,
        heartbeat: Callable[[str], None] | None = None,
        recompute: frozenset[str] = frozenset(),
        micro_batches: int = 1,
        listener: BackwardListener | None = None,
        meter: MemoryMeter | None = None,
        tp_groups: Mapping[tuple[int, ...], Any] | None = None,
    ):
        if micro_batches < 1:
            raise ExecutionError(f"micro_batches must be at least 1, got {micro_batches}")
        self.graph, self.schedule, self.rank = graph, schedule, rank
        self.recompute = recompute
        self.store, self.data, self.dtype, self.device = store, data, dtype, device
        self.tracer = tracer or Tracer(rank, enabled=False)
        self.beat = heartbeat or (lambda _what: None)
        self.k = micro_batches
        self.listener = listener or BackwardListener()
        self.meter = meter or MemoryMeter(store, device, enabled=False)
        self.pool = ReceivePool(self.meter.keep)
        self.tasks = [t for t in graph.tasks if t.batch > 0]
        for task in self.tasks:
            L.check_task(graph, task)
        self.lm_targets = {
            s: L.lm_target(graph, s) for t in self.tasks if t.loss == "lm" for s in t.sinks
        }
        self.my_stage = {w: schedule.stage_of(rank, w) for w in range(schedule.n_waves)}
        self.flow_by_key = {f.key: f for f in schedule.flows}
        # each pass's flows: the same moves, on the micro-batch's rows
        self.flows = [
            [
                tuple(_micro_flow(f, self.k, m) for f in schedule.flows_into(phase))
                for phase in range(schedule.n_waves + 1)
            ]
            for m in range(self.k)
        ]
        self.contrastive = {t.name for t in self.tasks if t.loss == "contrastive"}
        # the tasks a pass runs: all of them, except in ``evaluate``
        self.active = frozenset(t.name for t in self.tasks)
        self.training = True
        self._scored_at: dict[tuple, int | None] = {}  # the last lm count (``_scored``)
        # tensor parallelism: the process group of each of this rank's groups, the views
        self.tp_groups = dict(tp_groups or {})
        self._views: dict[tuple[Part, tuple[int, ...]], ShardView] = {}

    def task_of_flow(self, flow: Flow) -> str:
        return self.graph.op(flow.source[0]).task

    def micro_rows(self, batch: int, m: int) -> tuple[int, int]:
        """Rows ``[lo, hi)`` of a batch of ``batch`` in micro-batch ``m``."""
        return shard_bounds(batch, self.k)[m]

    def rows(self, stage: Stage, batch: int, m: int) -> tuple[int, int]:
        """The rows of the whole batch (of ``batch``) this rank holds in ``stage`` in pass
        ``m``: its shard of the micro-batch, numbered as in the whole batch."""
        base, end = self.micro_rows(batch, m)
        lo, hi = stage.rows(end - base, self.rank)
        return base + lo, base + hi

    # --- one step -------------------------------------------------------------------------------
    def run(self, step: int) -> dict[str, float]:
        """Forward and backward of step ``step`` (0-based), all passes; returns this rank's
        share of each task's loss (the shares of all ranks add up to the task's mean loss)."""
        cache = self._contrastive_cache(step) if self.k > 1 and self.contrastive else None
        shares = {t.name: 0.0 for t in self.tasks}
        for m in range(self.k):
            self.listener.begin_pass(m, self.k)
            with self.meter.saving():
                for task, value in self._pass(step, m, cache).items():
                    shares[task] += value
        if cache is not None:
            for task, value in cache.losses.items():
                shares[task] += value
        return shares

    def evaluate(self, index: int, data: TaskData, tasks: Collection[str]) -> dict[str, float]:
        """This rank's shares of each of ``tasks``' mean loss on held-out batch ``index`` of
        ``data`` (its rows from ``index * batch``): the plan's forward waves, exchanges and
        losses for those tasks only, under ``torch.no_grad``, touching no gradient, optimizer
        or meter (the shares of all ranks add up to each task's mean loss)."""
        active = frozenset(tasks) & self.active
        saved = (self.data, self.active, self.meter, self.tracer.enabled)
        self.data, self.active, self.training = data, active, False
        self.meter, self.tracer.enabled = MemoryMeter(self.store, self.device, enabled=False), False
        shares = dict.fromkeys(sorted(active), 0.0)
        try:
            with torch.no_grad():
                cache = self._contrastive_cache(index) if self.k > 1 and self._cached() else None
                for m in range(self.k):
                    label = f"eval batch {index + 1}" + (f" pass {m + 1}" if self.k > 1 else "")
                    outputs, _ = self._forward_waves(index, m, label)
                    for task, value in self._losses(index, m, outputs, cache)[0].items():
                        shares[task] += value
                for task, value in (cache.losses if cache is not None else {}).items():
                    shares[task] += value
        finally:
            self.data, self.active, self.meter, self.tracer.enabled = saved
            self.training = True
        return shares

    def _cached(self) -> bool:
        """Whether the step caches contrastive losses (``k > 1`` and such a task runs)."""
        return bool(self.contrastive & self.active)

    def _runs(self, flow: Flow) -> bool:
        """Whether this pass moves ``flow`` (its task is active)."""
        return self.task_of_flow(flow) in self.active

    def _forward_waves(
        self, step: int, m: int, label: str
    ) -> tuple[dict[StageKey, torch.Tensor], dict[str, torch.Tensor]]:
        """Every wave's exchange and this rank's stage in it, forward, for pass ``m``: the
        stages' outputs and the leaves received (of the active tasks' MetaOps)."""
        outputs: dict[StageKey, torch.Tensor] = {}
        leaves: dict[str, torch.Tensor] = {}
        everything = self.training
        for wave in range(self.schedule.n_waves):
            self.beat(f"{label} wave {wave} forward")
            flows = self.flows[m][wave]
            if not everything:
                flows = tuple(f for f in flows if self._runs(f))
            self._receive(flows, wave, outputs, leaves, pool=self.pool)
            stage = self.my_stage[wave]
            if stage is None or not (everything or self.graph.op(stage.metaop).task in self.active):
                continue
            before = self.meter.live["activations"]
            with self._span("F", "forward", stage, step):
                out = self._forward(stage, step, m, leaves)
            self.meter.keep(out, "activations")
            self.meter.note_stage(f"{stage.metaop} [{stage.first},{stage.end})", before)
            outputs[(stage.metaop, stage.index)] = out
        return outputs, leaves

    def _pass(self, step: int, m: int, cache: ContrastiveCache | None) -> dict[str, float]:
        label = f"step {step + 1}" + (f" pass {m + 1}/{self.k}" if self.k > 1 else "")
        outputs, leaves = self._forward_waves(step, m, label)
        self.beat(f"{label} loss")
        with self.tracer.span("loss", "loss"):
            shares, out_grads = self._losses(step, m, outputs, cache)
        self.listener.backward_done(0)
        n = self.schedule.n_waves
        for wave in reversed(range(n)):
            self.beat(f"{label} wave {wave} backward")
            stage = self.my_stage[wave]
            if stage is not None:
                key = (stage.metaop, stage.index)
                out = outputs.pop(key)
                if out.requires_grad:
                    self.listener.backward_begin(n - wave)
                    with self._span("B", "backward", stage, step):
                        grad = out_grads.pop(key, None)
                        if stage.tp > 1:
                            grad = self._group_grad(stage, out, grad)
                        torch.autograd.backward(
                            out, grad if grad is not None else torch.zeros_like(out)
                        )
                del out
            self.listener.backward_done(n - wave)
            self._send_back(self.flows[m][wave], wave, leaves, out_grads)
        return shares

    def _span(self, what: str, cat: str, stage: Stage, step: int, **args):
        """The trace span of a stage's forward or backward (the trace's flow arrows find the
        stages by these arguments)."""
        return self.tracer.span(
            f"{what} {stage.metaop} [{stage.first},{stage.end})",
            cat,
            step=step + 1,
            metaop=stage.metaop,
            stage=stage.index,
            wave=stage.wave,
            **args,
        )

    # --- forward ------------------------------------------------------------------------------
    def _receive(
        self,
        flows: tuple[Flow, ...],
        phase: int,
        outputs: dict[StageKey, torch.Tensor],
        leaves: dict[str, torch.Tensor],
        *,
        pool: ReceivePool | None,
    ) -> None:
        if not any(f.involves(self.rank) for f in flows):
            return
        send = {f.key: outputs[f.source] for f in flows if self.rank in f.src}
        with self.tracer.span(f"exchange {phase}", "exchange"):
            got = exchange(self.rank, flows, send, dtype=self.dtype, device=self.device, pool=pool)
        for key, tensor in got.items():
            leaves[key] = tensor.requires_grad_(
                self.flow_by_key[key].backward and torch.is_grad_enabled()
            )
            self.meter.keep(tensor, "activations")

    def _forward(
        self, stage: Stage, step: int, m: int, leaves: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        op = self.graph.op(stage.metaop)
        lo, hi = self.rows(stage, op.batch, m)
        want = (hi - lo, *shape_after(self.graph, op, stage.end - 1))
        if hi == lo:
            return torch.zeros(want, dtype=self.dtype, device=self.device)
        lengths = M.lengths_of(self.data.extras_at(op.task, step, lo, hi))
        mask = M.input_mask(self.graph, op, lengths, hi - lo)
        with torch.set_grad_enabled(op.needs_backward and torch.is_grad_enabled()):
            if stage.tp == 1 or self.rank == stage.group_of(self.rank)[0]:
                x = self._stage_input(stage, op, step, lo, hi, lengths, leaves)
            else:
                x = None
            if stage.tp > 1:
                x = self._shared_input(stage, x)
            again = op.id in self.recompute and torch.is_grad_enabled()
            for g in range(stage.first, stage.end):
                module, j = layer_module(op, g)
                layer = self._layer(stage, Part(module, f"layer.{j}"))
                x, mask = M.call_layer(layer, x, mask, again)
        if tuple(x.shape) != want:
            raise ExecutionError(
                f"{op.id} layers [{stage.first}, {stage.end}) of kind {op.kind} produced shape "
                f"{tuple(x.shape)}; the runtime expected {want} from the kind's out_tokens and "
                f"out_width"
            )
        return x

    def _stage_input(
        self,
        stage: Stage,
        op: MetaOp,
        step: int,
        lo: int,
        hi: int,
        lengths: Mapping[str, torch.Tensor],
        leaves: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        """The input of a stage's first layer: the rows received, and at a chain's start the
        input stages' embeddings of the raw rows."""
        if stage.index > 0:
            return leaves[f"{op.id}#{stage.index}"]
        raw = self.data.rows(op.task, step, lo, hi) if _reads_raw(op) else {}
        pieces = []
        for i, inp in enumerate(op.inputs):
            if inp.from_modality:
                stage_in = self.store[Part(op.segments[0][0], f"input.{inp.source}")]
                pieces.append(stage_in(raw[inp.source][:, : inp.tokens]))
                M.check_stage_tokens(op.id, pieces[-1], inp.tokens, inp.source in lengths)
            else:
                pieces.append(leaves[f"{op.id}<{i}"])
        return torch.cat(pieces, dim=1) if len(pieces) > 1 else pieces[0]

    def _shared_input(self, stage: Stage, x: torch.Tensor | None) -> torch.Tensor:
        """A tensor-parallel stage's input on every rank of the group: the lead's (which it
        assembled from the rows it received) broadcast to the others, with its shape and
        whether it carries a gradient, so every rank runs the same collectives backward."""
        ranks = stage.group_of(self.rank)
        group, lead = self.tp_groups[ranks], ranks[0]
        header = torch.zeros(4, dtype=torch.int64, device=self.device)  # NCCL: on the device
        if x is not None:
            x = x.contiguous()  # a collective sends a dense tensor
            header = torch.tensor(
                [x.requires_grad, *x.shape], dtype=torch.int64, device=self.device
            )
        dist.broadcast(header, src=lead, group=group)
        if x is None:
            x = torch.empty(tuple(header[1:].tolist()), dtype=self.dtype, device=self.device)
        dist.broadcast(x.detach(), src=lead, group=group)
        if self.rank != lead:
            x.requires_grad_(bool(header[0]) and torch.is_grad_enabled())
            self.meter.keep(x, "activations")
        return x

    def _group_grad(self, stage: Stage, out: torch.Tensor, grad: torch.Tensor | None):
        """The gradient of a tensor-parallel stage's output on every rank of its group: the
        lead's (from the stages and losses its rows went to) broadcast to the others, or, for
        a sink scored split by vocabulary, the sum of every rank's share."""
        ranks = stage.group_of(self.rank)
        if stage.last and stage.metaop in self.schedule.vocab_split:
            grad = grad.contiguous() if grad is not None else torch.zeros_like(out)
            dist.all_reduce(grad, group=self.tp_groups[ranks])
            return grad
        if self.rank == ranks[0]:
            grad = grad.contiguous() if grad is not None else torch.zeros_like(out)
        else:
            grad = torch.empty_like(out)
        dist.broadcast(grad, src=ranks[0], group=self.tp_groups[ranks])
        return grad

    def _layer(self, stage: Stage, part: Part) -> torch.nn.Module:
        """The module that runs ``part`` in ``stage`` on this rank: the layer itself, or in a
        tensor-parallel stage this rank's view of its slice."""
        if stage.tp == 1:
            return self.store[part]
        ranks = stage.group_of(self.rank)
        view = self._views.get((part, ranks))
        if view is None:
            group = self.tp_groups[ranks]
            view = ShardView(self.store[part], ranks.index(self.rank), stage.tp, group)
            self._views[(part, ranks)] = view
        return view

    # --- losses -------------------------------------------------------------------------------
    def _losses(
        self,
        step: int,
        m: int,
        outputs: dict[StageKey, torch.Tensor],
        cache: ContrastiveCache | None,
    ) -> tuple[dict[str, float], dict[StageKey, torch.Tensor]]:
        """The loss phase of micro-batch ``m``: each active task's loss share on this rank and,
        when training, the gradients of this rank's sink outputs (after back-propagating the
        losses through the loss-phase flows). Every rank runs the same exchanges in the same
        order, so the collectives match."""
        shares, seeds, sink_leaves, readouts = self._local_losses(step, m, outputs)
        flows = self.flows[m][self.schedule.n_waves]
        if not self.training:
            flows = tuple(f for f in flows if self._runs(f))
        gathered = self._gathered_losses(step, m, flows, cache, readouts, shares, seeds)
        if not self.training:
            return shares, {}
        if seeds:
            torch.autograd.backward(seeds)
        if any(f.involves(self.rank) and f.backward for f in flows):
            self._backward_readouts(m, flows, cache, readouts, gathered)
        out_grads: dict[StageKey, torch.Tensor] = {}
        for key, y in sink_leaves:
            if y.grad is not None:
                _accumulate(out_grads, key, y.grad)
        return shares, out_grads

    def _local_losses(
        self, step: int, m: int, outputs: dict[StageKey, torch.Tensor]
    ) -> tuple[
        dict[str, float],
        list[torch.Tensor],
        list[tuple[StageKey, torch.Tensor]],
        dict[str, torch.Tensor],
    ]:
        """The losses this rank scores from its own sink outputs, before any exchange: the
        loss shares per task, the loss tensors to back-propagate, the sink outputs as leaves
        (their gradients go back to the stages) and the readouts this rank sends in the loss
        phase (contrastive readouts and spread lm head inputs)."""
        shares: dict[str, float] = {}
        seeds: list[torch.Tensor] = []  # loss tensors to back-propagate
        sink_leaves: list[tuple[StageKey, torch.Tensor]] = []
        readouts: dict[str, torch.Tensor] = {}  # what this rank sends in the loss phase
        for task in self.tasks:
            if task.name not in self.active:
                continue
            shares[task.name] = 0.0
            for i, sink_id in enumerate(task.sinks):
                last = self.schedule.chain(sink_id)[-1]
                split = sink_id in self.schedule.vocab_split
                # a tensor-parallel group scores on its lead, or together split by vocabulary
                if self.rank not in (last.devices if split else last.leads):
                    continue
                key = (sink_id, last.index)
                y = outputs[key].detach().requires_grad_(outputs[key].requires_grad)
                sink_leaves.append((key, y))
                part = self._sink_loss(task, i, sink_id, step, m, last, y, readouts)
                if part is not None:  # each group counts its loss once, on its lead
                    _add_loss(shares, seeds, task.name, part, count=self.rank in last.leads)
        return shares, seeds, sink_leaves, readouts

    def _sink_loss(
        self,
        task: TaskInfo,
        i: int,
        sink_id: str,
        step: int,
        m: int,
        last: Stage,
        y: torch.Tensor,
        readouts: dict[str, torch.Tensor],
    ) -> torch.Tensor | None:
        """The loss of one sink scored here, or None where it is scored elsewhere (its readout
        or head inputs are put in ``readouts`` to send) or this micro-batch has no rows here."""
        lo, hi = self.rows(last, task.batch, m)
        if task.loss == "contrastive":
            with torch.set_grad_enabled(y.requires_grad):
                mask = self._sink_mask(sink_id, step, lo, hi)
                readouts[f"loss:{task.name}:{i}"] = L.readout(y, mask)
            return None
        if f"{LM_LOSS_FLOW}{sink_id}" in self.flow_by_key:  # scored on its loss devices
            where = self.lm_targets[sink_id]
            positions = y[:, where.offset : where.offset + where.count - 1]
            readouts[f"{LM_LOSS_FLOW}{sink_id}"] = positions.reshape(-1, y.shape[-1])
            return None
        if hi == lo:
            return None
        raw = self.data.rows(task.name, step, lo, hi)
        if task.loss == "lm":
            head = self.store[Part(head_module(self.graph.op(sink_id)), "head")]
            where = self.lm_targets[sink_id]
            targets = M.lm_targets(raw, where.modality, where.count)
            scored = self._scored(task.name, sink_id, step)
            if sink_id in self.schedule.vocab_split:
                ranks = last.group_of(self.rank)
                return L.vocab_parallel_lm_loss_part(
                    head, y, raw[where.modality], where, task.batch,
                    self.tp_groups[ranks], ranks.index(self.rank), last.tp,
                    targets=targets, scored=scored,
                )  # fmt: skip
            return L.lm_loss_part(
                head, y, raw[where.modality], where, task.batch, targets=targets, scored=scored
            )
        return L.mse_loss_part(y, raw[f"target:{sink_id}"], task.batch)

    def _gathered_losses(
        self,
        step: int,
        m: int,
        flows: tuple[Flow, ...],
        cache: ContrastiveCache | None,
        readouts: dict[str, torch.Tensor],
        shares: dict[str, float],
        seeds: list[torch.Tensor],
    ) -> dict[str, torch.Tensor]:
        """Exchange the loss-phase readouts and score what arrives here, adding to ``shares``
        and ``seeds``; returns the readouts received (as autograd leaves where they carry a
        gradient back)."""
        # Contrastive tasks gather both readouts of the whole batch on the loss device (unless
        # cached for the step); spread lm sinks re-split their head inputs over their loss
        # devices, which score the rows they receive.
        moving = flows if cache is None else tuple(f for f in flows if _lm_flow(f))
        gathered: dict[str, torch.Tensor] = {}
        if any(f.involves(self.rank) for f in moving):
            got = exchange(self.rank, moving, readouts, dtype=self.dtype, device=self.device)
            gathered = {k: v.requires_grad_(self.flow_by_key[k].backward) for k, v in got.items()}
        for f in moving:
            if _lm_flow(f) and f.key in gathered:
                task_name, part = self._score_rows(step, m, f, gathered[f.key])
                _add_loss(shares, seeds, task_name, part)
        if cache is None:
            for task in self.tasks:
                if task.loss == "contrastive" and f"loss:{task.name}:0" in gathered:
                    if task.name not in self.active:
                        continue
                    a, b = gathered[f"loss:{task.name}:0"], gathered[f"loss:{task.name}:1"]
                    _add_loss(shares, seeds, task.name, L.infonce(a, b))
        return gathered

    def _backward_readouts(
        self,
        m: int,
        flows: tuple[Flow, ...],
        cache: ContrastiveCache | None,
        readouts: dict[str, torch.Tensor],
        gathered: dict[str, torch.Tensor],
    ) -> None:
        """Send the gradients of the received readouts back to their senders (with a cache,
        this micro-batch's rows of the cached readout gradients too) and back-propagate the
        gradients that arrive here into this rank's readouts."""
        if cache is None:
            grads = {k: _grad_of(v) for k, v in gathered.items()}
        else:  # this micro-batch's rows of the cached whole-batch readout gradients
            grads = {
                f.key: cache.grads[f.key][slice(*self.micro_rows(f.batch_whole, m))]
                for f in flows
                if f.key in cache.grads
            }
            grads.update((k, _grad_of(v)) for k, v in gathered.items())
        back = exchange(self.rank, flows, grads, reverse=True, dtype=self.dtype, device=self.device)
        # (an empty shard's readout has no graph: nothing to propagate)
        pending = [(readouts[k], g) for k, g in back.items() if readouts[k].requires_grad]
        if pending:
            torch.autograd.backward([r for r, _ in pending], [g for _, g in pending])

    def _contrastive_cache(self, step: int) -> ContrastiveCache:
        """The contrastive losses of the whole batch and their readout gradients, from a
        forward without autograd of the contrastive tasks' MetaOps, micro-batch by
        micro-batch (each rank runs its stages of those tasks and their flows only)."""
        n = self.schedule.n_waves
        cached = self.contrastive & self.active
        pieces: dict[str, list[torch.Tensor]] = {}
        with torch.no_grad():
            for m in range(self.k):
                outputs: dict[StageKey, torch.Tensor] = {}
                leaves: dict[str, torch.Tensor] = {}
                for wave in range(n):
                    flows = tuple(f for f in self.flows[m][wave] if self.task_of_flow(f) in cached)
                    self._receive(flows, wave, outputs, leaves, pool=None)
                    stage = self.my_stage[wave]
                    if stage is None or self.graph.op(stage.metaop).task not in cached:
                        continue
                    with self._span("F (no grad)", "forward", stage, step, cache=True):
                        outputs[(stage.metaop, stage.index)] = self._forward(stage, step, m, leaves)
                readouts = {}
                for task in self.tasks:
                    if task.name not in cached:
                        continue
                    for i, sink_id in enumerate(task.sinks):
                        last = self.schedule.chain(sink_id)[-1]
                        if self.rank in last.leads:
                            mask = self._sink_mask(sink_id, step, *self.rows(last, task.batch, m))
                            readouts[f"loss:{task.name}:{i}"] = L.readout(
                                outputs[(sink_id, last.index)], mask
                            )
                flows = tuple(f for f in self.flows[m][n] if self.task_of_flow(f) in cached)
                if any(f.involves(self.rank) for f in flows):
                    with self.tracer.span(f"exchange {n} (cache)", "exchange"):
                        got = exchange(
                            self.rank, flows, readouts, dtype=self.dtype, device=self.device
                        )
                    for key, rows in got.items():
                        pieces.setdefault(key, []).append(rows)
        losses: dict[str, float] = {}
        grads: dict[str, torch.Tensor] = {}
        for task in self.tasks:
            keys = [f"loss:{task.name}:{i}" for i in range(2)]
            if task.name not in cached or keys[0] not in pieces:
                continue
            train = self.training
            a, b = (torch.cat(pieces[k]).requires_grad_(self.flow_by_key[k].backward and train)
                    for k in keys)  # fmt: skip
            with torch.set_grad_enabled(train), self.tracer.span("loss (cache)", "loss"):
                loss = L.infonce(a, b)
                if loss.requires_grad:
                    torch.autograd.backward(loss)
            losses[task.name] = float(loss.detach())
            for key, t in zip(keys, (a, b), strict=True):
                if t.requires_grad:
                    grads[key] = _grad_of(t)
        return ContrastiveCache(losses, grads)

    def _score_rows(
        self, step: int, m: int, flow: MicroFlow, hidden: torch.Tensor
    ) -> tuple[str, torch.Tensor]:
        """A spread lm sink's loss on the positions of pass ``m`` this rank received
        (``hidden``: one row per position the head reads, the pass's rows one after another):
        its task and this rank's share of the task's loss."""
        sink_id = flow.key[len(LM_LOSS_FLOW) :]
        task = self.graph.task(self.graph.op(sink_id).task)
        where = self.lm_targets[sink_id]
        per_row = where.count - 1
        lo, hi = flow.bounds(self.rank, source=False)
        first, end = lo // per_row, -(-hi // per_row)  # the batch rows those positions are in
        base = self.micro_rows(task.batch, m)[0]
        raw = self.data.rows(task.name, step, base + first, base + end)
        chosen = M.lm_targets(raw, where.modality, where.count)
        if chosen is None:
            chosen = raw[where.modality][:, 1 : where.count]
        targets = chosen.reshape(-1)[lo - first * per_row : hi - first * per_row]
        head = self.store[Part(head_module(self.graph.op(sink_id)), "head")]
        scored = self._scored(task.name, sink_id, step)
        # (inside the loss span; a category no step term sums, to see who scored what)
        with self.tracer.span(f"score {sink_id}", "loss rows", positions=hi - lo):
            part = L.lm_loss_positions(
                head, hidden, targets, scored if scored is not None else task.batch * per_row
            )
        return task.name, part

    def _sink_mask(self, sink_id: str, step: int, lo: int, hi: int) -> torch.Tensor | None:
        """The real positions of a sink's output on rows ``[lo, hi)`` (None: all real)."""
        op = self.graph.op(sink_id)
        lengths = M.lengths_of(self.data.extras_at(op.task, step, lo, hi))
        return M.output_mask(self.graph, op, lengths, hi - lo)

    def _scored(self, task: str, sink_id: str, step: int) -> int | None:
        """How many next-token targets an lm sink's whole batch scores at ``step`` (None:
        every one, the rows having no lengths or labels); computed once per step."""
        key = (id(self.data), task, sink_id, step)
        if key not in self._scored_at:
            batch = self.graph.task(task).batch
            where = self.lm_targets[sink_id]
            extras = self.data.extras_at(task, step, 0, batch)
            keep = M.target_scored(extras, where.modality, where.count)
            self._scored_at = {key: None if keep is None else M.scored(keep, batch, where.count)}
        return self._scored_at[key]

    # --- backward -----------------------------------------------------------------------------
    def _send_back(
        self,
        flows: tuple[Flow, ...],
        phase: int,
        leaves: dict[str, torch.Tensor],
        out_grads: dict[StageKey, torch.Tensor],
    ) -> None:
        if not any(f.involves(self.rank) and f.backward for f in flows):
            for f in flows:
                leaves.pop(f.key, None)
            return
        send = {f.key: _grad_of(leaves[f.key]) for f in flows if f.backward and self.rank in f.dst}
        with self.tracer.span(f"exchange {phase} (grad)", "exchange"):
            got = exchange(
                self.rank, flows, send, reverse=True, dtype=self.dtype, device=self.device
            )
        for key, grad in got.items():
            _accumulate(out_grads, self.flow_by_key[key].source, grad)
        for f in flows:
            leaves.pop(f.key, None)


@dataclass(frozen=True)
class MicroFlow(Flow):
    """A flow of one micro-batch pass: ``batch`` is the micro-batch, ``batch_whole`` the
    task's batch it was cut from."""

    batch_whole: int = 0


def _micro_flow(flow: Flow, k: int, m: int) -> MicroFlow:
    lo, hi = unit_bounds(flow.batch, k, flow.src_unit)[m]  # whole rows in each pass
    fields = {f.name: getattr(flow, f.name) for f in dataclasses.fields(Flow)}
    return MicroFlow(**{**fields, "batch": hi - lo}, batch_whole=flow.batch)


def _add_loss(
    shares: dict[str, float],
    seeds: list[torch.Tensor],
    task: str,
    loss: torch.Tensor,
    count: bool = True,
) -> None:
    """Count a loss in its task's share (unless another rank counts it: ``count``) and, where
    it has a graph, back-propagate it later."""
    if count:
        shares[task] += float(loss.detach())
    if loss.requires_grad:
        seeds.append(loss)


def _lm_flow(flow: Flow) -> bool:
    """Whether ``flow`` carries a spread lm sink's head inputs (``schedule.LM_LOSS_FLOW``)."""
    return flow.key.startswith(LM_LOSS_FLOW)


def _reads_raw(op) -> bool:
    return any(i.from_modality for i in op.inputs)


def _grad_of(t: torch.Tensor) -> torch.Tensor:
    return t.grad if t.grad is not None else torch.zeros_like(t)


def _accumulate(into: dict[StageKey, torch.Tensor], key: StageKey, grad: torch.Tensor) -> None:
    into[key] = into[key] + grad if key in into else grad
