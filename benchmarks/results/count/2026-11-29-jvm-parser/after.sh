#!/bin/bash
. /tmp/kf-parse/env.sh; export KAPPAFLOW_MQTT__PORT=52883
K=/work/wt-parse/.venv/bin
out=/tmp/kf-parse/res/count-ab
cd /work/wt-parse
echo "== after $(date +%T) $(uptime)"
timeout 1500 $K/kappaflow-bench --state-dir /tmp/kf-parse/state count --measure ceiling,throughput --events 500000 --out $out/after-500k > $out/after-500k.console.log 2>&1
echo "rc $? $(date +%T) $(uptime)"
$K/kappaflow --state-dir /tmp/kf-parse/state down >/dev/null 2>&1
