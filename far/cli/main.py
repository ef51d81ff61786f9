"""The `far` console command: one argparse parser, one module per subcommand.

Each subcommand is a module `far.cli.<name>` with `register(subparsers)` (adding its parser with
`set_defaults(func=run)`) and `run(args) -> int`. Expected user errors (`UsageError`, ValueError,
OSError such as a missing file) are printed as `far <cmd>: error: <message>` with exit code 2 and no traceback.

    $ far glue --task cola --method far --retention 0.4
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

import far
from far.cli.common import UsageError

# Subcommand modules, in help order; one not in this install (a later feature) is left out.
SUBCOMMANDS = ("demo", "glue", "squad", "eval", "export", "bench")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="far", description="FAR (Freeze And Reconfigure) and MeZO fine-tuning: GLUE and SQuAD scripts."
    )
    parser.add_argument("--version", action="version", version=f"far {far.__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"far.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"far.cli.{name}":
                continue
            raise
        module.register(subparsers)
    return parser


def _log_to_stderr() -> None:
    # Show far's progress messages once, without touching the root logger of a host program.
    logger = logging.getLogger("far")
    if not any(getattr(h, "_far_cli", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._far_cli = True
        logger.addHandler(handler)
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        logger.setLevel(logging.INFO)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `far` command with `argv` (default: sys.argv[1:]); returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse's own errors (exit 2) and --help/--version (exit 0)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    _log_to_stderr()
    try:
        return int(args.func(args) or 0)
    except (UsageError, ValueError, OSError) as e:
        print(f"far {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"far {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
