"""The tokenizer of a GGUF file through the `tokenizers` library alone (a few MB, not transformers).

transformers converts the vocabulary once, in a child process; its `tokenizer.json` is cached by the
file's sha256 and later loaded with `tokenizers`. A damaged cache is converted again.

    >>> tokenizer = load_gguf_tokenizer("SmolLM2-135M-Instruct.Q4_1.gguf")
    >>> tokenizer(" great", add_special_tokens=False)["input_ids"]
    [1875]
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

from tokenizers import Tokenizer

from far.llm.gguf import gguf_cache_path
from far.storage.atomic import atomic_dir

logger = logging.getLogger(__name__)

TOKENIZER_FILE, SPECIAL_FILE = "tokenizer.json", "far_tokenizer.json"
_SPECIAL_BYTES = 1 << 16  # far_tokenizer.json holds two ids and a file name; more is not ours


class TokenizerCacheError(ValueError):
    """A cached tokenizer folder that is damaged or not what far wrote (the GGUF file converts it again)."""


class LeanTokenizer:
    """A `tokenizers.Tokenizer` with the part of transformers' tokenizer API the prompt code uses."""

    def __init__(self, tokenizer: Tokenizer, pad_token_id: int, eos_token_id: int | None = None) -> None:
        self.tokenizer, self.pad_token_id, self.eos_token_id = tokenizer, int(pad_token_id), eos_token_id
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids}

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(texts)]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)


def build_tokenizer_cache(gguf_path: str | os.PathLike, target: str | os.PathLike) -> Path:
    """Convert the GGUF file's vocabulary with transformers and save `tokenizer.json` at `target`."""
    from transformers import AutoTokenizer  # the conversion only; runs in a child process

    gguf_path = Path(gguf_path).resolve()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with atomic_dir(target) as tmp:
        tokenizer.backend_tokenizer.save(str(tmp / TOKENIZER_FILE))
        special = {"pad_token_id": pad, "eos_token_id": tokenizer.eos_token_id, "gguf": gguf_path.name}
        (tmp / SPECIAL_FILE).write_text(json.dumps(special, indent=2) + "\n")
    return Path(target)


def _special_ids(folder: Path) -> tuple[int, int | None]:
    path = folder / SPECIAL_FILE
    try:
        if path.stat().st_size > _SPECIAL_BYTES:
            raise TokenizerCacheError(f"{path} is over {_SPECIAL_BYTES:,} bytes: not a file far wrote")
        special = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as error:  # RecursionError: JSON nested past Python's stack
        raise TokenizerCacheError(f"{path} is unreadable: {str(error)[:200]}") from None
    pad, eos = (special.get("pad_token_id"), special.get("eos_token_id")) if isinstance(special, dict) else (-1, -1)
    if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in (pad, eos) if i is not None) or pad is None:
        raise TokenizerCacheError(f"{path}: the pad and end-of-text token ids must be whole numbers >= 0")
    return pad, eos


def read_tokenizer_cache(folder: str | os.PathLike) -> LeanTokenizer:
    """The tokenizer a cache folder holds, checked: every id it can give must lie inside its vocabulary,
    so a damaged file cannot send a model an id past its embedding (`TokenizerCacheError`).
    """
    folder = Path(folder)
    pad, eos = _special_ids(folder)
    try:
        tokenizer = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
        ids = tokenizer.get_vocab(with_added_tokens=True).values()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as error:  # noqa: BLE001 - tokenizers raises a bare Exception, or a Rust panic (pyo3's
        # PanicException, a BaseException), for a file it cannot read
        raise TokenizerCacheError(f"{folder / TOKENIZER_FILE} is unreadable: {str(error)[:200]}") from None
    size = len(ids)
    if size == 0 or max(ids) >= size or max(pad, eos or 0) >= size:
        raise TokenizerCacheError(
            f"{folder} holds token ids past its own vocabulary of {size} tokens (highest {max(ids, default=-1)}, "
            f"pad {pad}, end of text {eos}): damaged, or not a tokenizer far converted"
        )
    return LeanTokenizer(tokenizer, pad, eos)


def _convert(gguf_path: str | os.PathLike, folder: Path) -> None:
    """Run `build_tokenizer_cache` in a child process: transformers stays out of this one."""
    code = "import sys; from far.llm.tokenizer import build_tokenizer_cache as b; b(sys.argv[1], sys.argv[2])"
    done = subprocess.run([sys.executable, "-c", code, str(gguf_path), str(folder)], capture_output=True, text=True)
    if done.returncode != 0 or not (folder / SPECIAL_FILE).is_file():
        raise RuntimeError(f"converting the tokenizer of {gguf_path} failed:\n{done.stderr[-3000:]}")


def load_gguf_tokenizer(gguf_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> LeanTokenizer:
    """The tokenizer of `gguf_path`, converted once (in a child process) and cached; a cache that fails
    `read_tokenizer_cache` is converted again, with a warning.
    """
    folder = Path(f"{gguf_cache_path(gguf_path, cache_dir)}-tokenizer")
    if folder.exists():
        try:
            return read_tokenizer_cache(folder)
        except TokenizerCacheError as error:
            logger.warning("%s; converting the tokenizer of %s again", error, gguf_path)
    _convert(gguf_path, folder)
    return read_tokenizer_cache(folder)
