"""What every subcommand gets: the global options and the settings they lead to."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from kappaflow.settings import Settings, load_settings


@dataclass
class Context:
    """What every subcommand gets: the settings, loaded on first use."""

    config_file: Path | None
    overrides: dict[str, Any]
    _settings: Settings | None = field(default=None, repr=False)

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = load_settings(self.config_file, **self.overrides)
        return self._settings


pass_context = click.make_pass_decorator(Context)
