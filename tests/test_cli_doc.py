"""docs/cli.md covers every flag of every `far` command: each option in a command's `--help` is named in its section."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from far.cli.main import COMMANDS, build_parser

DOC = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
TRAINING = ("train", "glue", "squad", "prime")  # their own section, and the shared training flags'
SHARED = "Shared training flags"


def options(command: str) -> set[str]:
    parser = build_parser(command)
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {s for action in subparsers.choices[command]._actions for s in action.option_strings} - {"-h", "--help"}


def sections(text: str) -> dict[str, str]:
    """Heading -> the text under it, up to the next heading."""
    parts = re.split(r"^#+ (.+)$", text, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def named(flag: str, text: str) -> bool:
    return re.search(rf"`{re.escape(flag)}(?![\w-])", text) is not None


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_of_the_command_is_in_its_section(command):
    found = sections(DOC.read_text())
    assert f"far {command}" in found, f"docs/cli.md has no section '## far {command}'"
    text = found[f"far {command}"] + (found[SHARED] if command in TRAINING else "")
    missing = sorted(flag for flag in options(command) if not named(flag, text))
    assert not missing, f"docs/cli.md's far {command} section does not name {missing}"
