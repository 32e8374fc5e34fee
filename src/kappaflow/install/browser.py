"""Installing the headless Chromium the dashboard's browser tests drive: Debian's
``chromium`` package, with a font so that pages render text, from the system's packages.

Playwright drives it through ``executable_path``; Playwright's own browser download is
never used. ``python -m kappaflow.install.browser`` is what ``make test`` runs: it installs
the packages when it runs as root on a system with apt-get, and stops with what to run
otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from kappaflow.errors import SetupError

#: Debian's browser, and a font: without one, Chromium draws every glyph as a box.
PACKAGES = ("chromium", "fonts-dejavu-core")
INSTALL_HINT = f"sudo apt-get install --no-install-recommends {' '.join(PACKAGES)}"
FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
_APT_TIMEOUT_S = 900


def find_chromium() -> Path | None:
    """Debian's Chromium, if installed."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found is not None:
            return Path(found)
    return None


def ensure_chromium(say: Callable[[str], None]) -> Path:
    """The path of Chromium, installed with apt-get first if it is missing and this runs
    as root; raises SetupError with the command to run when it cannot be installed."""
    if find_chromium() is None or not FONT_DIR.is_dir():
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            raise SetupError(
                "the browser tests need Debian's Chromium and a font, and installing them "
                f"needs root and apt-get: run `{INSTALL_HINT}`, then make test again"
            )
        say(f"installing {', '.join(PACKAGES)} from the system's packages (apt-get)")
        _apt_install(PACKAGES)
    found = find_chromium()
    if found is None:
        raise SetupError(f"apt-get did not install Chromium: run `{INSTALL_HINT}`")
    return found


def _apt_install(packages: tuple[str, ...]) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]
    result = _run(install, env)
    if result.returncode != 0 and "Unable to locate package" in result.stdout:
        # A machine whose package lists were never fetched: fetch them, once.
        _run(["apt-get", "update", "-qq"], env)
        result = _run(install, env)
    if result.returncode != 0:
        last = result.stdout.strip().splitlines()[-1:] or ["?"]
        raise SetupError(f"apt-get could not install {' '.join(packages)}: {last[0]}")


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=_APT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(argv, 1, f"{argv[0]}: {exc}")


def main() -> int:
    def say(line: str) -> None:
        print(f"setup: {line}", file=sys.stderr)

    try:
        path = ensure_chromium(say)
    except SetupError as exc:
        print(f"setup: error[{exc.code}]: {exc}", file=sys.stderr)
        return exc.exit_code
    # Debian's launcher script may print shell warnings before the version line.
    printed = _run([str(path), "--version"], dict(os.environ)).stdout.splitlines()
    version = next((line for line in printed if line.startswith("Chromium")), "Chromium")
    say(f"{version.strip()} at {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
