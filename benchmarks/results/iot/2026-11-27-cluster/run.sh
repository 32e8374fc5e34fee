#!/usr/bin/env bash
# The IoT demo (gateway, MQTT, the application's job, the simulator) with its job on a
# Spark standalone cluster: a master and one worker (2 cores, 3 GiB) from PySpark's own
# distribution, on this machine, so that the job's tasks run in an executor JVM of the
# worker, not in the driver. Usage, from the repository, after `make setup`:
#
#   docs/results/iot/2026-11-27-cluster/run.sh OUT_DIR [DURATION]
#
# Writes OUT_DIR/demo.json (the demo's summary), demo.err (its terminal), the master's and
# worker's logs, the executor's stderr and the cluster's state (master.json).
set -euo pipefail
out=$(realpath -m "$1"); duration=${2:-5m}
mkdir -p "$out"
repo=$(pwd)
home=$(.venv/bin/python -c 'import pyspark, os; print(os.path.dirname(pyspark.__file__))')
state=$(mktemp -d /tmp/kf-cluster.XXXX)
port=17077; ui=18080
export SPARK_HOME=$home SPARK_LOG_DIR=$state/logs SPARK_LOCAL_IP=127.0.0.1
"$home/bin/spark-class" org.apache.spark.deploy.master.Master --host 127.0.0.1 \
  --port $port --webui-port $ui > "$out/master.log" 2>&1 &
master=$!
"$home/bin/spark-class" org.apache.spark.deploy.worker.Worker spark://127.0.0.1:$port \
  --host 127.0.0.1 --cores 2 --memory 3g --webui-port 18081 --work-dir "$state/work" \
  > "$out/worker.log" 2>&1 &
worker=$!
trap 'kill $worker $master 2>/dev/null || true' EXIT
for _ in $(seq 120); do
  curl -sf http://127.0.0.1:$ui/json/ | grep -q '"aliveworkers" *: *1' && break
  sleep 1
done
unset SPARK_HOME SPARK_LOG_DIR
export KAPPAFLOW_JARS_DIR=$repo/.kappaflow/jars KAPPAFLOW_KAFKA__PORT=19192 \
  KAPPAFLOW_KAFKA__CONTROLLER_PORT=19193 KAPPAFLOW_REDIS__PORT=16479 KAPPAFLOW_MQTT__PORT=11984
date -u +%FT%TZ > "$out/started.txt"
.venv/bin/kappaflow --state-dir "$state/kf" --spark-master spark://127.0.0.1:$port \
  iot demo --duration "$duration" --port 0 > "$out/demo.json" 2> "$out/demo.err" || echo "demo exit $?" >> "$out/demo.err"
date -u +%FT%TZ > "$out/ended.txt"
curl -sf http://127.0.0.1:$ui/json/ > "$out/master.json" || true
find "$state/work" -name stderr -path '*app-*' -exec sh -c 'cat "$1" >> "$2/executor-stderr.txt"' _ {} "$out" \;
cp "$state"/kf/jobs/*/driver.log "$out/" 2>/dev/null || true
.venv/bin/kappaflow --state-dir "$state/kf" down >/dev/null 2>&1 || true
