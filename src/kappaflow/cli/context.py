"""What every subcommand gets: the global options and the settings they lead to."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import click

from kappaflow.settings import Settings, SettingsOverrides, load_settings


@dataclass
class Context:
    """What every subcommand gets: the settings, loaded on first use."""

    config_file: Path | None
    overrides: SettingsOverrides
    _settings: Settings | None = field(default=None, repr=False)

    @classmethod
    def from_options(
        cls,
        config_file: Path | None,
        state_dir: Path | None,
        bootstrap_servers: str | None,
        spark_master: str | None,
        redis_url: str | None,
    ) -> Context:
        """The context the global options (:func:`settings_options`) describe."""
        overrides = SettingsOverrides(
            state_dir=state_dir,
            bootstrap_servers=bootstrap_servers,
            spark_master=spark_master,
            redis_url=redis_url,
        )
        return cls(config_file, overrides)

    def secured(self, secure: bool | None, brokers: int | None = None) -> Settings:
        """The settings with ``kafka.secure`` and ``kafka.brokers`` as a command's
        ``--secure/--no-secure`` and ``--brokers`` say (unchanged where not given)."""
        given = {k: v for k, v in (("secure", secure), ("brokers", brokers)) if v is not None}
        if not given:
            return self.settings
        return load_settings(self.config_file, self.overrides, kafka=given)

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = load_settings(self.config_file, self.overrides)
        return self._settings


pass_context = click.make_pass_decorator(Context)


_F = TypeVar("_F", bound=Callable[..., Any])

_SETTINGS_OPTIONS = (
    click.option(
        "--config",
        "config_file",
        type=click.Path(path_type=Path),
        help="TOML settings file [default: ./kappaflow.toml if present]",
    ),
    click.option(
        "--state-dir",
        type=click.Path(path_type=Path),
        help="where services, checkpoints and logs live [default: .kappaflow]",
    ),
    click.option(
        "--bootstrap-servers",
        metavar="HOST:PORT[,…]",
        help="an external Kafka cluster (nothing embedded is started then)",
    ),
    click.option(
        "--spark-master", metavar="URL", help="local[*], spark://host:7077, yarn, k8s://…"
    ),
    click.option("--redis-url", metavar="URL", help="an external Redis, redis://host:port/db"),
)


def settings_options(command: _F) -> _F:
    """The global options that choose the settings, for any command line built on
    kappaflow's (its root group passes them to :meth:`Context.from_options`)."""
    for option in reversed(_SETTINGS_OPTIONS):
        command = option(command)
    return command
