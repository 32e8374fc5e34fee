"""``kappaflow iot register`` and ``kappaflow iot gateway``: devices and their HTTP entry."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from kappaflow.cli.context import Context, pass_context
from kappaflow.cli.output import json_line, say
from kappaflow.errors import CommandLineError
from kappaflow.iot.registry import REGISTRY_TOPIC, fleet_tokens, register
from kappaflow.iot.simulator import device_names
from kappaflow.iot.telemetry import EVENTS_TOPIC, GATEWAY_DLQ_TOPIC, READINGS_TOPIC
from kappaflow.timeutil import parse_duration

DEFAULT_PORT = 8088


def tokens_path(ctx: Context, given: Path | None) -> Path:
    return given or ctx.settings.state_dir / "iot" / "tokens.json"


@click.command("register")
@click.argument("devices", nargs=-1)
@click.option(
    "--fleet",
    type=click.IntRange(min=1),
    help="register the simulator's first N devices (dev-000000, ...)",
)
@click.option(
    "--tokens",
    type=click.Path(dir_okay=False, path_type=Path),
    help="where the devices' tokens are kept [default: <state_dir>/iot/tokens.json]",
)
@click.option("--topic", default=REGISTRY_TOPIC, show_default=True)
@pass_context
def register_command(
    ctx: Context, devices: tuple[str, ...], fleet: int | None, tokens: Path | None, topic: str
) -> None:
    """Register devices: each gets a token, kept in the tokens file (mode 0600); the
    registry topic gets its SHA-256. A device registered before keeps its token.

    With DEVICE arguments, prints one JSON line per device with its token; with --fleet,
    one JSON line with the counts.
    """
    if not devices and fleet is None:
        raise CommandLineError("give the DEVICE ids to register, or --fleet N")
    names = list(devices) + (device_names(fleet) if fleet is not None else [])
    path = tokens_path(ctx, tokens)
    known, new = fleet_tokens(path, names)
    register(ctx.settings.kafka, known, topic=topic)
    if devices:
        for device in devices:
            json_line({"device": device, "token": known[device]})
    if fleet is not None:
        json_line({"registered": len(known), "new": len(new), "tokens": str(path)})


@click.command("gateway")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(1, 65535), default=DEFAULT_PORT, show_default=True)
@click.option(
    "--max-in-flight",
    type=click.IntRange(min=1),
    default=20_000,
    show_default=True,
    help="records waiting for Kafka beyond which requests get 429",
)
@click.option(
    "--delivery-timeout",
    default="10s",
    show_default=True,
    help="how long a record may wait for Kafka before the answer is 503",
)
@click.option("--readings-topic", default=READINGS_TOPIC, show_default=True)
@click.option("--events-topic", default=EVENTS_TOPIC, show_default=True)
@click.option("--dlq-topic", default=GATEWAY_DLQ_TOPIC, show_default=True)
@click.option("--registry-topic", default=REGISTRY_TOPIC, show_default=True)
@pass_context
def gateway_command(
    ctx: Context,
    host: str,
    port: int,
    max_in_flight: int,
    delivery_timeout: str,
    readings_topic: str,
    events_topic: str,
    dlq_topic: str,
    registry_topic: str,
) -> None:
    """Run the HTTP gateway until Ctrl-C (or SIGTERM).

    Devices POST readings to /v1/devices/DEVICE/readings and events to
    /v1/devices/DEVICE/events, with their token as ``Authorization: Bearer TOKEN``; the
    answer comes after Kafka has acknowledged them. GET /v1/health shows what it counted.
    """
    import uvicorn

    from kappaflow.iot.gateway import Gateway, GatewayConfig, create_app
    from kappaflow.iot.registry import Registry
    from kappaflow.procs import port_in_use

    timeout_s = parse_duration(delivery_timeout).total_seconds()
    if timeout_s < 1:
        raise CommandLineError("--delivery-timeout must be at least 1s")
    if port_in_use(host, port):
        raise CommandLineError(f"port {host}:{port} is already in use: choose another (--port)")
    config = GatewayConfig(
        readings_topic=readings_topic,
        events_topic=events_topic,
        dlq_topic=dlq_topic,
        max_in_flight=max_in_flight,
        delivery_timeout_s=timeout_s,
    )
    gateway = Gateway(ctx.settings.kafka, Registry(ctx.settings.kafka, registry_topic), config)
    say(f"gateway on http://{host}:{port} (Ctrl-C stops it)")

    def stopped() -> None:
        # From the app's shutdown: uvicorn raises the stopping signal again after it.
        json_line({"gateway": f"http://{host}:{port}", **gateway.stats()})
        sys.stdout.flush()

    app = create_app(gateway, on_stop=stopped)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    server.run()


@click.command("demo")
@click.option("--devices", type=click.IntRange(2, 10_000), default=40, show_default=True)
@click.option(
    "--rate",
    type=click.FloatRange(min=1.0),
    default=120.0,
    show_default=True,
    help="readings a second, whole fleet",
)
@click.option(
    "--duration", metavar="DURATION", help="how long to stream (5m) [default: until Ctrl-C]"
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    help="the gateway's port; 0, or a port in use: a free one",
)
@pass_context
def demo_command(ctx: Context, devices: int, rate: float, duration: str | None, port: int) -> None:
    """The IoT application live: devices stream through the HTTP gateway and MQTT, the
    jobs clean, learn, score and alert, and the terminal shows the fleet, readings per
    second, open alerts and the latest model version. Ctrl-C stops everything; at the end,
    one JSON line says what was sent and seen."""
    from rich.console import Console

    from kappaflow.demos.iot import run_iot_demo

    seconds = parse_duration(duration).total_seconds() if duration is not None else None
    console = Console(stderr=True)
    summary = run_iot_demo(
        ctx.settings,
        console,
        devices=devices,
        rate=rate,
        duration_s=seconds,
        port=port,
        overrides=ctx.overrides,
        config_file=ctx.config_file,
    )
    json_line(summary)


COMMANDS = (register_command, gateway_command, demo_command)
