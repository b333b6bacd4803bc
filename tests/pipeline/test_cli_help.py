"""``lsr <command> --help``: every flag states its default at most once, and never a meaningless one.

A flag's help entry (its line and the wrapped lines under it) says what the flag does by default either in its own
words ("(default: the checkpoint's)", "...; the default)", "off by default") or through argparse's appended
"(default: X)", not both; required flags, switches and unset (None) values get no "(default: ...)".
"""

from __future__ import annotations

import re

import pytest

from lsr.cli import main

# how a help text states a default: argparse's "(default: X)" or the help's own words
STATES_DEFAULT = re.compile(r"\(default\b|\bthe default\b|\bby default\b", re.IGNORECASE)


def _help(capsys: pytest.CaptureFixture, *argv: str) -> str:
    assert main([*argv, "--help"]) == 0
    return capsys.readouterr().out


def _commands(capsys: pytest.CaptureFixture) -> list[str]:
    """The sub-commands ``lsr --help`` lists (the lines indented by four spaces under COMMAND)."""
    names = re.findall(r"^    ([a-z][a-z-]*)(?:\s|$)", _help(capsys), re.MULTILINE)
    assert {"encode", "index", "search", "evaluate", "run", "serve", "train", "rerank"} <= set(names)
    return names


def _entries(text: str) -> list[str]:
    """Each option's help entry, its wrapped lines joined: an entry starts at a line indented by two spaces."""
    entries: list[list[str]] = []
    for line in text.split("options:", 1)[-1].splitlines():
        if re.match(r"^  \S", line):
            entries.append([line.strip()])
        elif re.match(r"^ {3,}\S", line) and entries:
            entries[-1].append(line.strip())
    return [" ".join(lines) for lines in entries]


def test_each_flag_of_every_command_states_one_default(capsys):
    problems, shown = [], 0
    for command in _commands(capsys):
        for entry in _entries(_help(capsys, command)):
            flag = entry.split()[0]
            if len(STATES_DEFAULT.findall(entry)) > 1:
                problems.append(f"lsr {command} {flag}: the default stated twice: {entry}")
            if re.search(r"\(default: (None|False)\)", entry):
                problems.append(f"lsr {command} {flag}: a meaningless default: {entry}")
            shown += "(default: " in entry
    assert not problems, "\n".join(problems)
    assert shown >= 20  # argparse still shows the defaults the help texts do not state


def test_a_default_is_shown_once_where_the_help_states_it_and_appended_where_not(capsys):
    entries = {e.split()[0]: e for e in _entries(_help(capsys, "search"))}
    assert entries["--batch-size"].endswith("texts per batch (default: the encoder's own)")
    assert entries["--k"].endswith("(default: search.k, 1000)")
    assert "(default" not in entries["--index"]  # required
    assert "(default" not in entries["--overwrite"]  # a switch
