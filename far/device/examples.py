"""Training examples for a device program: texts tokenised once, padded to the program's length, in one file.

    OUT.safetensors:  input_ids, attention_mask, token_type_ids   int64 (N, max_length), right-padded
                      labels                                       int64 (N,) class ids; float32 for regression
    metadata:         format "far.device.examples", format_version "1", max_length, num_labels,
                      base_fingerprint (the export it was made for), truncated (examples cut),
                      labels (the class names in id order, as JSON; read where present)

An example longer than the program's `max_length` is refused by default, naming it: a silently
cut text trains on something else than it says. `truncate=True` cuts such examples to
`max_length` tokens instead (the tokenizer's `longest_first` for pairs), and the file records how
many were cut.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import Tensor

from far.data.files import DEFAULT_LABEL_COLUMN, resolve_text_columns
from far.data.table import DataFileError, read_table
from far.device.manifest import TOKENIZER, DeviceFileError, read_manifest, read_safetensors, sha256_file
from far.storage.atomic import atomic_file

FORMAT, FORMAT_VERSION = "far.device.examples", "1"
_FIELDS = ("input_ids", "attention_mask", "token_type_ids")


def _manifest(export: str | os.PathLike | Mapping) -> tuple[Mapping, Path | None]:
    if isinstance(export, Mapping):
        return export, None
    return read_manifest(export, verify_programs=False), Path(export)


def _label_id(value: object, names: Sequence[str], where: str) -> int:
    text = value.strip() if isinstance(value, str) else str(value)
    if text in names:
        return names.index(text)
    try:
        number = int(text)
    except ValueError:
        number = -1
    if 0 <= number < len(names):
        return number  # a class id, where the names are not the labels the data uses
    raise DataFileError(
        f"{where}: label {value!r} is none of the program's classes {list(names)} (nor a class id 0-{len(names) - 1})"
    )


def _labels(values: Sequence, manifest: Mapping, where: str) -> Tensor:
    names = manifest["task"]["labels"]
    if manifest["task"]["kind"] == "regression":
        try:
            return torch.tensor([float(v) for v in values], dtype=torch.float32)
        except (TypeError, ValueError) as error:
            raise DataFileError(f"{where}: a regression label is not a number: {error}") from error
    return torch.tensor([_label_id(v, names, f"{where}, example {i}") for i, v in enumerate(values)], dtype=torch.long)


def _from_file(
    path: Path, text_columns: Sequence[str] | None, label_column: str
) -> tuple[list[str], list[str] | None, list]:
    """(first texts, second texts or None, labels) of a data file, read as `far train` reads one."""
    table = read_table(path)
    if label_column not in table.column_names:
        raise DataFileError(f"{path} has no label column {label_column!r} (its columns: {table.column_names})")
    columns = resolve_text_columns(path, table.column_names, text_columns, label_column)
    texts = [[str(v) for v in table[c]] for c in columns]
    return texts[0], texts[1] if len(texts) > 1 else None, list(table[label_column])


def _split(texts: Sequence) -> tuple[list[str], list[str] | None]:
    if all(isinstance(t, str) for t in texts):
        return list(texts), None
    if all(isinstance(t, (tuple, list)) and len(t) == 2 for t in texts):
        return [t[0] for t in texts], [t[1] for t in texts]
    raise TypeError("texts must be strings, or (text, text) pairs for a pair task")


def _load_tokenizer(folder: Path | None, manifest: Mapping):
    if folder is None:
        raise ValueError("pass the tokenizer, or the export folder (whose tokenizer.json is then used)")
    from transformers import PreTrainedTokenizerFast  # the export's tokenizer.json, as transformers reads it

    return PreTrainedTokenizerFast(tokenizer_file=str(folder / TOKENIZER), pad_token=manifest["tokenizer"]["pad_token"])


def write_examples(
    data: str | os.PathLike | Sequence,
    tokenizer,
    export: str | os.PathLike | Mapping,
    path: str | os.PathLike,
    *,
    labels: Sequence | None = None,
    text_columns: Sequence[str] | None = None,
    label_column: str = DEFAULT_LABEL_COLUMN,
    truncate: bool = False,
) -> Path:
    """Tokenise examples for the programs of an export folder and write them to `path`, atomically.

    Args:
        data: A CSV/TSV/JSON/JSONL file (read as `far train` reads one), or a list of texts (or of
            (text, text) pairs) with `labels`.
        tokenizer: The model's Hugging Face tokenizer; None reads the export folder's tokenizer.json.
        export: The export folder (or its manifest, as a dict).
        path: The examples file to write (.safetensors).
        labels: With a list of texts: class names or ids (numbers for regression).
        text_columns, label_column: With a file: which columns to read (defaults as `far train`).
        truncate: Cut examples longer than the program's max_length instead of refusing them.

    Returns:
        The path written.

    Raises:
        DataFileError: a label outside the program's classes, an example too long (without
            `truncate`), or anything wrong with the file; nothing is written then.

    Example:
        >>> write_examples(["great", "awful"], tokenizer, "OUT", "ex.safetensors", labels=["pos", "neg"])
    """
    manifest, folder = _manifest(export)
    if isinstance(data, (str, os.PathLike)):
        first, second, values = _from_file(Path(data), text_columns, label_column)
        where = str(data)
    else:
        if labels is None or len(labels) != len(data):
            raise ValueError("give one label per text (labels=...)")
        (first, second), values, where = _split(data), list(labels), "examples"
    if not first:
        raise DataFileError(f"{where}: no examples")
    target = _labels(values, manifest, where)
    tokenizer = _load_tokenizer(folder, manifest) if tokenizer is None else tokenizer
    length = int(manifest["max_length"])
    lengths = [len(ids) for ids in tokenizer(first, second, truncation=False)["input_ids"]]
    long = [i for i, n in enumerate(lengths) if n > length]
    if long and not truncate:
        shown = ", ".join(f"{i} ({lengths[i]} tokens)" for i in long[:3])
        raise DataFileError(
            f"{where}: {len(long)} example(s) exceed the program's max_length of {length} tokens: {shown}"
            f"{' ...' if len(long) > 3 else ''}. Export with a larger --max-length, or pass truncate=True to cut them"
        )
    encoded = tokenizer(first, second, padding="max_length", truncation=True, max_length=length, return_tensors="pt")
    tensors = {name: encoded[name].to(torch.long).contiguous() for name in _FIELDS if name in encoded}
    tensors.setdefault("token_type_ids", torch.zeros_like(tensors["input_ids"]))
    if int(tensors["input_ids"].max()) >= int(manifest["vocab_size"]):
        raise ValueError(
            f"the tokenizer gives token ids up to {int(tensors['input_ids'].max())}, beyond the model's vocabulary of "
            f"{manifest['vocab_size']}: pass the model's own tokenizer (or None for the export's tokenizer.json)"
        )
    tensors["labels"] = target
    metadata = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "max_length": str(length),
        "num_labels": str(manifest["task"]["num_labels"]),
        "base_fingerprint": manifest["base_fingerprint"],
        "truncated": str(len(long)),
        "labels": json.dumps(list(manifest["task"]["labels"])),
    }
    with atomic_file(path) as tmp:
        save_file(tensors, tmp, metadata=metadata)
    return Path(path)


def read_examples(path: str | os.PathLike, manifest: Mapping) -> tuple[dict[str, Tensor], str]:
    """The tensors of an examples file made for this export, and the file's sha256.

    Raises:
        DeviceFileError: unreadable, not an examples file, or made for another export (its length,
            task or base model differ).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no examples file at {str(path)!r}; write one with far.device.write_examples")
    metadata, tensors = read_safetensors(path)
    if metadata.get("format") != FORMAT or metadata.get("format_version") != FORMAT_VERSION:
        raise DeviceFileError(f"{str(path)!r} is not a far.device examples file; write it with write_examples")
    n_labels = str(manifest["task"]["num_labels"])
    if metadata.get("base_fingerprint") != manifest["base_fingerprint"] or metadata.get("num_labels") != n_labels:
        raise DeviceFileError(f"{str(path)!r} was written for another export (another base model or task)")
    names = json.dumps(list(manifest["task"]["labels"]))
    if metadata.get("labels", names) != names:  # class ids of other classes: each example would train another class
        raise DeviceFileError(
            f"{str(path)!r} was written for another export, whose classes are {metadata['labels'][:200]} (this "
            f"program's are {names}): other classes under the same ids; write the examples for this export"
        )
    length = int(manifest["max_length"])
    n = tensors["labels"].shape[0] if "labels" in tensors else -1
    for name in _FIELDS:
        tensor = tensors.get(name)
        if tensor is None or tensor.dtype != torch.long or tuple(tensor.shape) != (n, length):
            raise DeviceFileError(f"{str(path)!r}: {name} must be int64 ({n}, {length}), the program's shape")
    # ids outside the vocabulary would index past the program's embedding table on the device
    types = (manifest.get("model_config") or {}).get("type_vocab_size", 2)
    ranges = {"input_ids": int(manifest["vocab_size"]), "attention_mask": 2, "token_type_ids": int(types)}
    for name, bound in ranges.items():
        if name in tensors and not bool(((tensors[name] >= 0) & (tensors[name] < bound)).all()):
            raise DeviceFileError(f"{str(path)!r}: {name} holds values outside [0, {bound}), which this program reads")
    labels = tensors["labels"]
    if manifest["task"]["kind"] == "regression":
        ok = labels.dtype == torch.float32
    else:
        ok = labels.dtype == torch.long and bool(((labels >= 0) & (labels < int(n_labels))).all())
    if not ok:
        raise DeviceFileError(f"{str(path)!r}: labels are not {manifest['task']['kind']} targets of this program")
    return tensors, sha256_file(path)
