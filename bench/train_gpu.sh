#!/usr/bin/env bash
# Measured step time of the default plan vs the sequential plan with NCCL under torchrun, on
# one or more GPUs (one or more nodes), beside the step time predicted from a GPU profile.
#
#   bench/train_gpu.sh [SPEC] [STEPS]
#
# Environment (all optional):
#   NGPU         GPUs per node to use (default: all that nvidia-smi lists)
#   NNODES       nodes (default 1); with more, also NODE_RANK, MASTER_ADDR, MASTER_PORT, and run
#                this script on every node at once (rank 0 plans and broadcasts the plan)
#   PRESET       cluster preset to plan for, e.g. H100-80GB (default: the spec's own)
#   DTYPE        float32 (default), float64, or bfloat16 (mixed precision: bf16 weights, fp32
#                master weights and AdamW state, which is what the planner's memory model assumes)
#   SHARDING     on (default: ZeRO-1, AdamW state sharded over each part's holders) or off
#   RECOMPUTE    plan (default: the MetaOps the plan marks), all or none
#   PY           the Python with spindle-dsl installed (default: .venv/bin/python, else python3)
#   OUT_DIR      where profiles, logs, traces and summaries go (default: out/train_gpu)
#
# Every rank trains on its own GPU (LOCAL_RANK); the layers are profiled on this node's GPU
# first, so "predicted" is the profile-fitted cost model's iteration time for the plan run.
# On a single GPU both plans run everything on device 0, so they should measure the same.
set -euo pipefail

cd "$(dirname "$0")/.."
SPEC=${1:-examples/tiny_mm.spindle}
STEPS=${2:-30}
if [[ -z "${PY:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
OUT_DIR=${OUT_DIR:-out/train_gpu}
DTYPE=${DTYPE:-float32}
SHARDING=${SHARDING:-on}
RECOMPUTE=${RECOMPUTE:-plan}
NNODES=${NNODES:-1}

if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "train_gpu.sh: torch sees no CUDA device here; use bench/train_cpu.py on CPUs" >&2
  exit 1
fi
if [[ -z "${NGPU:-}" ]]; then
  NGPU=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
fi
DEVICES=$((NNODES * NGPU))
mkdir -p "$OUT_DIR"

CLUSTER=(--devices "$DEVICES" --devices-per-node "$NGPU")
if [[ -n "${PRESET:-}" ]]; then CLUSTER+=(--device "$PRESET"); fi

if [[ "$NNODES" -gt 1 ]]; then
  : "${NODE_RANK:?set NODE_RANK for a multi-node run}" "${MASTER_ADDR:?set MASTER_ADDR}"
  LAUNCH=(--nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node "$NGPU"
          --master-addr "$MASTER_ADDR" --master-port "${MASTER_PORT:-29500}")
else
  LAUNCH=(--standalone --nnodes 1 --nproc-per-node "$NGPU")
fi

echo "== profiling $SPEC on this node's GPU (planned for $DEVICES devices)"
"$PY" -m spindle_dsl profile "$SPEC" --device cuda --devices "$DEVICES" \
  --devices-per-node "$NGPU" --out "$OUT_DIR/profile.json" --quiet

for SCHED in default sequential; do
  echo "== training $STEPS steps with the $SCHED plan on $DEVICES GPUs (NCCL)"
  "$PY" -m torch.distributed.run "${LAUNCH[@]}" -m spindle_dsl train "$SPEC" \
    "${CLUSTER[@]}" --profile "$OUT_DIR/profile.json" --scheduler "$SCHED" \
    --steps "$STEPS" --dtype "$DTYPE" --run-on cuda --no-progress \
    --optimizer-sharding "$SHARDING" --recompute "$RECOMPUTE" \
    --log-json "$OUT_DIR/log-$SCHED.jsonl" --trace "$OUT_DIR/trace-$SCHED.json" \
    --summary-json "$OUT_DIR/summary-$SCHED.json"
done

if [[ "${NODE_RANK:-0}" == 0 ]]; then
  "$PY" - "$OUT_DIR" "$SPEC" "$DEVICES" <<'EOF'
import json, sys
from pathlib import Path

out, spec, devices = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
rows = {s: json.loads((out / f"summary-{s}.json").read_text()) for s in ("default", "sequential")}
print(f"\n{Path(spec).name} on {devices} GPUs (NCCL), median step time after the first step")
print(
    f"{'plan':<12}{'scheduler':<12}{'predicted s':>13}{'measured s':>12}{'measured/pred':>15}"
    f"{'optimizer MiB/rank (max)':>26}"
)
for name, r in rows.items():
    m, p = r["measured_step_s"], r["predicted_step_s"]
    held = max(r.get("optimizer_state_bytes") or [0]) / 2**20
    print(f"{name:<12}{str(r['scheduler']):<12}{p:>13.5f}{m:>12.5f}{m / p:>15.2f}{held:>26.2f}")
d, s = rows["default"], rows["sequential"]
print(
    f"default vs sequential: measured speed-up {s['measured_step_s'] / d['measured_step_s']:.2f}x,"
    f" predicted {s['predicted_step_s'] / d['predicted_step_s']:.2f}x"
)
EOF
fi
