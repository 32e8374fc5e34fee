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
import sys
from collections.abc import Callable
from pathlib import Path

from kappaflow.errors import SetupError
from kappaflow.install.system import apt_install, last_line, run_quietly

#: Debian's browser, and a font: without one, Chromium draws every glyph as a box.
PACKAGES = ("chromium", "fonts-dejavu-core")
INSTALL_HINT = f"sudo apt-get install --no-install-recommends {' '.join(PACKAGES)}"
FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")


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
        result = apt_install(*PACKAGES)
        if result.returncode != 0:
            raise SetupError(f"apt-get could not install {' '.join(PACKAGES)}: {last_line(result)}")
    found = find_chromium()
    if found is None:
        raise SetupError(f"apt-get did not install Chromium: run `{INSTALL_HINT}`")
    return found


def main() -> int:
    def say(line: str) -> None:
        print(f"setup: {line}", file=sys.stderr)

    try:
        path = ensure_chromium(say)
    except SetupError as exc:
        print(f"setup: error[{exc.code}]: {exc}", file=sys.stderr)
        return exc.exit_code
    # Debian's launcher script may print shell warnings before the version line.
    printed = run_quietly([str(path), "--version"], timeout=60).stdout.splitlines()
    version = next((line for line in printed if line.startswith("Chromium")), "Chromium")
    say(f"{version.strip()} at {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
