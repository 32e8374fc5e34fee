"""Installing the system's packages with apt-get, and running an installer quietly:
what setup does for the MQTT broker (mosquitto) and the browser tests (Chromium)."""

from __future__ import annotations

import os
import subprocess

APT_TIMEOUT_S = 900


def run_quietly(
    argv: list[str], env: dict[str, str] | None = None, timeout: float = APT_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """``argv``'s exit and its output (stdout and stderr together); a command that cannot
    start or runs past ``timeout`` is a failure with the reason as its output."""
    try:
        return subprocess.run(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(argv, 1, f"{argv[0]}: {exc}")


def apt_install(*packages: str) -> subprocess.CompletedProcess[str]:
    """``apt-get install`` of ``packages`` (no recommends, no questions); the package
    lists are fetched first, once, on a machine that never fetched them."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]
    result = run_quietly(install, env)
    if result.returncode != 0 and "Unable to locate package" in result.stdout:
        run_quietly(["apt-get", "update", "-qq"], env)
        result = run_quietly(install, env)
    return result


def last_line(result: subprocess.CompletedProcess[str]) -> str:
    """The last line of a command's output, what usually says why it failed."""
    return (result.stdout.strip().splitlines()[-1:] or ["?"])[0]
