"""A user's own texts for a causal LM: read, tokenised, packed into chunks, a part held out.

A folder (every .txt, .md and .jsonl file under it, sorted) or one such file: a .txt or .md file is
one document, each .jsonl line an object whose "text" field is one. Non-UTF-8 files, empty files and
texts shorter than one chunk are refused, named, before any model loads.

Each document is followed by the end-of-sequence token (so the next does not read as its
continuation); all are concatenated and cut into chunks of exactly `max_length` tokens, the shorter
rest dropped (as run_clm.py does), so no position is padding. Without a validation file a seeded
share of whole documents is held out (of the chunks, when there are too few documents).

    >>> texts = load_text_chunks("notes/", tokenizer, max_length=256, seed=0)
    >>> texts.train.shape, texts.validation.shape      # (n, 256) token ids each
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from far.llm.tokenizer import LeanTokenizer

TEXT_SUFFIXES = (".txt", ".md")
JSONL_SUFFIX = ".jsonl"
SUFFIXES = (*TEXT_SUFFIXES, JSONL_SUFFIX)
TEXT_FIELD = "text"
DEFAULT_HOLDOUT = 0.1


@dataclass(frozen=True)
class Document:
    """One text and where it came from (`file`, or `file:line` for a .jsonl line)."""

    source: str
    text: str


@dataclass(frozen=True)
class TextChunks:
    """Packed chunks of token ids for training and for scoring, and how they were made."""

    train: Tensor  # (n_train, max_length) int64
    validation: Tensor  # (n_validation, max_length) int64
    info: dict = field(default_factory=dict)


def _decode(path: Path, data: bytes) -> str:
    if not data.strip():
        raise ValueError(f"{path} is empty: give a file with some text in it")
    if b"\x00" in data[:8192]:
        offset = data.index(b"\x00")
        raise ValueError(f"{path} is not a text file (a NUL byte at offset {offset}: binary data); give .txt/.md text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{path} is not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}); convert it with iconv, e.g. "
            f"iconv -f latin1 -t utf-8 {path} > {path.stem}.utf8{path.suffix}"
        ) from None


def _jsonl_documents(path: Path, text: str) -> list[Document]:
    documents = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{path}:{number} is not a JSON object ({e.msg}); each line holds one") from None
        value = row.get(TEXT_FIELD) if isinstance(row, dict) else None
        if not isinstance(value, str):
            raise ValueError(f'{path}:{number} has no string "{TEXT_FIELD}" field: each line is {{"text": "..."}}')
        if value.strip():
            documents.append(Document(f"{path}:{number}", value))
    if not documents:
        raise ValueError(f'{path} holds no text: each line is {{"text": "..."}} with some text in it')
    return documents


def read_file(path: str | os.PathLike) -> list[Document]:
    """The documents of one .txt/.md (one document) or .jsonl file (one per line's "text"); checked."""
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise ValueError(f"{path} is not a .txt, .md or .jsonl file; rename it or convert it")
    text = _decode(path, path.read_bytes())
    if path.suffix.lower() == JSONL_SUFFIX:
        return _jsonl_documents(path, text)
    return [Document(str(path), text)]


def read_texts(path: str | os.PathLike) -> list[Document]:
    """Every document under `path`: a folder (its .txt/.md/.jsonl files, recursively, sorted) or one file."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: give a folder of .txt/.md/.jsonl files or one such file")
    if path.is_file():
        return read_file(path)
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES)
    if not files:
        raise ValueError(f"{path} holds no .txt, .md or .jsonl file")
    return [document for file in files for document in read_file(file)]


def tokenize(documents: list[Document], tokenizer: LeanTokenizer) -> list[list[int]]:
    """Each document's token ids, the end-of-sequence token after each."""
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no end-of-sequence token to separate documents with")
    return [ids + [tokenizer.eos_token_id] for ids in tokenizer.encode_batch([d.text for d in documents])]


def pack(token_lists: list[list[int]], max_length: int, what: str = "the texts") -> Tensor:
    """The token lists concatenated and cut into (n, max_length) chunks; the shorter tail is dropped."""
    total = sum(len(ids) for ids in token_lists)
    if total < max_length:
        raise ValueError(
            f"{what} hold {total} tokens, fewer than one chunk of --max-length {max_length}: give more text, or a "
            f"--max-length of at most {total}"
        )
    flat = torch.tensor([t for ids in token_lists for t in ids], dtype=torch.long)
    n = total // max_length
    return flat[: n * max_length].view(n, max_length)


def _held_out_documents(lengths: list[int], holdout: float, seed: int) -> set[int] | None:
    """Seeded documents holding about `holdout` of the tokens; None if no split by documents leaves both sides
    at least one chunk (then chunks are held out instead)."""
    order = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(seed)).tolist()
    total, wanted, held, chosen = sum(lengths), holdout * sum(lengths), 0, set()
    for i in order:
        if held >= wanted:
            break
        chosen.add(i)
        held += lengths[i]
    return chosen if 0 < len(chosen) < len(lengths) and held < total else None


