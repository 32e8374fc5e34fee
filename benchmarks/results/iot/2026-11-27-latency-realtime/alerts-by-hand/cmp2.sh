export KAPPAFLOW_STATE_DIR=/tmp/kf-cmp KAPPAFLOW_JARS_DIR=/work/main/.kappaflow/jars KAPPAFLOW_KAFKA__PORT=19192 KAPPAFLOW_KAFKA__CONTROLLER_PORT=19193 KAPPAFLOW_REDIS__PORT=16479 KAPPAFLOW_MQTT__PORT=11984 KAPPAFLOW_API__PORT=18780
K=/work/main/.venv/bin/kappaflow
$K jobs start al --app kappaflow.iot.app:build -P parts=alerts -P alerts.source=scores-rt -P alerts.dest=alerts-rt
