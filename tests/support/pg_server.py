"""The embedded PostgreSQL for the tests that need it: one per test worker, in a state
directory of its own that the server's user can reach (under root it runs as
``postgres``, and pytest's temporary folders are root's alone)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kappaflow.postgresql.server import EmbeddedPostgres
from kappaflow.procs import free_port
from kappaflow.settings import Settings, load_settings


@pytest.fixture(scope="session")
def pg() -> Iterator[Settings]:
    """Settings whose embedded PostgreSQL runs."""
    home = Path(tempfile.mkdtemp(prefix="kappaflow-pg-"))
    home.chmod(0o755)
    settings = load_settings(state_dir=home, postgres={"port": free_port()})
    server = EmbeddedPostgres(settings)
    server.start()
    try:
        yield settings
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)
