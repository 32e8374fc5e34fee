"""Installing the PostgreSQL server for the embedded one: Debian's ``postgresql`` where
setup may (as root), else the command to run."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable

from kappaflow.errors import PostgresNotFoundError
from kappaflow.install.system import apt_install, last_line
from kappaflow.postgresql.server import INSTALL_HINT, find_postgres_bin
from kappaflow.settings import Settings


def ensure_postgres_server(settings: Settings, say: Callable[[str], None]) -> str:
    """Make sure there is a server to run, installing Debian's where setup runs as root;
    what setup prints. Fast when one is found: nothing is run."""
    config = settings.postgres
    if not config.embedded:
        return "postgres external"
    try:
        return f"postgres server in {find_postgres_bin(config.bin_dir)}"
    except PostgresNotFoundError:
        if config.bin_dir is not None or os.geteuid() != 0 or not shutil.which("apt-get"):
            raise PostgresNotFoundError(
                f"no PostgreSQL server found: run `{INSTALL_HINT}`, then `make setup` again "
                "(or set postgres.bin_dir, or give an external server with postgres.dsn)"
            ) from None
    say("installing postgresql from the system's packages (apt-get)")
    result = apt_install("postgresql")
    if result.returncode != 0:
        raise PostgresNotFoundError(
            f"apt-get could not install postgresql ({last_line(result)}): {INSTALL_HINT}"
        )
    return f"postgres server in {find_postgres_bin()}"
