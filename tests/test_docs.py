"""The documentation stays true: its commands parse, and its settings are Settings'.

Every ``kappaflow …`` and ``kappaflow-bench …`` line in README.md, docs/ and the
benchmarks' write-ups (inline code and shell blocks) is walked through the click tree
word by word (a word after a group must be one of its subcommands, every option must
belong to the command it reaches), and then given to click itself, each placeholder (an
UPPERCASE word, ``<...>``) replaced by a value of the parameter it fills and each
alternative of a synopsis tried: choices, value types and the number of arguments are
click's to check. The settings table (in whichever of those files holds it) names every
setting, with its literal default. A command or option removed or changed fails here
until the documentation follows.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest
from pydantic import BaseModel

from kappaflow.cli.app import cli
from kappaflow.errors import KappaflowError
from kappaflow.settings import Settings
from kappaflow_bench.cli import cli as bench_cli

ROOT = Path(__file__).resolve().parents[1]
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


# A placeholder: an UPPERCASE word (NAME, MODULE:FUNC, N...) or one in angle brackets.
_PLACEHOLDER = re.compile(r"^(?:<[^<>]+>|[A-Z][A-Z0-9_]*(?:[.:/-][A-Z0-9_]+)*)?(?:\.\.\.|…)?$")
_MORE = {"...", "…"}
# Alternatives in a synopsis: `(a | b)`, `[a|b]` or `a|b` in one word.
_GROUP_ALTERNATIVES = re.compile(r"[\[(]([^\[\]()]*\|[^\[\]()]*)[\])]")
_WORD_ALTERNATIVES = re.compile(r"(?<=[^\s|])\|(?=[^\s|])")
_ANGLED = re.compile(r"<[^<>]+>")


def _dummy(param: click.Parameter | None, word: str) -> str:
    """The value ``word`` stands for: itself, or for a placeholder a value the parameter
    it fills takes (any will do: a placeholder means any)."""
    if not _PLACEHOLDER.match(word):
        return _ANGLED.sub("x", word)
    if param is None:
        return "x"
    kind = param.type
    candidates = ["x", "1", "2026-01-01T00:00:00Z", str(ROOT), str(Path(__file__))]
    if isinstance(kind, click.Choice):
        candidates = [str(c) for c in kind.choices]
    low = getattr(kind, "min", None)
    if low is not None:
        candidates.insert(0, str(low + 1 if getattr(kind, "min_open", False) else low))
    for candidate in candidates:
        try:
            kind.convert(candidate, param, None)
        except (click.BadParameter, KappaflowError):
            continue
        return candidate
    raise AssertionError(f"no dummy value for {word} ({param.name}: {kind.name})")


def _filled(command: click.Command, ctx: click.Context, words: list[str]) -> tuple[list[str], int]:
    """``words`` as the arguments of ``command``, each placeholder replaced by a value of
    the parameter it fills; for a group, only its options, and where they end."""
    options = _options(command, ctx)
    arguments = [p for p in command.get_params(ctx) if isinstance(p, click.Argument)]
    filled: list[str] = []
    taken = 0  # values given to the argument ``arguments[0]``
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word.startswith("-") and len(word) > 1 and not word.lstrip("-").isdigit():
            filled.append(word)
            param = options.get(word.split("=", 1)[0])
            takes_value = isinstance(param, click.Option) and not (param.is_flag or param.count)
            if takes_value and "=" not in word:
                for _ in range(param.nargs if param is not None else 0):
                    if i < len(words):
                        filled.append(_dummy(param, words[i]))
                        i += 1
            continue
        if isinstance(command, click.Group):
            return filled, i - 1
        if word in _MORE:  # more of the arguments before
            continue
        argument = arguments[0] if arguments else None
        filled.append(_dummy(argument, word))
        taken += 1
        if argument is not None and argument.nargs != -1 and taken >= argument.nargs:
            arguments.pop(0)
            taken = 0
    return filled, i


def _alternatives(text: str) -> list[str]:
    """Each line a synopsis stands for: one per alternative of each `(a | b)`, `[a|b]`
    and `a|b`."""
    text = text.replace("\\|", "|")
    for group in _GROUP_ALTERNATIVES.finditer(text):
        parts = group.group(1).split("|")
        # `[--scope read|admin]` is an option whose values are alternatives.
        if " | " not in group.group(1) and not all(p.strip().startswith("-") for p in parts):
            continue
        return [
            alternative
            for choice in parts
            for alternative in _alternatives(
                text[: group.start()] + f" {choice.strip()} " + text[group.end() :]
            )
        ]
    for word in text.split():
        if _WORD_ALTERNATIVES.search(word):
            return [
                alternative
                for choice in word.split("|")
                for alternative in _alternatives(text.replace(word, choice, 1))
            ]
    return [text]


def parse(text: str, program: str = "kappaflow") -> str | None:
    """Why click refuses ``PROGRAM TEXT`` (or one of its alternatives), its placeholders
    replaced by dummy values: None if it takes them all. A bare command (nothing after
    its name) is not refused for what it leaves out."""
    for alternative in _alternatives(text):
        problem = _parse(alternative, program)
        if problem is not None:
            return f"{problem} (in: {alternative})" if alternative != text else problem
    return None


def _parse(text: str, program: str) -> str | None:
    words = []
    for word in _words(text):
        word = word.strip("[]()")
        if word and word != "|":
            words.append(word.split("/", 1)[0] if word.startswith("--") else word)
    command: click.Command = PROGRAMS[program]
    name, parent = program, None
    while True:
        ctx = click.Context(command, info_name=name, parent=parent)
        args, end = _filled(command, ctx, words)
        rest = words[end:]
        bare = not args and not rest
        try:
            if isinstance(command, click.Group) and rest and rest[0] in _MORE:
                return None  # `kappaflow jobs …`: any of its commands
            if isinstance(command, click.Group) and rest:
                parent = command.make_context(name, [*args, rest[0]], parent=parent)
                sub = command.get_command(parent, rest[0])
                if sub is None:
                    return f"{name} has no subcommand {rest[0]!r}"
                command, name, words = sub, rest[0], rest[1:]
                continue
            command.make_context(name, args, parent=parent)
        except click.exceptions.Exit:  # --help, --version
            return None
        except click.MissingParameter as exc:
            return None if bare else exc.format_message()
        except (click.UsageError, click.BadParameter) as exc:
            if bare and isinstance(command, click.Group):
                return None  # a group named alone: its help
            return exc.format_message()
        except KappaflowError as exc:  # a value kappaflow's own type refused
            return f"{exc.code}: {exc}"
        return None


@pytest.mark.parametrize("documented", _invocations(), ids=str)
def test_documented_invocations_parse(documented: Documented) -> None:
    """click itself takes each documented line: its choices, value types and number of
    arguments, not only the names."""
    problem = parse(documented.text, documented.program)
    assert problem is None, f"{documented}: {problem}"


def test_the_parser_refuses_what_click_refuses() -> None:
    assert parse("jobs start NAME --app MODULE:FUNC -P key=VALUE") is None
    assert parse("consume TOPIC [--from-beginning | --offset N] [--follow/--no-follow]") is None
    assert parse("jobs status") is None  # the command named, its argument left out
    assert parse("acls grant --user U --topic T -o read -o describe") is None
    assert "fly" in (parse("acls grant --user U --topic T -o fly") or "")
    assert parse("consume TOPIC --offset many") is not None  # not a number
    assert parse("consume TOPIC --offset -3") is not None  # out of range
    assert parse("jobs status one two") is not None  # an argument too many
    assert parse("jobs status --json") is not None  # its argument missing
    assert parse("jobs frobnicate NAME") is not None
    assert parse("api token create NAME [--scope read|admin]") is None
    assert "'write'" in (parse("api token create NAME [--scope read|write]") or "")
    assert "--nope" in (parse("acls grant --user U (--topic T | --nope G) -o read") or "")
    assert parse("ysb --engine storm --rate 5", "kappaflow-bench") is not None


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


_SETTINGS_HEADER = re.compile(r"^\| setting \| default \| meaning \|$", re.MULTILINE)
_TICKED = re.compile(r"`([^`]+)`")


def _settings_table() -> tuple[str, dict[str, str]]:
    """The documented settings table, wherever it is (README.md or a page of docs/): the
    file, and each setting's default as the table gives it (the text of its cell, or of
    its part for a row of several settings)."""
    [(path, text)] = [
        (path, text) for path in DOCUMENTS if _SETTINGS_HEADER.search(text := path.read_text())
    ]
    found: dict[str, str] = {}
    rows = text[_SETTINGS_HEADER.search(text).end() :].lstrip("\n").splitlines()  # type: ignore[union-attr]
    for row in rows[1:]:  # after the | --- | line
        if not row.startswith("|"):
            break
        names, default = (cell.strip() for cell in row.strip("|").split(" | ")[:2])
        settings = _TICKED.findall(names)
        parts = [part.strip() for part in default.split(" / ")]
        if len(parts) != len(settings):
            parts = [default] * len(settings)
        found.update(zip(settings, parts, strict=True))
    return str(path.relative_to(ROOT)), found


def _default(name: str) -> Any:
    model: type[BaseModel] = Settings
    *sections, field = name.split(".")
    for section in sections:
        model = model.model_fields[section].annotation  # type: ignore[assignment]
    return model.model_fields[field].get_default(call_default_factory=True)


@pytest.mark.parametrize("name", _fields(Settings))
def test_every_setting_is_documented(name: str) -> None:
    where, table = _settings_table()
    assert name in table, f"{where}'s settings table lacks {name}"


def _literal(cell: str) -> Any:
    """The value a default cell gives literally (``unset``, a value in backticks), or
    ``...`` for one told in words or made of others (`<state_dir>/jars`)."""
    if cell == "unset":
        return None
    ticked = re.fullmatch(r"`([^`<>]+)`", cell)
    if ticked is None:
        return ...
    try:
        return json.loads(ticked.group(1))
    except ValueError:
        return ticked.group(1)


def test_documented_defaults_are_the_settings_defaults() -> None:
    where, table = _settings_table()
    checked = 0
    for name, cell in table.items():
        documented = _literal(cell)
        if documented is ...:
            continue
        default = _default(name)
        if isinstance(default, str | Path) or isinstance(documented, str):
            default = None if default is None else str(default)
        assert documented == default, f"{where}: {name} defaults to {default!r}, not {cell}"
        checked += 1
    assert checked > len(table) * 3 // 4, f"{where}: only {checked} defaults are literal"


def _table(path: Path, header: str) -> list[list[str]]:
    """The cells of each row of the table under ``header`` (its first row, as written)
    in ``path``."""
    text = path.read_text()
    start = text.index(header + "\n")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip("|"))])
    return rows


def documented_endpoints() -> set[tuple[str, str]]:
    """(method, path) of each row of docs/api.md's endpoint table (`WS` for a WebSocket),
    without the query a row shows."""
    found = set()
    for cells in _table(ROOT / "docs" / "api.md", "| endpoint | answers |"):
        for method, path in re.findall(r"`([A-Z]+) (/[^`?\s]*)", cells[0]):
            found.add((method, path))
    return found


def documented_metrics() -> dict[str, str]:
    """Each metric of docs/metrics-and-topics.md's tables (| Metric | Type | ...), and its
    type."""
    text = (ROOT / "docs" / "metrics-and-topics.md").read_text()
    return dict(re.findall(r"^\| `(kappaflow_\w+)` \| (\w+) \|", text, re.MULTILINE))


def test_the_tables_of_endpoints_and_metrics_are_read() -> None:
    endpoints = documented_endpoints()
    assert ("GET", "/v1/jobs/{job}/outputs/{output}/windows") in endpoints
    assert len(endpoints) > 15
    metrics = documented_metrics()
    assert metrics["kappaflow_api_request_duration_seconds"] == "histogram"
    assert metrics["kappaflow_kafka_up"] == "gauge" and len(metrics) > 20


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
