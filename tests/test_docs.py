"""The documentation stays true: its commands and options exist, and every setting is
documented (docs/configuration.md).

Every ``kappaflow …`` and ``kappaflow-bench …`` line in README.md, docs/ and the
benchmarks' write-ups (inline code and shell blocks) is walked
through the click tree word by word: a word after a group must be one of its
subcommands, and every option on the line must belong to the command it reaches (or, before
the first subcommand, to the root). A command or option removed from the CLI fails here
until the documentation follows.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from pydantic import BaseModel

from kappaflow.cli.app import cli
from kappaflow.settings import Settings
from kappaflow_bench.cli import cli as bench_cli

ROOT = Path(__file__).resolve().parents[1]
#: The page that documents every setting.
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text()
# The user documentation and the benchmarks' write-ups. The READMEs of benchmark runs
# (benchmarks/results/) record the commands as they were run, and are not held to the CLI.
DOCUMENTS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted((ROOT / "benchmarks").glob("*.md")),
]

#: The documented programs and their click trees.
PROGRAMS: dict[str, click.Group] = {"kappaflow": cli, "kappaflow-bench": bench_cli}
_PROGRAM = r"(kappaflow(?:-bench)?)"
_SPAN = re.compile(rf"`{_PROGRAM} ([^`]+)`")
_BLOCK = re.compile(r"^```(?:sh|bash|shell|console)\n(.*?)^```", re.DOTALL | re.MULTILINE)
# A command in a shell block: at the start of a line, or after a pipe or a prompt.
_IN_BLOCK = re.compile(rf"(?:^|\|\s|\$\s|/){_PROGRAM} (.+)$", re.MULTILINE)
# Words that end a shell command (outside the brackets and parentheses of a synopsis).
_SHELL_ENDS = {"|", "||", "&&", ";", ">", ">>", "2>&1", "&"}


@dataclass(frozen=True)
class Documented:
    """One documented invocation: where it is, the program, and the words after it."""

    where: str
    program: str
    text: str

    def __str__(self) -> str:
        return f"{self.where}: {self.program} {self.text}"


def _invocations() -> list[Documented]:
    found: dict[tuple[str, str, str], Documented] = {}
    for path in DOCUMENTS:
        text = path.read_text()
        name = str(path.relative_to(ROOT))
        texts = [(m.group(1), m.group(2)) for m in _SPAN.finditer(text)]
        for block in _BLOCK.findall(text):
            joined = re.sub(r"\\\n\s*", " ", block)  # continuation lines
            texts.extend((m.group(1), m.group(2)) for m in _IN_BLOCK.finditer(joined))
        for program, line in texts:
            line = re.split(r"\s#", line, maxsplit=1)[0].strip()
            found.setdefault((name, program, line), Documented(name, program, line))
    return list(found.values())


def _words(text: str) -> list[str]:
    """The words of a documented line up to the end of the kappaflow command."""
    words: list[str] = []
    depth = 0
    try:
        split = shlex.split(text)
    except ValueError:  # an unbalanced quote: plain words will do
        split = text.split()
    for word in split:
        if depth == 0 and word in _SHELL_ENDS:
            break
        depth += word.count("[") + word.count("(") - word.count("]") - word.count(")")
        words.append(word)
    return words


def _options(command: click.Command, ctx: click.Context) -> dict[str, click.Parameter]:
    """Every option spelling of ``command`` (help included), and what it belongs to."""
    names: dict[str, click.Parameter] = {}
    for param in command.get_params(ctx):
        if isinstance(param, click.Option):
            for name in (*param.opts, *param.secondary_opts):
                names[name] = param
    return names


def check(text: str, program: str = "kappaflow") -> list[str]:
    """What is wrong with ``PROGRAM TEXT`` against its CLI: an empty list if nothing."""
    problems: list[str] = []
    root = PROGRAMS[program]
    ctx = click.Context(root, info_name=program)
    command: click.Command = root
    path = [program]
    root_options = _options(root, ctx)
    past_root = False
    words = _words(text)
    i = 0
    while i < len(words):
        word = words[i].strip("[]()")
        i += 1
        if not word or word in {"|", "…", "..."}:
            continue
        if word.startswith("-") and len(word) > 1 and not word.lstrip("-").isdigit():
            for spelling in word.split("/"):
                name = spelling.split("=", 1)[0]
                own = _options(command, ctx)
                param = own.get(name) or (None if past_root else root_options.get(name))
                if param is None:
                    hint = f" (a {program} option: it goes first)" if name in root_options else ""
                    problems.append(f"{' '.join(path)} has no option {name}{hint}")
                    continue
                takes_value = isinstance(param, click.Option) and not (param.is_flag or param.count)
                if takes_value and "=" not in spelling and "/" not in word:
                    i += 1  # its value
            continue
        if isinstance(command, click.Group):
            sub = command.get_command(ctx, word)
            if sub is None:
                problems.append(f"{' '.join(path)} has no subcommand {word!r}")
                return problems
            ctx = click.Context(sub, parent=ctx, info_name=word)
            command = sub
            path.append(word)
            past_root = True
        # Anything else is an argument of the command reached, or a placeholder.
    return problems


@pytest.mark.parametrize("documented", _invocations(), ids=str)
def test_documented_commands_exist(documented: Documented) -> None:
    problems = check(documented.text, documented.program)
    assert not problems, f"{documented}: " + "; ".join(problems)


def test_the_checker_catches_what_is_gone() -> None:
    assert check("jobs list --json") == []
    assert check("--state-dir /tmp/kf jobs start cleaner --pipeline clean -P source=a") == []
    assert check("consume TOPIC [--from-beginning | --offset N] [--follow/--no-follow]") == []
    assert check("jobs frobnicate") != []
    assert check("jobs list --no-such-flag") != []
    assert check("jobs list --state-dir /tmp") != []  # root options go first
    assert check("ysb --engine spark --rate 50000", "kappaflow-bench") == []
    assert check("ysb --no-such-flag", "kappaflow-bench") != []
    assert check("bench ysb") != []  # the benchmarks are not kappaflow's commands
    found = {d.program for d in _invocations()}
    assert found == set(PROGRAMS), f"documented programs: {found}"
    assert len(_invocations()) > 20, "no kappaflow commands found in the documentation"


def _fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    names = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            names.extend(_fields(annotation, f"{prefix}{name}."))
        else:
            names.append(f"{prefix}{name}")
    return names


@pytest.mark.parametrize("name", _fields(Settings))
def test_every_setting_is_documented(name: str) -> None:
    assert (
        f"`{name}`" in CONFIGURATION
        or f"`{name} `" in CONFIGURATION
        or re.search(rf"`{re.escape(name)}` /|/ `{re.escape(name)}`", CONFIGURATION)
    ), f"docs/configuration.md's settings table lacks {name}"


def test_the_job_guides_code_is_the_examples_that_run_in_ci() -> None:
    """docs/jobs.md shows the first job and its test as they are in examples/, where CI
    runs them: the guide cannot drift from code that works."""
    guide = (ROOT / "docs" / "jobs.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", guide, re.S)
    for example in ("first_job.py", "test_first_job.py"):
        text = (ROOT / "examples" / example).read_text()
        body = text[text.index('"""\n', 3) + 4 :].lstrip("\n")
        assert body in blocks, f"docs/jobs.md does not show examples/{example} as it is"
    first_job = (ROOT / "examples" / "first_job.py").read_text()
    assert len([line for line in first_job.splitlines()[2:] if line.strip()]) < 20
