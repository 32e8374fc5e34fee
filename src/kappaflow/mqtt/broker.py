"""The embedded MQTT broker: a real broker on loopback, state under ``<state_dir>/mqtt``.

The broker is the machine's ``mosquitto`` when there is one (``make setup`` installs it
from the system's packages where it can), else amqtt, a broker written in Python that
the ``mqtt`` extra installs (``pip install 'kappaflow[mqtt]'``). Both take anonymous
clients, on loopback only. mosquitto keeps persistent sessions, their subscriptions and
queued QoS 1 messages on disk across its own restarts, and sends a reconnecting client
again what it had not acknowledged. amqtt keeps sessions in memory, so they outlive a
client's restart but not the broker's, and drops a message in flight to a client that
goes away or does not acknowledge it within 5 s: the bridge's guarantee (nothing
acknowledged to a device is lost) holds on mosquitto.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pwd
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kappaflow.errors import (
    MqttBrokerNotFoundError,
    PortInUseError,
    ServiceExitedError,
    ServiceStartTimeoutError,
    StateDirError,
)
from kappaflow.procs import ManagedProcess, ProcState, port_held, tail
from kappaflow.settings import Settings
from kappaflow.waiting import wait_for

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
#: Where the system's packages put mosquitto, often off a user's PATH.
_SBIN = (Path("/usr/sbin"), Path("/usr/local/sbin"), Path("/opt/homebrew/sbin"))
#: QoS 1 messages the broker sends a client before it has their acknowledgements. It
#: bounds what a bridge holds in memory while Kafka is slow or down.
MAX_INFLIGHT = 1_000
#: Messages queued for a client beyond those in flight, while it is busy or
#: disconnected: a bridge stopped for a while must find every message waiting (the
#: default, 1,000, would drop the rest).
MAX_QUEUED = 1_000_000
#: How often mosquitto writes its sessions to disk while it runs (it always does when it
#: stops): what a crash of the broker itself could lose.
AUTOSAVE_S = 30

INSTALL_HINT = "sudo apt-get install mosquitto, or pip install 'kappaflow[mqtt]' for amqtt"


@dataclass(frozen=True)
class BrokerProgram:
    """The MQTT broker to run: mosquitto (a binary) or amqtt (a Python package)."""

    kind: Literal["mosquitto", "amqtt"]
    path: Path

    def describe(self) -> str:
        return f"{self.kind} at {self.path}"


def find_mosquitto(configured: Path | None = None) -> Path | None:
    if configured is not None:
        if not configured.exists():
            raise MqttBrokerNotFoundError(f"mqtt.binary {configured} does not exist")
        return configured
    on_path = shutil.which("mosquitto")
    if on_path is not None:
        return Path(on_path)
    for sbin in _SBIN:
        if os.access(sbin / "mosquitto", os.X_OK):
            return sbin / "mosquitto"
    return None


def amqtt_installed() -> bool:
    return importlib.util.find_spec("amqtt") is not None


def find_mqtt_broker(configured: Path | None = None) -> BrokerProgram:
    """The broker to run: the configured mosquitto, one on PATH or in sbin, else amqtt."""
    mosquitto = find_mosquitto(configured)
    if mosquitto is not None:
        return BrokerProgram("mosquitto", mosquitto)
    spec = importlib.util.find_spec("amqtt")
    if spec is not None and spec.origin is not None:
        return BrokerProgram("amqtt", Path(spec.origin).parent)
    raise MqttBrokerNotFoundError(
        f"no MQTT broker found: run `make setup`, or install one ({INSTALL_HINT})"
    )


@dataclass(frozen=True)
class MqttStatus:
    state: ProcState
    pid: int | None
    url: str
    started_at: float | None = None


class EmbeddedMqtt:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.home = (settings.state_dir / "mqtt").resolve()
        # Both brokers' command lines name their configuration file, under home.
        self.process = ManagedProcess("MQTT broker", self.home / "mqtt.pid", (str(self.home),))

    @property
    def url(self) -> str:
        return f"mqtt://{self.settings.mqtt.host}:{self.settings.mqtt.port}"

    def status(self) -> MqttStatus:
        proc = self.process.status()
        return MqttStatus(proc.state, proc.pid, self.url, proc.started_at)

    def start(self, *, timeout: float = START_TIMEOUT_S) -> bool:
        if self.process.status().state is ProcState.RUNNING:
            return False
        self.process.clear_stale()
        program = find_mqtt_broker(self.settings.mqtt.binary)
        host, port = self.settings.mqtt.host, self.settings.mqtt.port
        if port_held(host, port):
            raise PortInUseError(
                f"port {host}:{port} is already in use: stop what holds it or choose another "
                "port (KAPPAFLOW_MQTT__PORT)"
            )
        try:
            (self.home / "data").mkdir(parents=True, exist_ok=True)
            (self.home / ".writable").write_text("")
        except OSError as exc:
            raise StateDirError(
                f"state directory {self.home} is not writable ({exc.strerror})"
            ) from None
        if program.kind == "mosquitto":
            config = self.home / "mosquitto.conf"
            config.write_text(self._mosquitto_config())
            argv = [str(program.path), "-c", str(config)]
        else:
            config = self.home / "amqtt.yaml"
            # YAML is a superset of JSON.
            config.write_text(json.dumps(self._amqtt_config(), indent=2) + "\n")
            argv = [sys.executable, "-m", "amqtt.scripts.broker_script", "-c", str(config)]
        log = self.home / "mqtt.log"
        self.process.spawn(argv, log_file=log)
        pid = self.process.status().pid

        def ready() -> bool | None:
            if pid is None or self.process.exited(pid):
                last = tail(log, 3)
                raise ServiceExitedError(
                    "the MQTT broker exited during start-up: " + (last[-1] if last else "?")
                )
            return True if connack(host, port) else None

        try:
            wait_for(ready, timeout=timeout, what="the MQTT broker to answer")
        except TimeoutError:
            self.stop()
            raise ServiceStartTimeoutError(
                f"the MQTT broker did not answer on {host}:{port} within {timeout:.0f}s"
            ) from None
        return True

    def stop(self, *, timeout: float = STOP_TIMEOUT_S) -> bool:
        """Stop the broker; mosquitto writes its sessions to disk as it stops."""
        self.process.clear_stale()
        return self.process.stop(timeout=timeout)

    def _mosquitto_config(self) -> str:
        mqtt = self.settings.mqtt
        lines = [
            "# Written by kappaflow at every start of the embedded broker.",
            f"listener {mqtt.port} {mqtt.host}",
            # Loopback only (the listener above): any local client may publish.
            "allow_anonymous true",
            "persistence true",
            f"persistence_location {self.home / 'data'}/",
            f"autosave_interval {AUTOSAVE_S}",
            f"max_inflight_messages {MAX_INFLIGHT}",
            f"max_queued_messages {MAX_QUEUED}",
            # Started as root, mosquitto would switch to the user `mosquitto`, who cannot
            # write the state directory: it runs as whoever starts it, as Redis does.
            f"user {pwd.getpwuid(os.geteuid()).pw_name}",
            "log_dest stdout",
            "log_type error",
            "log_type warning",
            "log_type notice",
            "log_type information",
            "log_timestamp_format %Y-%m-%dT%H:%M:%S",
        ]
        return "\n".join(lines) + "\n"

    def _amqtt_config(self) -> dict[str, object]:
        mqtt = self.settings.mqtt
        return {
            "listeners": {"default": {"type": "tcp", "bind": f"{mqtt.host}:{mqtt.port}"}},
            "plugins": {"kappaflow.mqtt.amqtt_auth.LoopbackAuthPlugin": {}},
        }


def connack(host: str, port: int, *, timeout: float = 1.0) -> bool:
    """True if an MQTT broker at ``host:port`` accepts a connection (CONNACK, code 0).

    A bare MQTT 3.1.1 CONNECT with a clean session, then DISCONNECT: what both brokers
    answer, without a client library's threads.
    """
    client_id = f"kappaflow-probe-{os.getpid()}".encode()
    body = b"\x00\x04MQTT\x04\x02\x00\x0a" + len(client_id).to_bytes(2, "big") + client_id
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(bytes([0x10, len(body)]) + body)
            reply = b""
            while len(reply) < 4:
                chunk = sock.recv(4 - len(reply))
                if not chunk:
                    return False
                reply += chunk
            sock.sendall(b"\xe0\x00")
    except OSError:
        return False
    # CONNACK: type 2, length 2, the session-present flag, then the return code.
    return reply[:2] == b"\x20\x02" and reply[3] == 0
