"""``GET /v1/jobs/{job}/state``: a job's state, read as ``kappaflow jobs state`` reads it.

Reading state takes a Spark session (jobs/state_read.py), which the service does not
keep: each request reads in a child process of its own (this module, run with ``-m``),
which starts one, prints the rows as JSON lines and ends, so the service holds no JVM
between requests and a slow read holds none of its workers' memory. The child gets the
service's settings in its environment, as the service got them (api/server.py); it
answers an error as one last line ``{"error": {"code", "message", "status"}}``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from kappaflow.api.server import SETTINGS_ENV
from kappaflow.errors import ApiError, KappaflowError, http_status
from kappaflow.settings import Settings, settings_json

#: How long one read may take: a Spark session's start, then the state data source.
READ_TIMEOUT_S = 300.0
#: The child's exit status when it answered an error line.
ANSWERED_ERROR = 3


@dataclass(frozen=True)
class StateRead:
    """What the child answered: the rows, or an error (code, message, HTTP status)."""

    rows: list[dict[str, Any]]
    error: dict[str, Any] | None = None


def read_job_state(
    settings: Settings,
    job: str,
    *,
    output: str | None = None,
    key: str | None = None,
    at: str | None = None,
    timeout: float = READ_TIMEOUT_S,
) -> StateRead:
    """Job ``job``'s state rows, read by a child process."""
    argv = [sys.executable, "-m", "kappaflow.api.state", job]
    for flag, value in (("--output", output), ("--key", key), ("--at", at)):
        if value is not None:
            argv += [flag, value]
    env = {**os.environ, SETTINGS_ENV: settings_json(settings)}
    try:
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return StateRead(
            [],
            {
                "code": ApiError.code,
                "message": f"reading the state took over {timeout:.0f}s",
                "status": 504,
            },
        )
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode == ANSWERED_ERROR and lines and "error" in lines[-1]:
        return StateRead([], lines[-1]["error"])
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return StateRead(
            [],
            {
                "code": ApiError.code,
                "message": f"reading the state failed: {last[0]}",
                "status": 500,
            },
        )
    return StateRead(lines)


def _main(argv: list[str]) -> int:
    import argparse

    from kappaflow.jobs.state_read import job_state

    parser = argparse.ArgumentParser(prog="kappaflow.api.state")
    parser.add_argument("job")
    parser.add_argument("--output")
    parser.add_argument("--key")
    parser.add_argument("--at")
    args = parser.parse_args(argv)
    settings = Settings.model_validate_json(os.environ[SETTINGS_ENV])
    try:
        for row in job_state(settings, args.job, output=args.output, key=args.key, at=args.at):
            print(json.dumps(row), flush=True)
    except KappaflowError as exc:
        error = {"code": exc.code, "message": str(exc), "status": http_status(exc)}
        print(json.dumps({"error": error}), flush=True)
        return ANSWERED_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
