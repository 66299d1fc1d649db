#!/bin/bash
# README command 1: install, build, and tell a story with the demo checkpoint on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bazel build //launch:tessera
model=../shared/models/stories260K
bazel-bin/launch/tessera generate --model "$model" --prompt "Once upon a time" \
  --max-tokens 256 --temperature 0 "$@"
