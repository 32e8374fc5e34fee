"""The README stays true: its commands exist and every setting is documented."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from pydantic import BaseModel

from kappaflow.cli import main
from kappaflow.settings import Settings

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def _commands() -> list[list[str]]:
    """`kappaflow …` invocations in the README, cut before options and placeholders."""
    found: set[tuple[str, ...]] = set()
    spans = re.findall(r"`kappaflow ([^`]+)`", README)
    blocks = "\n".join(re.findall(r"```sh\n(.*?)```", README, flags=re.DOTALL))
    lines = re.findall(r"(?:^|\| )kappaflow (.+)$", blocks, flags=re.MULTILINE)
    for text in spans + lines:
        words: list[str] = []
        for word in shlex.split(text.split("#")[0].rstrip(" \\")):
            if not re.fullmatch(r"[a-z][a-z-]*", word):
                break
            words.append(word)
            if len(words) == 2:
                break
        if words:
            found.add(tuple(words))
    return [list(c) for c in sorted(found)]


@pytest.mark.parametrize("command", _commands(), ids=" ".join)
def test_readme_commands_exist(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # A word that is an argument, not a subcommand (a topic name), makes --help of the
    # group fail; so try the longest prefix that is a command.
    for end in range(len(command), 0, -1):
        if main([*command[:end], "--help"]) == 0:
            assert "Usage:" in capsys.readouterr().out
            return
        capsys.readouterr()
    pytest.fail(f"README shows `kappaflow {' '.join(command)}`, which does not exist")


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
        f"`{name}`" in README
        or f"`{name} `" in README
        or re.search(rf"`{re.escape(name)}` /|/ `{re.escape(name)}`", README)
    ), f"README's configuration table lacks {name}"
