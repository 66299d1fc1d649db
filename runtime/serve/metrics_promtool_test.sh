#!/bin/bash
# Checks that ServingMetrics::Render() is valid Prometheus text format 0.0.4 and lint-clean
# (promtool_check.sh: only vLLM's own naming findings are allowed), and that the checker
# itself fails on a lint problem and on a parse error. Skips (exit 0) when promtool (Debian
# package `prometheus`) is not installed.
set -u
RUNFILES="${TEST_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
DIR="$RUNFILES/tessera/runtime/serve"
CHECK="$DIR/promtool_check.sh"
TMP="${TEST_TMPDIR:-$(mktemp -d)}/metrics_promtool_test"
mkdir -p "$TMP"

"$CHECK" /dev/null >"$TMP/probe.out" 2>&1
if [[ $? -eq 2 ]]; then
  echo "SKIP: $(cat "$TMP/probe.out"); nothing checked."
  exit 0
fi

if ! "$DIR/metrics_dump" >"$TMP/metrics.txt"; then
  echo "FAIL: metrics_dump exited with status $?"
  exit 1
fi
# Every family the server exposes must be in the dump, or the check proves little.
for family in vllm:num_requests_running vllm:num_requests_waiting vllm:kv_cache_usage_perc \
    vllm:prefix_cache_queries_total vllm:prefix_cache_hits_total vllm:num_preemptions_total \
    vllm:prompt_tokens_total vllm:generation_tokens_total vllm:request_success_total \
    vllm:e2e_request_latency_seconds vllm:request_queue_time_seconds \
    vllm:request_prefill_time_seconds vllm:request_decode_time_seconds \
    vllm:request_inference_time_seconds vllm:time_to_first_token_seconds \
    vllm:inter_token_latency_seconds vllm:request_prompt_tokens \
    vllm:request_generation_tokens vllm:iteration_tokens_total vllm:request_params_max_tokens \
    vllm:request_params_n tessera_kv_blocks_used tessera_kv_blocks_free \
    tessera_engine_steps_total tessera_engine_step_seconds_total tessera_requests_total \
    tessera_http_connections tessera_http_threads tessera_http_connections_refused_total \
    process_cpu_seconds_total process_resident_memory_bytes process_virtual_memory_bytes \
    process_start_time_seconds process_open_fds process_max_fds; do
  if ! grep -q "^# TYPE $family " "$TMP/metrics.txt"; then
    echo "FAIL: the dump has no family $family"
    cat "$TMP/metrics.txt"
    exit 1
  fi
done
for reason in stop length abort error; do
  if ! grep -q "^vllm:request_success_total{model_name=\"stories260K\",finished_reason=\"$reason\"} 1$" \
      "$TMP/metrics.txt"; then
    echo "FAIL: no vllm:request_success_total sample of 1 for finished_reason=$reason"
    exit 1
  fi
done

if ! "$CHECK" "$TMP/metrics.txt"; then
  echo "--- input ---"
  cat "$TMP/metrics.txt"
  echo "FAIL: promtool_check rejected the dump"
  exit 1
fi

# The checker must catch what it is there for: a lint problem on a vllm: name (a counter
# without _total), one on another name, and a parse error.
sed 's/vllm:num_preemptions_total/vllm:num_preemptions/' "$TMP/metrics.txt" >"$TMP/bad1.txt"
sed 's/process_cpu_seconds_total/process_cpu_seconds/' "$TMP/metrics.txt" >"$TMP/bad2.txt"
{ cat "$TMP/metrics.txt"; echo 'tessera_broken{le="1" 3'; } >"$TMP/bad3.txt"
for bad in bad1 bad2 bad3; do
  if "$CHECK" "$TMP/$bad.txt" >"$TMP/$bad.out" 2>&1; then
    echo "FAIL: promtool_check accepted $bad.txt"
    exit 1
  fi
done
echo "PASS: promtool check metrics accepted $(wc -l <"$TMP/metrics.txt") lines; it rejects a lint problem and a parse error."
