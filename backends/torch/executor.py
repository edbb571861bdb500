"""One training step on one rank: forward wave by wave, the losses, backward in reverse.

Forward, for each wave in order: run the wave's exchange phase (every flow whose consumer is in
this wave; the rows of each arrive as a leaf tensor), then the stage this rank runs in the wave
on its data-parallel shard. The losses follow (a contrastive task first gathers its readouts).
Backward, for each wave in reverse: back-propagate this rank's stage from the gradient its
output collected, then send each received leaf's gradient back along its flow, where the
producer adds it to its own output gradient. Parameter gradients accumulate in ``.grad`` over
every stage and task; reducing and stepping them is the caller's business.

A stage's autograd graph spans only its own layers (inputs are leaves), so backward of a wave
needs nothing from any other rank beyond the output gradients already delivered.

Activation recompute: the layers of a MetaOp in ``recompute`` run one by one under
``torch.utils.checkpoint`` (non-reentrant) whenever they build a graph, so only each layer's
input stays alive between forward and backward and the layer runs its forward again inside
the backward. The recomputed forward is the same computation on the same input, so gradients
are bit for bit those without recompute; input stages and LM heads always run plainly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

from spindle_dsl.errors import ExecutionError
from spindle_dsl.metagraph import MetaGraph

from . import losses as L
from .data import TaskData
from .exchange import exchange
from .params import PartStore
from .parts import Part, head_module
from .schedule import Schedule, Stage, layer_module, shape_after
from .trace import Tracer

StageKey = tuple[str, int]


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
    ):
        self.graph, self.schedule, self.rank = graph, schedule, rank
        self.recompute = recompute
        self.store, self.data, self.dtype, self.device = store, data, dtype, device
        self.tracer = tracer or Tracer(rank, enabled=False)
        self.beat = heartbeat or (lambda _what: None)
        self.tasks = [t for t in graph.tasks if t.batch > 0]
        for task in self.tasks:
            L.check_task(graph, task)
        self.lm_targets = {
            s: L.lm_target(graph, s) for t in self.tasks if t.loss == "lm" for s in t.sinks
        }
        self.my_stage = {w: schedule.stage_of(rank, w) for w in range(schedule.n_waves)}
        self.flow_by_key = {f.key: f for f in schedule.flows}

    # --- one step -------------------------------------------------------------------------------
    def run(self, step: int) -> dict[str, float]:
        """Forward and backward of step ``step`` (0-based); returns this rank's share of each
        task's loss (the shares of all ranks add up to the task's mean loss)."""
        outputs: dict[StageKey, torch.Tensor] = {}
        leaves: dict[str, torch.Tensor] = {}
        for wave in range(self.schedule.n_waves):
            self.beat(f"step {step + 1} wave {wave} forward")
            self._receive(wave, outputs, leaves)
            stage = self.my_stage[wave]
            if stage is not None:
                with self.tracer.span(
                    f"F {stage.metaop} [{stage.first},{stage.end})",
                    "forward",
                    step=step + 1,
                    metaop=stage.metaop,
                    stage=stage.index,
                    wave=wave,
                ):
                    outputs[(stage.metaop, stage.index)] = self._forward(stage, step, leaves)
        self.beat(f"step {step + 1} loss")
        with self.tracer.span("loss", "loss"):
            shares, out_grads = self._losses(step, outputs)
        for wave in reversed(range(self.schedule.n_waves)):
            self.beat(f"step {step + 1} wave {wave} backward")
            stage = self.my_stage[wave]
            if stage is not None:
                key = (stage.metaop, stage.index)
                out = outputs.pop(key)
                if out.requires_grad:
                    with self.tracer.span(
                        f"B {stage.metaop} [{stage.first},{stage.end})",
                        "backward",
                        step=step + 1,
                        metaop=stage.metaop,
                        stage=stage.index,
                        wave=wave,
                    ):
                        grad = out_grads.pop(key, None)
                        torch.autograd.backward(
                            out, grad if grad is not None else torch.zeros_like(out)
                        )
            self._send_back(wave, leaves, out_grads)
        return shares

    # --- forward ------------------------------------------------------------------------------
    def _receive(
        self, phase: int, outputs: dict[StageKey, torch.Tensor], leaves: dict[str, torch.Tensor]
    ) -> None:
        flows = self.schedule.flows_into(phase)
        if not any(f.involves(self.rank) for f in flows):
            return
        send = {f.key: outputs[f.source] for f in flows if self.rank in f.src}
        with self.tracer.span(f"exchange {phase}", "exchange"):
            got = exchange(self.rank, flows, send, dtype=self.dtype, device=self.device)
        for key, tensor in got.items():
            leaves[key] = tensor.requires_grad_(self.flow_by_key[key].backward)

    def _forward(self, stage: Stage, step: int, leaves: dict[str, torch.Tensor]) -> torch.Tensor:
        op = self.graph.op(stage.metaop)
        lo, hi = stage.rows(op.batch, self.rank)
        want = (hi - lo, *shape_after(self.graph, op, stage.end - 1))
        if hi == lo:
            return torch.zeros(want, dtype=self.dtype, device=self.device)
        with torch.set_grad_enabled(op.needs_backward):
            if stage.index == 0:
                raw = self.data.rows(op.task, step, lo, hi) if _reads_raw(op) else {}
                pieces = []
                for i, inp in enumerate(op.inputs):
                    if inp.from_modality:
                        stage_in = self.store[Part(op.segments[0][0], f"input.{inp.source}")]
                        pieces.append(stage_in(raw[inp.source][:, : inp.tokens]))
                    else:
                        pieces.append(leaves[f"{op.id}<{i}"])
                x = torch.cat(pieces, dim=1) if len(pieces) > 1 else pieces[0]
            else:
                x = leaves[f"{op.id}#{stage.index}"]
            again = op.id in self.recompute and torch.is_grad_enabled()
            for g in range(stage.first, stage.end):
                module, j = layer_module(op, g)
                layer = self.store[Part(module, f"layer.{j}")]
                x = checkpoint(layer, x, use_reentrant=False) if again else layer(x)
        if tuple(x.shape) != want:
            raise ExecutionError(
                f"{op.id} layers [{stage.first}, {stage.end}) of kind {op.kind} produced shape "
                f"{tuple(x.shape)}; the runtime expected {want} from the kind's out_tokens and "
                f"out_width"
            )
        return x

    # --- losses -------------------------------------------------------------------------------
    def _losses(
        self, step: int, outputs: dict[StageKey, torch.Tensor]
    ) -> tuple[dict[str, float], dict[StageKey, torch.Tensor]]:
        shares: dict[str, float] = {}
        seeds: list[torch.Tensor] = []  # loss tensors to back-propagate
        sink_leaves: list[tuple[StageKey, torch.Tensor]] = []
        readouts: dict[str, torch.Tensor] = {}
        for task in self.tasks:
            shares[task.name] = 0.0
            for i, sink_id in enumerate(task.sinks):
                last = self.schedule.chain(sink_id)[-1]
                if self.rank not in last.devices:
                    continue
                key = (sink_id, last.index)
                y = outputs[key].detach().requires_grad_(outputs[key].requires_grad)
                sink_leaves.append((key, y))
                lo, hi = last.rows(task.batch, self.rank)
                if task.loss == "contrastive":
                    with torch.set_grad_enabled(y.requires_grad):
                        readouts[f"loss:{task.name}:{i}"] = L.readout(y)
                    continue
                if hi == lo:
                    continue
                raw = self.data.rows(task.name, step, lo, hi)
                if task.loss == "lm":
                    head = self.store[Part(head_module(self.graph.op(sink_id)), "head")]
                    where = self.lm_targets[sink_id]
                    part = L.lm_loss_part(head, y, raw[where.modality], where, task.batch)
                else:
                    part = L.mse_loss_part(y, raw[f"target:{sink_id}"], task.batch)
                shares[task.name] += float(part.detach())
                if part.requires_grad:
                    seeds.append(part)
        # Contrastive tasks: gather both readouts of the whole batch on the task's loss device.
        phase = self.schedule.n_waves
        flows = self.schedule.flows_into(phase)
        gathered: dict[str, torch.Tensor] = {}
        if any(f.involves(self.rank) for f in flows):
            got = exchange(self.rank, flows, readouts, dtype=self.dtype, device=self.device)
            gathered = {k: v.requires_grad_(self.flow_by_key[k].backward) for k, v in got.items()}
        for task in self.tasks:
            if task.loss == "contrastive" and f"loss:{task.name}:0" in gathered:
                a, b = gathered[f"loss:{task.name}:0"], gathered[f"loss:{task.name}:1"]
                loss = L.infonce(a, b)
                shares[task.name] += float(loss.detach())
                if loss.requires_grad:
                    seeds.append(loss)
        if seeds:
            torch.autograd.backward(seeds)
        if any(f.involves(self.rank) and f.backward for f in flows):
            grads = {k: _grad_of(v) for k, v in gathered.items()}
            back = exchange(
                self.rank, flows, grads, reverse=True, dtype=self.dtype, device=self.device
            )
            # (an empty shard's readout has no graph: nothing to propagate)
            pending = [(readouts[k], g) for k, g in back.items() if readouts[k].requires_grad]
            if pending:
                torch.autograd.backward([r for r, _ in pending], [g for _, g in pending])
        out_grads: dict[StageKey, torch.Tensor] = {}
        for key, y in sink_leaves:
            if y.grad is not None:
                _accumulate(out_grads, key, y.grad)
        return shares, out_grads

    # --- backward -----------------------------------------------------------------------------
    def _send_back(
        self, phase: int, leaves: dict[str, torch.Tensor], out_grads: dict[StageKey, torch.Tensor]
    ) -> None:
        flows = self.schedule.flows_into(phase)
        if not any(f.involves(self.rank) and f.backward for f in flows):
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


def _reads_raw(op) -> bool:
    return any(i.from_modality for i in op.inputs)


def _grad_of(t: torch.Tensor) -> torch.Tensor:
    return t.grad if t.grad is not None else torch.zeros_like(t)


def _accumulate(into: dict[StageKey, torch.Tensor], key: StageKey, grad: torch.Tensor) -> None:
    into[key] = into[key] + grad if key in into else grad
