"""Every `far` command line in README.md and docs/*.md parses with the real `far` parser, flag for flag.

The fast half of the README check (no training): a renamed or removed flag, a wrong choice or a
missing required argument in the docs fails here. tests/test_readme_commands.py runs the same
commands, shrunk. `far --version` answers without importing torch.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import far
from far.cli.main import COMMANDS, build_parser, main

ROOT = Path(__file__).resolve().parent.parent
# Reading order: the README first, since the docs' commands use what its commands write.
DOCUMENTS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
FAR_PROGRAMS = ("far", ".venv/bin/far")
STEP_SEPARATORS = ("&&", ";")
_BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
_INLINE_FAR = re.compile(r"`([^`\n]*\bfar (?:[a-z]+\|)*(?:" + "|".join(COMMANDS) + r")\b[^`\n]*)`")


@dataclass(frozen=True)
class ShellLine:
    """One logical line of a ```bash block (continuations joined, comments dropped), as shell words."""

    document: str
    text: str
    words: tuple[str, ...]

    def steps(self) -> list[list[list[str]]]:
        """The line's steps (split at && and ;), each a pipeline: a list of commands, each a list of words."""
        steps: list[list[list[str]]] = [[[]]]
        for word in self.words:
            if word in STEP_SEPARATORS:
                steps.append([[]])
            elif word == "|":
                steps[-1].append([])
            else:
                steps[-1][-1].append(word)
        return steps

    def far_commands(self) -> list[list[str]]:
        """The arguments of every `far` command on the line (program name dropped)."""
        return [cmd[1:] for step in self.steps() for cmd in step if cmd and cmd[0] in FAR_PROGRAMS]


def shell_words(text: str) -> tuple[str, ...]:
    """Shell words, with the operators (&&, |, ;, >) as words of their own and comments dropped."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return tuple(lexer)


def shell_lines(path: Path) -> list[ShellLine]:
    """The logical lines of every ```bash block of a Markdown file."""
    lines = []
    for block in _BASH_BLOCK.findall(path.read_text()):
        for text in block.replace("\\\n", " ").splitlines():
            words = shell_words(text)
            if words:
                lines.append(ShellLine(path.relative_to(ROOT).as_posix(), " ".join(text.split()), words))
    return lines


def documented_lines() -> list[ShellLine]:
    return [line for path in DOCUMENTS for line in shell_lines(path)]


def inline_commands() -> list[tuple[str, str]]:
    """(document, text) of every inline code span in the docs that holds a `far <command>` line."""
    return [
        (path.relative_to(ROOT).as_posix(), span)
        for path in DOCUMENTS
        for span in _INLINE_FAR.findall(path.read_text())
    ]


def subcommand_parser(command: str) -> argparse.ArgumentParser:
    parser = build_parser(command)
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices[command]


def option_strings(command: str) -> set[str]:
    return {s for action in subcommand_parser(command)._actions for s in action.option_strings}


def parse_error(argv: list[str]) -> str | None:
    """What the real `far` parser says about `argv`, or None if it parses (abbreviated flags count as errors)."""
    command = next((w for w in argv if not w.startswith("-")), None)
    if command not in COMMANDS:
        return f"{command!r} is not a far command ({', '.join(COMMANDS)})"
    known = option_strings(command)
    unknown = [w for w in argv if w.startswith("--") and w.split("=")[0] not in known]
    if unknown:
        return f"unknown flag(s) {unknown} for far {command}"
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            build_parser(command).parse_args(argv)
    except SystemExit:
        return stderr.getvalue().strip().splitlines()[-1]
    return None


def test_the_documents_have_far_commands():
    lines = documented_lines()
    assert sum(len(line.far_commands()) for line in lines) >= 20, [line.text for line in lines]
    assert {line.document for line in lines if line.far_commands()} >= {"README.md", "docs/cli.md", "docs/your-data.md"}


def test_every_documented_far_command_parses():
    errors = [
        f"{line.document}: {line.text}\n    {error}"
        for line in documented_lines()
        for argv in line.far_commands()
        if (error := parse_error(argv))
    ]
    assert not errors, "\n".join(errors)


def test_every_inline_far_command_names_real_flags():
    spans = inline_commands()
    assert len(spans) >= 10
    errors = []
    for document, span in spans:
        words = span.replace("[", " ").replace("]", " ").split()
        at = words.index("far")
        for command in words[at + 1].split("|"):
            known = option_strings(command)
            stale = [w for w in words[at + 2 :] if w.startswith("--") and w.split("=")[0] not in known]
            if stale:
                errors.append(f"{document}: `{span}`: far {command} has no {stale}")
    assert not errors, "\n".join(errors)


def test_a_stale_flag_is_caught():
    assert parse_error(["glue", "--task", "cola", "--max-step", "2"]) == "unknown flag(s) ['--max-step'] for far glue"
    assert "invalid choice" in parse_error(["glue", "--task", "cola", "--method", "farr"])
    assert "required" in parse_error(["eval"])
    assert parse_error(["glue", "--task", "cola", "--max-steps", "2"]) is None
    line = ShellLine("x.md", "", shell_words('echo "a | b" | far predict --model m  # and a comment'))
    assert line.far_commands() == [["predict", "--model", "m"]]


def test_version_answers_without_importing_torch():
    code = (
        "import sys\n"
        "from far.cli.main import main\n"
        "code = main(['--version'])\n"
        "heavy = [m for m in ('torch', 'transformers', 'datasets', 'far.cli.common') if m in sys.modules]\n"
        "print(code, heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.splitlines() == [f"far {far.__version__}", "0 []"]
    shown = subprocess.run(
        [sys.executable, "-m", "far.cli.main", "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    assert shown.stdout.strip() == f"far {far.__version__}"


def test_help_still_lists_every_command(capsys):
    assert main(["--help"]) == 0
    listed = capsys.readouterr().out
    assert all(command in listed for command in COMMANDS)
    assert main([]) == 2
    assert "required: COMMAND" in capsys.readouterr().err
