"""``profile-classify``: where a Spark JVM's task threads spent their time (profile.py)."""

from __future__ import annotations

from pathlib import Path

import click

from kappaflow_bench.profile import classify, report


@click.command("profile-classify")
@click.argument("samples", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def profile_classify(samples: Path) -> None:
    """Count the thread dumps in SAMPLES (benchmarks/jprof.sh's output) by what their
    threads were doing: waiting, or on CPU in the first frame a rule recognises."""
    for line in report(classify(samples.read_text())):
        click.echo(line)


COMMANDS = [profile_classify]
