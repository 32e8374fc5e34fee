"""Finding a Java runtime that the broker and Spark both accept (17 or newer)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kappaflow.errors import JavaNotFoundError, JavaTooOldError, SetupError
from kappaflow.install.system import apt_install, last_line

MIN_JAVA = 17
#: Debian's JDK, which setup installs when ``javac`` is missing and it runs as root.
JDK_PACKAGE = "openjdk-17-jdk-headless"

_HOW = (
    "install a JDK 17 or newer (Debian/Ubuntu: sudo apt-get install openjdk-17-jdk-headless) "
    "and put it on PATH or set JAVA_HOME"
)


@dataclass(frozen=True)
class JavaInfo:
    executable: Path
    major: int
    version: str


def jdk_tool(name: str) -> Path | None:
    """A JDK program (``java``, ``javac``) from ``$JAVA_HOME/bin``, else from ``PATH``."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / name).is_file():
        return Path(home) / "bin" / name
    found = shutil.which(name)
    return Path(found) if found else None


def find_java() -> JavaInfo:
    """The ``java`` from ``$JAVA_HOME`` or ``PATH``, checked to be 17 or newer."""
    candidate = jdk_tool("java")
    if candidate is None:
        raise JavaNotFoundError(f"Java not found: {_HOW}")
    try:
        out = subprocess.run(
            [str(candidate), "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except OSError as exc:
        raise JavaNotFoundError(f"cannot run {candidate}: {exc.strerror}; {_HOW}") from None
    version = _parse_version(out.stderr + out.stdout)
    if version is None:
        raise JavaNotFoundError(f"cannot read the version of {candidate}; {_HOW}")
    major = _major(version)
    if major < MIN_JAVA:
        raise JavaTooOldError(f"Java {version} at {candidate} is too old: need {MIN_JAVA}+; {_HOW}")
    return JavaInfo(candidate, major, version)


def _parse_version(text: str) -> str | None:
    match = re.search(r'version "([^"]+)"', text)
    return match.group(1) if match else None


def _major(version: str) -> int:
    # "1.8.0_392" is Java 8; "17.0.15" is 17; "21" is 21.
    numbers = [int(n) for n in re.findall(r"\d+", version)[:2]]
    if not numbers:
        return 0
    if numbers[0] == 1 and len(numbers) > 1:
        return numbers[1]
    return numbers[0]


def ensure_javac() -> str | None:
    """Make sure the JDK's ``javac`` is there (the engine's jar is compiled with it):
    installed with apt-get when it is missing and this runs as root; a SetupError with
    the command to run otherwise. Returns what was done, if anything."""
    if jdk_tool("javac") is not None:
        return None
    hint = f"sudo apt-get install {JDK_PACKAGE}"
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise SetupError(
            f"javac not found: kappaflow compiles its engine with a JDK 17 or newer, and a "
            f"JRE has none. Run `{hint}` (or set JAVA_HOME to a JDK), then make setup again"
        )
    result = apt_install(JDK_PACKAGE)
    if result.returncode != 0 or jdk_tool("javac") is None:
        raise SetupError(f"apt-get could not install {JDK_PACKAGE}: {last_line(result)}")
    return f"installed {JDK_PACKAGE} from the system's packages (apt-get) for javac"
