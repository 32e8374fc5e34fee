"""``kappaflow registry start | stop | status | logs | register | subjects | schema |
compatibility``: the schema registry for Avro sources (docs/registry.md)."""

from __future__ import annotations

from pathlib import Path

import click

from kappaflow.cli.context import Context, pass_context
from kappaflow.cli.output import json_line, say, table
from kappaflow.registry.client import RegistryClient
from kappaflow.registry.compat import LEVELS
from kappaflow.registry.service import EmbeddedRegistry


@click.group()
def registry() -> None:
    """The schema registry: Confluent's REST API, schemas kept in a Kafka topic."""


@registry.command("start")
@pass_context
def start(ctx: Context) -> None:
    """Start the registry (its schemas read from the topic registry.topic) and wait until
    it answers."""
    service = EmbeddedRegistry(ctx.settings)
    started = service.start()
    say(f"registry {'started' if started else 'already running'}: {service.url}")


@registry.command("stop")
@pass_context
def stop(ctx: Context) -> None:
    """Stop the registry; its schemas stay in Kafka for the next start."""
    stopped = EmbeddedRegistry(ctx.settings).stop()
    say("registry stopped" if stopped else "registry was not running")


@registry.command("status")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@pass_context
def status(ctx: Context, as_json: bool) -> None:
    """Whether the registry runs, its URL and its subjects."""
    found = EmbeddedRegistry(ctx.settings).status()
    if as_json:
        json_line(found)
        return
    table(None, ["state", "pid", "url"], [[found["state"], found["pid"], found["url"]]])
    if found.get("subjects"):
        say("subjects: " + ", ".join(found["subjects"]))


@registry.command("logs")
@click.option("-n", "--lines", default=50, show_default=True, help="how many lines")
@pass_context
def logs(ctx: Context, lines: int) -> None:
    """The last lines of the registry's log."""
    for line in EmbeddedRegistry(ctx.settings).logs(lines):
        click.echo(line)


@registry.command("register")
@click.argument("subject")
@click.argument("schema_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--type",
    "schema_type",
    type=click.Choice(["AVRO", "PROTOBUF", "JSON"]),
    default="AVRO",
    show_default=True,
)
@pass_context
def register(ctx: Context, subject: str, schema_file: Path, schema_type: str) -> None:
    """Register the schema in SCHEMA_FILE under SUBJECT; a change the subject's
    compatibility level does not allow is refused, naming the field."""
    client = RegistryClient(ctx.settings.registry.url)
    ident = client.register(subject, schema_file.read_text(), schema_type)
    found = client.version(subject)
    say(f"{subject}: schema id {ident}, latest version {found.version}")


@registry.command("subjects")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@pass_context
def subjects(ctx: Context, as_json: bool) -> None:
    """Every subject with its latest version and schema id."""
    client = RegistryClient(ctx.settings.registry.url)
    rows = [client.version(s) for s in client.subjects()]
    if as_json:
        json_line(
            {r.subject: {"version": r.version, "id": r.id, "type": r.schema_type} for r in rows}
        )
        return
    table(
        None,
        ["subject", "version", "id", "type"],
        [[r.subject, r.version, r.id, r.schema_type] for r in rows],
    )


@registry.command("schema")
@click.argument("subject")
@click.option("--version", default="latest", show_default=True)
@pass_context
def schema(ctx: Context, subject: str, version: str) -> None:
    """A version's schema text."""
    click.echo(RegistryClient(ctx.settings.registry.url).version(subject, version).schema)


@registry.command("compatibility")
@click.argument("level", type=click.Choice(LEVELS))
@click.option("--subject", help="one subject's level (default: the registry's)")
@pass_context
def compatibility(ctx: Context, level: str, subject: str | None) -> None:
    """Set the compatibility level new versions are checked at."""
    RegistryClient(ctx.settings.registry.url).set_compatibility(level, subject)
    say(f"compatibility of {subject or 'the registry'}: {level}")
