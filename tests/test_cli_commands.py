"""The command line loads a command's module only when the command runs: its table of
top-level commands against the modules that declare them."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys

import click

import kappaflow.cli
from kappaflow.cli.app import COMMANDS, cli


def _declared() -> dict[str, click.Command]:
    """Every command the CLI's modules declare that no group of theirs holds."""
    commands: list[click.Command] = []
    for module in pkgutil.iter_modules(kappaflow.cli.__path__, "kappaflow.cli."):
        loaded = importlib.import_module(module.name)
        commands += [v for v in vars(loaded).values() if isinstance(v, click.Command)]
    # The root holds the commands it loaded so far: only the modules' own groups count.
    groups = [c for c in commands if isinstance(c, click.Group) and c is not cli]
    held = {id(sub) for group in groups for sub in group.commands.values()}
    return {str(c.name): c for c in commands if id(c) not in held and c is not cli}


def test_the_table_names_every_top_level_command_where_it_lives() -> None:
    declared = _declared()
    assert sorted(COMMANDS) == sorted(declared)
    ctx = click.Context(cli)
    for name, (module, attr) in COMMANDS.items():
        command = cli.get_command(ctx, name)
        assert command is getattr(importlib.import_module(module), attr) is declared[name]
    assert cli.get_command(ctx, "no-such-command") is None


def test_a_command_loads_its_own_module_only() -> None:
    probe = (
        "import json, sys\n"
        "from kappaflow.cli import main\n"
        "main(['topics', '--help'])\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    loaded = set(json.loads(out[-1]))
    assert "kappaflow.cli.topics" in loaded
    assert not {"kappaflow.cli.count", "kappaflow.cli.iot", "kappaflow.cli.jobs"} & loaded
    assert not {"pyspark", "redis", "numpy", "pyarrow"} & loaded
