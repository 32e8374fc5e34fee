#!/usr/bin/env bash
# Checks what `make setup` cannot install by itself, and says exactly how to get it.
set -u
python=${1:-python3}
fail=0
if ! command -v "$python" >/dev/null 2>&1; then
  echo "setup: $python not found: install Python 3.11 or newer (Debian/Ubuntu: sudo apt-get install python3 python3-venv), or run make PYTHON=/path/to/python3.11" >&2
  exit 1
fi
if ! "$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
  echo "setup: $("$python" --version 2>&1) is too old: kappaflow needs Python 3.11+ (run make PYTHON=/path/to/python3.11)" >&2
  fail=1
fi
if ! "$python" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  echo "setup: Python's venv module is missing: Debian/Ubuntu: sudo apt-get install python3-venv" >&2
  fail=1
fi
java_bin=java
[ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ] && java_bin="$JAVA_HOME/bin/java"
if ! command -v "$java_bin" >/dev/null 2>&1; then
  echo "setup: Java not found: install a JDK 17+ (Debian/Ubuntu: sudo apt-get install openjdk-17-jdk-headless) and put it on PATH or set JAVA_HOME" >&2
  fail=1
else
  version=$("$java_bin" -version 2>&1 | sed -n 's/.*version "\([^"]*\)".*/\1/p' | head -1)
  major=${version%%.*}
  [ "$major" = "1" ] && major=$(echo "$version" | cut -d. -f2)
  if [ -z "$major" ] || [ "$major" -lt 17 ] 2>/dev/null; then
    echo "setup: Java ${version:-of unknown version} is too old: kappaflow needs Java 17+ (Debian/Ubuntu: sudo apt-get install openjdk-17-jdk-headless; then set JAVA_HOME)" >&2
    fail=1
  fi
fi
exit $fail