def split_and_pack(
    token_lists: list[list[int]], max_length: int, holdout: float = DEFAULT_HOLDOUT, seed: int = 0
) -> tuple[Tensor, Tensor, str]:
    """Training (n, max_length) and held-out (m, max_length) chunks, and "documents" or "chunks": what was held
    out (whole documents where possible)."""
    if not 0 < holdout < 1:
        raise ValueError(f"the held-out share must lie in (0, 1), got {holdout}")
    chosen = _held_out_documents([len(ids) for ids in token_lists], holdout, seed)
    if chosen is not None:
        held = [ids for i, ids in enumerate(token_lists) if i in chosen]
        kept = [ids for i, ids in enumerate(token_lists) if i not in chosen]
        if sum(map(len, held)) >= max_length and sum(map(len, kept)) >= max_length:
            return pack(kept, max_length), pack(held, max_length, "the held-out texts"), "documents"
    chunks = pack(token_lists, max_length)
    if len(chunks) < 2:
        raise ValueError(
            f"the texts make {len(chunks)} chunk of --max-length {max_length} tokens; holding a part out needs 2 at "
            "least: give more text, a smaller --max-length, or a --validation-file"
        )
    n_held = max(1, math.floor(holdout * len(chunks)))
    order = torch.randperm(len(chunks), generator=torch.Generator().manual_seed(seed))
    held = order[:n_held].sort().values
    kept = order[n_held:].sort().values
    return chunks[kept], chunks[held], "chunks"


def load_text_chunks(
    train_path: str | os.PathLike,
    tokenizer: LeanTokenizer,
    max_length: int,
    validation_path: str | os.PathLike | None = None,
    holdout: float = DEFAULT_HOLDOUT,
    seed: int = 0,
) -> TextChunks:
    """Read, tokenise and pack a user's texts (a folder of .txt/.md/.jsonl files, or one such file) into chunks of
    `max_length` tokens, with a validation part: the texts at `validation_path`, else a seeded `holdout` share
    of the tokens (by whole documents where possible)."""
    documents = read_texts(train_path)
    validation_documents = read_texts(validation_path) if validation_path is not None else None
    token_lists = tokenize(documents, tokenizer)
    if validation_documents is None:
        train, validation, held_out = split_and_pack(token_lists, max_length, holdout, seed)
    else:
        train = pack(token_lists, max_length, f"the training texts ({train_path})")
        validation = pack(
            tokenize(validation_documents, tokenizer), max_length, f"the validation texts ({validation_path})"
        )
        held_out = None
    info = {
        "train_source": str(train_path),
        "validation_source": None if validation_path is None else str(validation_path),
        "documents": len(documents),
        "tokens": sum(len(ids) for ids in token_lists),
        "held_out": held_out,
        "holdout": holdout if held_out else None,
        "max_length": max_length,
        "train_chunks": len(train),
        "validation_chunks": len(validation),
    }
    return TextChunks(train, validation, info)
