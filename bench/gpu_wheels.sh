#!/usr/bin/env bash
# Fetch, here, the wheels bench/gpu_check.sh installs on a lent GPU machine that has PyTorch
# but not the planner's own dependencies (and cannot reach a package index itself).
#
#   bench/gpu_wheels.sh [DIR]      # default DIR: .whl (ignored by git; carry it to the machine)
#
# The lent machines run CPython 3.12 on x86-64 with torch, numpy, matplotlib, safetensors,
# pytest and hypothesis already installed; what the project needs beside those is below, pinned
# to the versions this project's CI installs, so both run the same code (3 MB in all). Left out:
# cbcbox, the CBC binaries python-mip uses only for the cbc solver (190 MB, past the device
# tool's 64 MiB); the planner's default solver, HiGHS, comes with highspy. The project itself
# needs no wheel: imported from the checkout, it finds grammar/ and backends/ (_checkout.py).
set -euo pipefail

cd "$(dirname "$0")/.."
DIR=${1:-.whl}
PY=${PY:-python3}
WHEELS=(
  lark==1.3.1
  mip==2.0.0
  highspy==1.14.0
  cffi==2.1.1
  pycparser==3.12
  graphviz==0.21
)
mkdir -p "$DIR"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 \
  manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platforms[@]}" -d "$DIR" "${WHEELS[@]}"
ls -1 "$DIR"
du -sh "$DIR"
