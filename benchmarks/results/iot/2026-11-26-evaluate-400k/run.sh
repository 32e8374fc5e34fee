#!/usr/bin/env bash
# 60 simulated series, 395,035 rows, through Kafka, the training job, the models topic
# and the scoring job; then the same series in one process, which must give the same files.
set -euo pipefail
kappaflow-bench iot-corpus --devices 10 --days 4.65 --seed 11 --out /tmp/corpus400k
/usr/bin/time -v kappaflow iot evaluate --input /tmp/corpus400k --out /tmp/ev400/out \
    > result.json 2> stderr.log
kappaflow iot evaluate --input /tmp/corpus400k --out /tmp/ev400/local --path local
diff -rq /tmp/ev400/out /tmp/ev400/local && echo "the two paths wrote the same files"
