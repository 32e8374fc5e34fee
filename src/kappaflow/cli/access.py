"""``kappaflow users`` and ``kappaflow acls``: who may connect to Kafka, and what they may
do there (docs/security.md)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from kappaflow.cli.context import Context, pass_context
from kappaflow.cli.output import json_line, say, table
from kappaflow.errors import InvalidAclError
from kappaflow.kafka import access


@click.group()
def users() -> None:
    """Kafka users (SCRAM-SHA-512): add, remove, list."""


@users.command("add")
@click.argument("name")
@click.option(
    "--password-stdin",
    is_flag=True,
    help="read the password from stdin's first line [default: make one and print it]",
)
@pass_context
def users_add(ctx: Context, name: str, password_stdin: bool) -> None:
    """Create user NAME, or give it a new password. A password made here is printed once
    (stdout), and kept nowhere: the broker keeps only its salted hash."""
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
        if len(password) < 8:
            raise InvalidAclError("a password needs at least 8 characters")
    else:
        password = access.new_password()
    access.upsert_users(ctx.settings.kafka, {name: password})
    say(f"user {name} can connect (SCRAM-SHA-512); it may do what ACLs allow it")
    if not password_stdin:
        click.echo(password)


@users.command("remove")
@click.argument("name")
@pass_context
def users_remove(ctx: Context, name: str) -> None:
    """Remove user NAME: it can no longer connect (its ACLs stay until revoked)."""
    access.remove_user(ctx.settings.kafka, name)
    say(f"user {name} removed")


@users.command("list")
@click.option("--json", "as_json", is_flag=True, help="print JSON lines")
@pass_context
def users_list(ctx: Context, as_json: bool) -> None:
    """Every user with credentials."""
    found = access.list_users(ctx.settings.kafka)
    if as_json:
        for user in found:
            json_line(user.as_dict())
    else:
        table(None, ["user", "mechanisms"], [[u.name, ", ".join(u.mechanisms)] for u in found])


@click.group()
def acls() -> None:
    """Kafka access control lists: grant, revoke, list. Nothing is allowed by default."""


class _Operation(click.Choice):  # type: ignore[type-arg]
    """An ACL operation, checked as the command line is read: an unknown one is refused
    (KF906) before anything reaches the broker."""

    def __init__(self) -> None:
        super().__init__(sorted(access.OPERATIONS))

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> str:
        return access.check_operation(str(value))


def _rule_options(command: Callable[..., None]) -> Callable[..., None]:
    for option in reversed(
        (
            click.option("--user", required=True, help="the user the rule is for"),
            click.option("--topic", "topics", multiple=True, help="a topic (repeatable)"),
            click.option("--group", "groups", multiple=True, help="a consumer group"),
            click.option(
                "--transactional-id", "transactional_ids", multiple=True, help="a transaction id"
            ),
            click.option("--cluster", is_flag=True, help="the cluster itself"),
            click.option(
                "--prefixed",
                is_flag=True,
                help="the names are prefixes: the rule covers every name that starts so",
            ),
            click.option(
                "--operation",
                "-o",
                "operations",
                multiple=True,
                type=_Operation(),
                metavar="OP",
                help=f"repeatable; one of {', '.join(sorted(access.OPERATIONS))}",
            ),
            click.option("--deny", is_flag=True, help="a rule that forbids (wins over allows)"),
        )
    ):
        command = option(command)
    return command


def _rules(options: dict[str, Any]) -> list[access.Rule]:
    """The rules a grant's or a revoke's options name."""
    return access.rules(
        options["user"],
        topics=options["topics"],
        groups=options["groups"],
        transactional_ids=options["transactional_ids"],
        cluster=options["cluster"],
        operations=options["operations"],
        prefixed=options["prefixed"],
        allow=not options["deny"],
    )


@acls.command("grant")
@_rule_options
@pass_context
def acls_grant(ctx: Context, /, **options: Any) -> None:
    """Allow (or, with --deny, forbid) USER the operations on the resources, e.g.
    `kappaflow acls grant --user app --topic orders -o read -o describe --group app`."""
    count = access.grant(ctx.settings.kafka, _rules(options))
    say(f"{count} rule{'s' if count != 1 else ''} in place for {options['user']}")


@acls.command("revoke")
@_rule_options
@pass_context
def acls_revoke(ctx: Context, /, **options: Any) -> None:
    """Delete the rules these options name (as granted)."""
    deleted = access.revoke(ctx.settings.kafka, _rules(options))
    n = len(deleted)
    say(f"{n} rule{'s' if n != 1 else ''} revoked for {options['user']}")


@acls.command("list")
@click.option("--user", help="only this user's rules")
@click.option("--json", "as_json", is_flag=True, help="print JSON lines")
@pass_context
def acls_list(ctx: Context, user: str | None, as_json: bool) -> None:
    """Every rule, or one user's."""
    found = access.list_acls(ctx.settings.kafka, user)
    if as_json:
        for rule in found:
            json_line(rule.as_dict())
        return
    columns = ["user", "permission", "operation", "resource", "name", "pattern"]
    rows = [
        [
            r.user,
            "allow" if r.allow else "deny",
            r.operation,
            r.resource,
            r.name,
            "prefixed" if r.prefixed else "literal",
        ]
        for r in found
    ]
    table(None, columns, rows)


COMMANDS = (users, acls)
