#!/usr/bin/env bash
# Where a decode step's time goes, kernel by kernel, on the GPU machine (carry .carry/gpu, made
# by tools/gpu_build.sh): ncu over `tessera bench --random-weights` at batch 1, profiling each
# kernel node of the replayed decode graphs (--graph-profiling node) after the warm-up, with the
# clocks left alone (METHOD.md). Writes $OUT/profile_<shape>.csv (one row per kernel: name,
# duration, DRAM throughput, SM throughput) and prints the per-kernel summary, largest first.
#   SHAPES="qwen3-0.6b llama-8b" SKIP=3000 COUNT=600 bash tools/gpu_profile_decode.sh
set -uo pipefail
[ -d .carry/gpu/bin ] || tar -C .carry/gpu -xJf .carry/gpu/bin.tar.xz
[ -d .carry/gpu/lib ] || tar -C .carry/gpu -xJf .carry/gpu/lib.tar.xz
export LD_LIBRARY_PATH=$PWD/.carry/gpu/lib:${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/gpu_profile}
mkdir -p "$OUT"
W=$(mktemp -d)
# The configs of tools/gpu_roof_bench.sh (the hf_baseline shapes).
sed -n '/^cat >"\$W\/llama-8b\/config.json"/,/^JSON$/p' tools/gpu_roof_bench.sh | sed '1d;$d' \
  >"$W/llama-8b.json"
sed -n '/^cat >"\$W\/qwen3-0.6b\/config.json"/,/^JSON$/p' tools/gpu_roof_bench.sh | sed '1d;$d' \
  >"$W/qwen3-0.6b.json"
for shape in ${SHAPES:-qwen3-0.6b llama-8b}; do
  mkdir -p "$W/$shape" && cp "$W/$shape.json" "$W/$shape/config.json"
  timeout "${TIMEOUT:-240}" ncu --clock-control none --graph-profiling node \
    --launch-skip "${SKIP:-3000}" --launch-count "${COUNT:-600}" \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed \
    --csv --page raw --print-units base \
    .carry/gpu/bin/tessera bench --model "$W/$shape" --random-weights --device cuda \
    --max-model-len 4096 --max-num-seqs 1 --batch-size 1 --input-len 32 --output-len 128 \
    --iterations 1 >"$OUT/profile_$shape.csv" 2>"$OUT/profile_$shape.err"
  python3 - "$OUT/profile_$shape.csv" "$shape" <<'PY'
import collections, csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
head = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
if head is None:
    sys.exit(f"{sys.argv[2]}: no ncu rows (see the .err file)")
cols = rows[head]
name, dur = cols.index("Kernel Name"), cols.index("gpu__time_duration.sum")
total = collections.defaultdict(float); count = collections.Counter()
for r in rows[head + 2:]:
    try:
        total[r[name]] += float(r[dur]); count[r[name]] += 1
    except (ValueError, IndexError):
        pass
all_ns = sum(total.values())
print(f"{sys.argv[2]}: {sum(count.values())} kernels, {all_ns / 1e3:.1f} us in all")
for k, v in sorted(total.items(), key=lambda kv: -kv[1])[:25]:
    print(f"  {v / all_ns:6.1%} {v / 1e3:10.1f} us  {count[k]:5d} x  {k[:90]}")
PY
done
rm -rf "$W"
