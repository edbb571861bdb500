#!/usr/bin/env bash
# The GPU checks (the CUDA memory path, NCCL training against its prediction) as one prepared
# run, for a GPU machine lent for a short time (the device tool: one H200, 15 minutes of device
# time in all, a bare machine with PyTorch but without this project's other dependencies and
# without a package index).
#
#   here:   bench/gpu_wheels.sh                       # once: the wheels, into .whl (ignored)
#   there:  run(command="bash bench/gpu_check.sh", carry=[".whl"], timeout_s=540)
#
# It installs the wheels, then, each step bounded in time so that one slow step cannot eat the
# lease: the tests marked `gpu` (the CUDA memory path), and per spec bench/train_gpu.sh (which
# runs `spindle profile --device cuda`, then the default and the sequential plan under torchrun
# with NCCL, and prints predicted against measured step time). The log, the profiles and the
# run summaries go to $OUT (the device tool's folder that comes back, at most 8 files: two specs
# fit) or out/gpu_check. Specs: $SPECS (paths in the repository; ../shared does not travel to
# the device machine, so copy a spec from it into the repository first), by default the bundled
# tiny_mm and wide_adapters.
set -uo pipefail

cd "$(dirname "$0")/.."
OUT_DIR=${OUT:-out/gpu_check}  # what comes back: at most 8 files, so only the key ones
WORK=${WORK:-/tmp/gpu_check}   # everything train_gpu.sh writes (traces are large)
PY=${PY:-python3}
STEPS=${STEPS:-20}
SPECS=${SPECS:-examples/tiny_mm.spindle bench/specs/wide_adapters.spindle}
mkdir -p "$OUT_DIR" "$WORK"
exec > >(tee "$OUT_DIR/gpu_check.log") 2>&1
TEE=$!
trap 'exec >&- 2>&-; wait "$TEE"' EXIT  # the log whole before the files go back
export PYTHONUNBUFFERED=1
export SPINDLE_SOLVER=highs  # the wheels carry HiGHS, not CBC (bench/gpu_wheels.sh)

if compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || { echo "gpu_check: installing .whl failed"; exit 1; }
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
if ! "$PY" -c 'import lark, mip, spindle_dsl' 2> /dev/null; then
  echo "gpu_check: spindle_dsl's dependencies are missing; run bench/gpu_wheels.sh here and" \
    "carry .whl"
  exit 1
fi
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2> /dev/null; then
  echo "gpu_check: no torch with a CUDA device here; nothing to check"
  exit 1
fi
"$PY" -c 'import torch; print("torch", torch.__version__, "on", torch.cuda.get_device_name(0))'
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

status=0
step() {  # step SECONDS NAME COMMAND...: run it, bounded, and remember a failure
  local limit=$1 name=$2
  shift 2
  echo "== $name (at most ${limit} s)"
  local t0=$SECONDS
  timeout "$limit" "$@"
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - t0)) s"
  [[ $rc -eq 0 ]] || status=1
}

# only the files that hold such tests: collecting the others would import the notebook
# packages, which the machine has not
mapfile -t marked < <(grep -rl "pytest.mark.gpu" tests)
step 90 "tests marked gpu" "$PY" -m pytest -q -m gpu -p no:cacheprovider "${marked[@]}"
for spec in $SPECS; do
  name=$(basename "$spec" .spindle)
  # train_gpu.sh profiles the spec on this GPU (`spindle profile --device cuda`) first
  step 200 "profile and train $name (default and sequential plans, NCCL)" \
    env NGPU=1 PY="$PY" OUT_DIR="$WORK/$name" bash bench/train_gpu.sh "$spec" "$STEPS"
  for f in profile.json summary-default.json summary-sequential.json; do
    [[ -f "$WORK/$name/$f" ]] && cp "$WORK/$name/$f" "$OUT_DIR/$name-$f"
  done
done
echo "gpu_check: done (exit $status); the profiles and run summaries are in $OUT_DIR, the" \
  "logs and traces in $WORK"
exit "$status"
