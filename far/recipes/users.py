"""Predictions for a folder of users from one process: the base loads once and each learners file is swapped in.

Each file stands on its own: its head, labels and text columns come from the file and the base, never
from the user before it, so every user's predictions are the same in any order; a file that is refused
is reported and skipped, and the others are written.

    >>> done = predict_users("minilm", ["users/"], "new.csv", output_dir="predictions/")
    >>> done.written, done.failed
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import datasets

from far.data.files import DataFileError
from far.recipes.predict import (
    OUTPUT_FORMATS,
    ModelCard,
    Predictor,
    model_card,
    note_label_ids,
    read_inputs,
    write_predictions,
)
from far.saving import LearnersFileError, active_learners, load_learners, unload_learners
from far.training.memory import release_freed_memory


def learners_files(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """The learners files named: files, and folders of `*.safetensors` files (sorted); each user once.

    Raises:
        ValueError: a path that does not exist, an empty folder, or two files of the same name
            (their predictions would go to the same output file).
    """
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(path.glob("*.safetensors"))
            if not found:
                raise ValueError(f"--learners {str(path)!r} is a folder with no .safetensors file in it")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise ValueError(f"--learners {str(path)!r}: no such file or folder")
    stems = [f.stem for f in files]
    twice = sorted({s for s in stems if stems.count(s) > 1})
    if twice:
        raise ValueError(f"learners files share the name(s) {twice}: each user's predictions go to <name>.<format>")
    return files


@dataclass(frozen=True)
class UsersPredictions:
    """What `predict_users` did for each learners file: written, or skipped and why."""

    written: dict[Path, dict]  # output file -> {"rows": n, "swap_seconds": None for a freshly loaded base}
    failed: dict[Path, str]  # learners file -> why it was skipped (no output was written for it)


def user_output(output_dir: str | os.PathLike, learners: str | os.PathLike, suffix: str) -> Path:
    """Where a user's predictions go: `<output_dir>/<learners file stem><suffix>`."""
    return Path(output_dir) / f"{Path(learners).stem}{suffix}"


def _rows_by_columns(
    inputs: datasets.Dataset | Sequence | str | os.PathLike | io.TextIOBase,
) -> Callable[[ModelCard], datasets.Dataset | Sequence]:
    """A function from a user's card to the inputs as rows: a file or stream is read (once per set of
    text columns, a stream held in memory) with the columns that user's model reads."""
    if not isinstance(inputs, (str, os.PathLike, io.TextIOBase)):
        return lambda card: inputs  # texts or a dataset: each predictor reads them as its card says
    text = inputs.read() if isinstance(inputs, io.TextIOBase) else None
    read: dict[tuple[str, ...], datasets.Dataset] = {}

    def rows(card: ModelCard) -> datasets.Dataset:
        if card.text_columns not in read:
            source = inputs if text is None else io.StringIO(text)
            read[card.text_columns] = read_inputs(source, card.text_columns)
        return read[card.text_columns]

    return rows


def _needs_base(predictor: Predictor | None, card: ModelCard) -> bool:
    """Whether a user's file needs the base loaded afresh: no predictor yet, or a head of another size."""
    return predictor is None or predictor.card.head_size != card.head_size


def _hold(predictor: Predictor | None, model: str | os.PathLike, path: Path, card: ModelCard, **sizes) -> Predictor:
    """A predictor holding `path`'s learners file and nothing of any other user's.

    The file swaps in place for the one `predictor` holds when their heads have the same size (where
    the two cannot swap, one splitting attention heads and the other not, the held one is taken off
    first); otherwise the base is loaded afresh with the file's head. Either way the file is judged
    against the base alone. A refused file raises; `predictor` then holds the previous user or the
    bare base, so it must take another file before it predicts.
    """
    if _needs_base(predictor, card):
        return Predictor.load(model, learners=path, card=card, **sizes)
    try:
        load_learners(predictor.model, path)
    except LearnersFileError:
        if active_learners(predictor.model) is None:
            raise
        unload_learners(predictor.model)  # the base alone: the file's verdict is then its own
        load_learners(predictor.model, path)
    predictor.card = card
    note_label_ids(path, card)
    return predictor


# What skips one user and not the others: its file refused or gone, inputs its model cannot read.
USER_ERRORS = (LearnersFileError, DataFileError, OSError)


def predict_users(
    model: str | os.PathLike,
    learners: Sequence[str | os.PathLike],
    inputs: datasets.Dataset | Sequence[str | Sequence[str] | Mapping[str, str]] | str | os.PathLike | io.TextIOBase,
    *,
    output_dir: str | os.PathLike,
    suffix: str = ".jsonl",
    max_length: int = 128,
    batch_size: int = 64,
    on_written: Callable[[Path, dict, Predictor], None] | None = None,
) -> UsersPredictions:
    """Each user's predictions from one process: the base loads once (again only for a head of another
    size) and every learners file is swapped in place.

    `far.load_learners` replaces the active user's tensors with the next user's (memory stays at the
    base plus one file). Each file stands on its own: its head's size and labels and its text
    columns come from the file (a file with a head of another size gets the base afresh), so every
    user's predictions are the same in any order. A file that is refused (another base, damaged) or
    whose model cannot read the inputs is skipped, with its reason in the result; every other
    user's predictions are written, `user_output(output_dir, file, suffix)` each, whole or not at all.

    Args:
        inputs: Texts (or a dataset), or a CSV/TSV/JSON/JSONL file or a text stream, read with
            each user's text columns.
        on_written: Called as each user's predictions are written, with the output file, its entry of
            `written` and the predictor (holding that user's file): to report progress as it goes.

    Returns:
        A `UsersPredictions`: `written[output file] = {"rows": n, "swap_seconds": time to put this
        user's file in place, None where the base was loaded for it}`, `failed[learners file] = reason`.
    """
    if suffix not in OUTPUT_FORMATS:
        raise ValueError(f"the output format is one of {', '.join(OUTPUT_FORMATS)}, got {suffix!r}")
    files = learners_files(learners)
    rows_for = _rows_by_columns(inputs)
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    # A swap frees a user's tensors as large as its file; returned to the system, not kept by the
    # allocator, they leave the resident memory at the base plus one file from user to user.
    release_freed_memory()
    predictor, written, failed = None, {}, {}
    for path in files:
        try:
            card = model_card(model, path)
            fresh, started = _needs_base(predictor, card), time.perf_counter()
            predictor = None if fresh else predictor  # one model in memory at a time
            predictor = _hold(predictor, model, path, card, max_length=max_length, batch_size=batch_size)
            seconds = None if fresh else time.perf_counter() - started
            results = predictor(rows_for(card))
        except USER_ERRORS as error:
            failed[path] = str(error)
            continue
        out = write_predictions(results, user_output(output_dir, path, suffix))
        written[out] = {"rows": len(results), "swap_seconds": seconds}
        if on_written is not None:
            on_written(out, written[out], predictor)
    return UsersPredictions(written, failed)
