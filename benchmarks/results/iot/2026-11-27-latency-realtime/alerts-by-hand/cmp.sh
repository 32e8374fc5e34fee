set -x
export KAPPAFLOW_STATE_DIR=/tmp/kf-cmp KAPPAFLOW_JARS_DIR=/work/main/.kappaflow/jars KAPPAFLOW_KAFKA__PORT=19192 KAPPAFLOW_KAFKA__CONTROLLER_PORT=19193 KAPPAFLOW_REDIS__PORT=16479 KAPPAFLOW_MQTT__PORT=11984 KAPPAFLOW_API__PORT=18780
K=/work/main/.venv/bin/kappaflow
rm -rf /tmp/kf-cmp
$K up
$K iot register --fleet 200
$K topics create telemetry.raw --partitions 2
$K topics create devices.events --partitions 2
$K topics create telemetry.clean --partitions 2
$K topics create models --partitions 2 --config cleanup.policy=compact
$K topics create scores --partitions 2
$K topics create scores-rt --partitions 2
$K jobs start cmp --app kappaflow.iot.app:build -P parts=clean,train,score
$K jobs start cmp-rt --app kappaflow.iot.realtime:PIPELINE -P readings=raw -P dest=scores-rt
$K iot simulate --devices 200 --rate 250 --anomalies-per-day 48 --duration 6m --seed 11
sleep 90
$K jobs stop cmp-rt
$K jobs stop cmp
echo DONE
