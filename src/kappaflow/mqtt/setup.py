"""Installing the MQTT broker: mosquitto from the system's packages where setup may, else
amqtt from PyPI into kappaflow's virtual environment."""

from __future__ import annotations

import importlib
import os
import shutil
import sys
from collections.abc import Callable

from kappaflow.errors import MqttBrokerNotFoundError
from kappaflow.install.system import apt_install, last_line, run_quietly
from kappaflow.mqtt.broker import (
    INSTALL_HINT,
    amqtt_installed,
    find_mosquitto,
    find_mqtt_broker,
)
from kappaflow.settings import Settings

#: The same requirement as the ``mqtt`` extra in pyproject.toml.
AMQTT_REQUIREMENT = "amqtt>=0.12"


def ensure_mqtt_broker(settings: Settings, say: Callable[[str], None]) -> str:
    """Make sure there is a broker to run, installing one if needed; what setup prints.

    mosquitto is installed with apt-get when setup runs as root on a system that has it;
    otherwise amqtt is installed with pip into the virtual environment kappaflow runs in.
    Fast when a broker is found: nothing is run.
    """
    if not settings.mqtt.embedded:
        return f"mqtt broker external at {settings.mqtt.effective_url}"
    if settings.mqtt.binary is not None:
        return f"mqtt broker: {find_mqtt_broker(settings.mqtt.binary).describe()}"
    if find_mosquitto() is None and os.geteuid() == 0 and shutil.which("apt-get"):
        say("installing mosquitto from the system's packages (apt-get)")
        _apt_install("mosquitto", say)
    if find_mosquitto() is None:
        say(
            "mosquitto not found (install it: sudo apt-get install mosquitto); "
            "the embedded MQTT broker is amqtt"
        )
        if not amqtt_installed():
            if sys.prefix == sys.base_prefix:
                raise MqttBrokerNotFoundError(
                    f"no MQTT broker found and not in a virtual environment: {INSTALL_HINT}"
                )
            say(f"installing {AMQTT_REQUIREMENT} (pip)")
            _pip_install(AMQTT_REQUIREMENT)
    return f"mqtt broker: {find_mqtt_broker().describe()}"


def _apt_install(package: str, say: Callable[[str], None]) -> None:
    result = apt_install(package)
    if result.returncode != 0:
        say(f"apt-get could not install {package}: {last_line(result)}")


def _pip_install(requirement: str) -> None:
    result = run_quietly([sys.executable, "-m", "pip", "install", "--quiet", requirement])
    importlib.invalidate_caches()
    if result.returncode != 0 or not amqtt_installed():
        raise MqttBrokerNotFoundError(
            f"pip could not install {requirement} ({last_line(result)}): {INSTALL_HINT}"
        )
