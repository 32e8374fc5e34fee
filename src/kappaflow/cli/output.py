"""How the CLI prints: JSON lines for data, rich tables for people, messages on stderr."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from kappaflow.timeutil import iso

stderr = Console(stderr=True, highlight=False)


def json_line(value: Any) -> None:
    sys.stdout.write(json.dumps(value, ensure_ascii=False, default=str) + "\n")


def say(message: str) -> None:
    """A message for the person at the terminal (stderr, so stdout stays data)."""
    click.echo(message, err=True)


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    grid = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for column in columns:
        grid.add_column(column)
    for row in rows:
        grid.add_row(*("" if cell is None else str(cell) for cell in row))
    Console(highlight=False).print(grid)


def iso_from_epoch_s(epoch_s: float | None) -> str | None:
    """Epoch seconds as ISO-8601 UTC text (``timeutil.iso``), or None."""
    return iso(datetime.fromtimestamp(epoch_s, tz=UTC)) if epoch_s is not None else None
