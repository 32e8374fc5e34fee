"""The ``kappaflow`` command line."""

from __future__ import annotations

import sys

import click

from kappaflow.cli.app import cli
from kappaflow.errors import CommandLineError, KappaflowError, OperatingSystemError


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; every expected failure is one line on stderr and a non-zero exit."""
    return run_cli(cli, "kappaflow", argv)


def run_cli(command: click.Command, prog_name: str, argv: list[str] | None = None) -> int:
    """Run ``command`` as the program ``prog_name``: every expected failure is one line
    on stderr, ``<prog_name>: error…``, and a non-zero exit, never a traceback."""
    try:
        command.main(args=argv, prog_name=prog_name, standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo(f"{prog_name}: interrupted", err=True)
        return 130
    except click.exceptions.NoArgsIsHelpError as exc:
        # The program or a group without a command: its help, which is no error.
        click.echo(exc.format_message(), err=True)
        return CommandLineError.exit_code
    except click.UsageError as exc:
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        click.echo(
            f"{prog_name}: error[{CommandLineError.code}]: {exc.format_message()}{hint}", err=True
        )
        return CommandLineError.exit_code
    except click.ClickException as exc:
        click.echo(f"{prog_name}: error[{CommandLineError.code}]: {exc.format_message()}", err=True)
        return exc.exit_code
    except KappaflowError as exc:
        click.echo(f"{prog_name}: error[{exc.code}]: {exc}", err=True)
        return exc.exit_code
    except BrokenPipeError:
        # `kappaflow consume … | head` closed our stdout: that is how a pipe ends.
        sys.stderr.close()
        return 0
    except OSError as exc:
        # The environment refused something (permissions, a path that is a file, a full
        # disk): say what and where, without a traceback.
        where = f": {exc.filename}" if exc.filename else ""
        code = OperatingSystemError.code
        click.echo(f"{prog_name}: error[{code}]: {exc.strerror or exc}{where}", err=True)
        return OperatingSystemError.exit_code
    except KeyboardInterrupt:
        click.echo(f"{prog_name}: interrupted", err=True)
        return 130
    return 0


__all__ = ["cli", "main", "run_cli"]
