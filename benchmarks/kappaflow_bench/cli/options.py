"""What several benchmark commands' options share."""

from __future__ import annotations

from collections.abc import Callable

import click


def rates(unit: str) -> Callable[[click.Context, click.Parameter, str], list[float]]:
    """An option callback: comma-separated positive numbers of ``unit`` per second."""

    def parse(_ctx: click.Context, _param: click.Parameter, value: str) -> list[float]:
        try:
            found = [float(part) for part in value.split(",") if part.strip()]
        except ValueError:
            raise click.BadParameter(f"{value!r} is not a list of numbers") from None
        if not found or any(r <= 0 for r in found):
            raise click.BadParameter(f"{value!r}: each rate is a positive number of {unit}/s")
        return found

    return parse
