"""The `far` console command: one argparse parser, one module per subcommand.

Each subcommand is a module of `far.cli` with `register(subparsers)` (adding its parser with
`set_defaults(func=run)`) and `run(args) -> int`, listed in `COMMANDS`; a training command
registers through `far.cli.common.register_training_command`. Expected user errors (`UsageError`, ValueError,
OSError such as a missing file) are printed as `far <cmd>: error: <message>` with exit code 2 and no traceback.
`far --version` imports no command module (each pulls in torch), so it answers at once. Before a command module
loads torch, `far.hardware.fit_threads` sets its thread count from the cores that are free and lets idle threads
sleep (docs/cli.md, "Threads"); FAR_THREADS or OMP_NUM_THREADS overrides the count.

    $ far glue --task cola --method far --retention 0.4
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

import far
from far.hardware import fit_threads

# modules of far.cli, in help order
COMMANDS = ("demo", "train", "predict", "generate", "glue", "squad", "prime", "eval", "export")


def command_in(argv: Sequence[str]) -> str | None:
    """The subcommand named in `argv` (its first word that is not an option), if it is one."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in COMMANDS else None


def asks_version_only(argv: Sequence[str]) -> bool:
    """True for `far --version` (no command, no help): the parser needs no command module to answer it."""
    return command_in(argv) is None and "--version" in argv and not {"-h", "--help"} & set(argv)


def build_parser(only: str | None = None, *, commands: bool = True) -> argparse.ArgumentParser:
    """The `far` parser; with `only`, just that subcommand's (each command module is imported when
    registered, and a run imports only its own: a causal LM's run stays clear of the encoders' imports);
    with `commands=False`, none (enough for `--version`)."""
    parser = argparse.ArgumentParser(
        prog="far",
        description="FAR (Freeze And Reconfigure) and MeZO fine-tuning: your own files, GLUE and SQuAD; predictions.",
    )
    parser.add_argument("--version", action="version", version=f"far {far.__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        if commands and (only is None or name == only):
            importlib.import_module(f"far.cli.{name}").register(subparsers)
    return parser


class _StderrHandler(logging.StreamHandler):
    """far's progress messages on stderr; a class of its own, so that `main` adds it only once.

    Like logging's last-resort handler, it writes to `sys.stderr` as it is at each message, not as it was when
    the first `main` ran: a host program (or a test capturing output) may have replaced it since."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self):
        return sys.stderr


def _log_to_stderr() -> None:
    # Show far's progress messages once, without touching the root logger of a host program.
    logger = logging.getLogger("far")
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        logger.setLevel(logging.INFO)


# Loggers of other packages whose warnings a far user cannot act on. With the `device` extra installed,
# transformers imports torchao with its model code: torchao then warns that its CUDA-only kernels do not load
# on a CPU, and torch that torchao registers enums in a way it deprecates. Errors still show.
QUIET_LOGGERS = ("torchao", "torch.utils._pytree")


def _quiet_foreign_warnings() -> None:
    for name in QUIET_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:  # a level the host program set is left as it is
            logger.setLevel(logging.ERROR)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `far` command with `argv` (default: sys.argv[1:]); returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    _quiet_foreign_warnings()
    try:  # before any command module imports torch, which reads the thread settings once, when it loads
        threads = None if asks_version_only(argv) else fit_threads()
    except ValueError as e:
        print(f"far: error: {e}", file=sys.stderr)
        return 2
    parser = build_parser(command_in(argv), commands=not asks_version_only(argv))
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse's own errors (exit 2) and --help/--version (exit 0)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    # Loaded by name once a command is chosen: its module has imported it already, and `far --version` never does.
    usage_error = importlib.import_module("far.cli.common").UsageError
    _log_to_stderr()
    if threads is not None:
        logging.getLogger("far").info(
            "threads: %d, %s wait (%s; FAR_THREADS=N sets the count)",
            threads.threads,
            threads.wait_policy.lower(),
            threads.reason,
        )
    try:
        return int(args.func(args) or 0)
    except (usage_error, ValueError, OSError) as e:
        print(f"far {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"far {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
