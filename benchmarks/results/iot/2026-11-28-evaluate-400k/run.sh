#!/usr/bin/env bash
# 60 simulated series, 395,035 rows, through Kafka, the training job, the models topic
# and the scoring job; then the same series in one process, which must give the same files.
# Run from the checkout (its state directory holds the running broker): bash THIS_DIR/run.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
kappaflow-bench iot-corpus --devices 10 --days 4.65 --seed 11 --out /tmp/corpus400k
/usr/bin/time -v kappaflow iot evaluate --input /tmp/corpus400k --out /tmp/ev400/out \
    > "$here/result.json" 2> "$here/stderr.log"
kappaflow iot evaluate --input /tmp/corpus400k --out /tmp/ev400/local --path local \
    > "$here/result-local.json"
diff -rq /tmp/ev400/out /tmp/ev400/local && echo "the two paths wrote the same files"
