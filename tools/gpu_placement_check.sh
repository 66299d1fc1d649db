#!/usr/bin/env bash
# Runs on the 2-GPU machine (carry .carry/gpu from tools/gpu_build.sh): GPU selection from the
# local rank and --gpus-per-node, and the startup log, with real devices (issue 9).
set -u
[ -d .carry/gpu/lib ] || tar -C .carry/gpu -xJf .carry/gpu/lib.tar.xz
export LD_LIBRARY_PATH=$PWD/.carry/gpu/lib:${LD_LIBRARY_PATH:-}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
T=.carry/gpu/bin/tessera
M=.carry/gpu/stories260K
G=(generate --model "$M" --device cuda --dtype float32 --prompt "Once upon a time"
  --max-tokens 24 --temperature 0)
nvidia-smi --query-gpu=index,name --format=csv,noheader
echo "== one process"
"$T" "${G[@]}" 2>/dev/null | tee /tmp/ref
# The last three must fail with one clear line per rank: more ranks than GPUs (NCCL would
# refuse two ranks of a group on one GPU), and more GPUs asked for than visible.
for case in "2 --tp 2 --gpus-per-node 2" "2 --pp 2" "4 --tp 2 --pp 2" "2 --tp 2 --gpus-per-node 1" \
  "2 --tp 2 --gpus-per-node 3"; do
  set -- $case
  np=$1
  shift
  echo "== mpirun -np $np $*"
  timeout 120 mpirun -np "$np" --bind-to none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH "$T" \
    "${G[@]}" "$@" >/tmp/out 2>/tmp/err
  echo "exit $?; same text as one process: $(cmp -s /tmp/out /tmp/ref && echo yes || echo no)"
  grep -E "^\[tessera\] (grid|  rank|warning)|^tessera: " /tmp/err | head -8
done
