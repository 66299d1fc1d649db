#!/bin/bash
# Checks docs/grafana/tessera-dashboard.json: valid JSON with a datasource and a model_name
# variable; every panel queries the datasource variable; every metric an expression names is
# one that Tessera exposes (the sample names of //runtime/serve:metrics_dump, which renders
# every family), and every Tessera/vLLM family is filtered by model_name; the panels the
# deploy docs promise are there. Then the same check must reject a copy with a misspelled
# family, so that it can fail.
set -u
RUNFILES="${TEST_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
DASH="$RUNFILES/tessera/docs/grafana/tessera-dashboard.json"
DUMP="$RUNFILES/tessera/runtime/serve/metrics_dump"
TMP="${TEST_TMPDIR:-$(mktemp -d)}/dashboard_test"
mkdir -p "$TMP"
"$DUMP" >"$TMP/metrics.txt" || { echo "FAIL: metrics_dump failed"; exit 1; }
python3 -m json.tool "$DASH" >/dev/null || { echo "FAIL: not valid JSON: $DASH"; exit 1; }

cat >"$TMP/check.py" <<'PY'
import json, re, sys

dash = json.load(open(sys.argv[1]))
exposed = set()
for line in open(sys.argv[2]):
    if line.startswith("#") or not line.strip():
        continue
    exposed.add(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0))
errors = []
variables = {v["name"]: v for v in dash["templating"]["list"]}
if variables.get("datasource", {}).get("type") != "datasource" or \
        variables["datasource"].get("query") != "prometheus":
    errors.append("no Prometheus datasource variable")
if "model_name" not in variables:
    errors.append("no model_name variable")
elif "model_name" not in json.dumps(variables["model_name"]["query"]):
    errors.append("the model_name variable does not list model_name values")
exprs = []
for p in dash["panels"]:
    if p["type"] == "row":
        continue
    if p.get("datasource", {}).get("uid") != "${datasource}":
        errors.append(f"panel {p['title']!r} does not use ${{datasource}}")
    if not p.get("targets"):
        errors.append(f"panel {p['title']!r} has no query")
    for t in p.get("targets", []):
        if t.get("datasource", {}).get("uid") != "${datasource}":
            errors.append(f"a query of {p['title']!r} does not use ${{datasource}}")
        expr = t.get("expr", "")
        if not expr:
            errors.append(f"panel {p['title']!r} has an empty expression")
        exprs.append(expr)
        # Metric names: identifiers outside label matchers and strings that look like ours.
        bare = re.sub(r'\{[^}]*\}|"[^"]*"|\[[^\]]*\]', " ", expr)
        for name in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", bare):
            if not re.match(r"(vllm:|tessera_|process_)", name):
                continue
            if name not in exposed:
                errors.append(f"panel {p['title']!r}: {name} is not exposed")
            if not name.startswith("process_") and \
                    not re.search(re.escape(name) + r'\{[^}]*model_name=~"\$model_name"', expr):
                errors.append(f"panel {p['title']!r}: {name} is not filtered by $model_name")
all_exprs = "\n".join(exprs)
for needed in ["vllm:request_success_total", "vllm:num_requests_running",
               "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
               "vllm:time_to_first_token_seconds_bucket",
               "vllm:inter_token_latency_seconds_bucket",
               "vllm:e2e_request_latency_seconds_bucket",
               "vllm:request_queue_time_seconds_bucket",
               "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
               "vllm:request_prompt_tokens_bucket", "vllm:request_generation_tokens_bucket",
               "vllm:iteration_tokens_total_bucket", "process_resident_memory_bytes",
               "process_cpu_seconds_total", "histogram_quantile(0.5", "histogram_quantile(0.99"]:
    if needed not in all_exprs:
        errors.append(f"no panel queries {needed}")
for e in errors:
    print("dashboard:", e)
sys.exit(1 if errors else 0)
PY

if ! python3 "$TMP/check.py" "$DASH" "$TMP/metrics.txt"; then
  echo "FAIL: the dashboard does not read what Tessera exposes"
  exit 1
fi
sed 's/vllm:kv_cache_usage_perc/vllm:gpu_cache_usage_perc/' "$DASH" >"$TMP/bad.json"
if python3 "$TMP/check.py" "$TMP/bad.json" "$TMP/metrics.txt" >"$TMP/bad.out"; then
  echo "FAIL: the check accepted a dashboard naming vllm:gpu_cache_usage_perc"
  exit 1
fi
grep -q "vllm:gpu_cache_usage_perc is not exposed" "$TMP/bad.out" ||
  { echo "FAIL: the check did not say why: $(cat "$TMP/bad.out")"; exit 1; }
echo "PASS: the dashboard's $(grep -c '"expr"' "$DASH") queries read exposed families."
