"""``kappaflow iot bridge``: devices' MQTT messages into Kafka."""

from __future__ import annotations

import signal
import threading
from types import FrameType

import click

from kappaflow.cli.context import Context, pass_context
from kappaflow.cli.output import json_line, say
from kappaflow.iot.telemetry import READINGS_TOPIC
from kappaflow.kafka.topics import DEFAULT_PARTITIONS
from kappaflow.mqtt.bridge import CLIENT_ID, DLQ_TOPIC, TOPIC_FILTER
from kappaflow.timeutil import parse_duration

#: What stops the bridge cleanly: a service manager's SIGTERM, or Ctrl-C.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@click.command("bridge")
@click.option(
    "--mqtt-topic",
    default=TOPIC_FILTER,
    show_default=True,
    help="the MQTT topic filter; the level its first '+' matches is the device id",
)
@click.option("--topic", default=READINGS_TOPIC, show_default=True, help="the Kafka topic")
@click.option(
    "--dlq", default=DLQ_TOPIC, show_default=True, help="where payloads that are no reading go"
)
@click.option(
    "--client-id",
    default=CLIENT_ID,
    show_default=True,
    help="the MQTT session's client id: a bridge started again with it takes up its session",
)
@click.option(
    "--partitions",
    type=click.IntRange(min=1),
    default=DEFAULT_PARTITIONS,
    show_default=True,
    help="partitions of the Kafka topics, if they are created",
)
@click.option(
    "--connect-timeout",
    default="30s",
    show_default=True,
    help="how long the first connection to the MQTT broker may take",
)
@pass_context
def bridge_command(
    ctx: Context,
    mqtt_topic: str,
    topic: str,
    dlq: str,
    client_id: str,
    partitions: int,
    connect_timeout: str,
) -> None:
    """Bridge devices' MQTT messages (QoS 1) into Kafka until Ctrl-C (or SIGTERM).

    Each message becomes a record keyed by the device id from its topic, the payload as
    sent; the broker gets its acknowledgement once Kafka has the record, so a bridge
    stopped or killed loses nothing. A payload that is not a JSON object, or names
    another device, goes to the dead-letter topic. Prints what it bridged, as one JSON
    line, when it stops.
    """
    from kappaflow.mqtt.bridge import MqttBridge

    settings = ctx.settings
    bridge = MqttBridge(
        settings,
        mqtt_topic,
        topic,
        dlq,
        client_id=client_id,
        partitions=partitions,
        connect_timeout_s=parse_duration(connect_timeout).total_seconds(),
    )
    stop = threading.Event()

    def request_stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    def ready() -> None:
        say(f"bridging {mqtt_topic} at {settings.mqtt.effective_url} to {topic} (Ctrl-C stops it)")

    previous = {signum: signal.signal(signum, request_stop) for signum in STOP_SIGNALS}
    try:
        counts = bridge.run(stop, on_ready=ready)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    json_line({"mqtt": settings.mqtt.effective_url, "topic": topic, **counts.to_json()})
