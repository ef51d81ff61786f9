"""The tokenizer of a GGUF file through the `tokenizers` library alone (a few MB, not transformers).

transformers converts a GGUF file's vocabulary into a fast tokenizer; that conversion runs once,
in a child process, and its `tokenizer.json` is cached beside the other GGUF caches (keyed by the
file's sha256, `far.llm.gguf.gguf_cache_path`). Every later run loads that file with `tokenizers`.

    >>> tokenizer = load_gguf_tokenizer("SmolLM2-135M-Instruct.Q4_1.gguf")
    >>> tokenizer(" great", add_special_tokens=False)["input_ids"]
    [1875]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tokenizers import Tokenizer

from far.llm.gguf import gguf_cache_path
from far.storage.atomic import atomic_dir

TOKENIZER_FILE, SPECIAL_FILE = "tokenizer.json", "far_tokenizer.json"


class LeanTokenizer:
    """A `tokenizers.Tokenizer` with the small part of transformers' tokenizer API the prompt code uses.

    `tokenizer(text, add_special_tokens=True)["input_ids"]`, `pad_token_id`, `eos_token_id`.
    """

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


def load_gguf_tokenizer(gguf_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> LeanTokenizer:
    """The tokenizer of `gguf_path`, converted once (in a child process) and cached.

    Raises:
        RuntimeError: the conversion failed (its error output is in the message).
    """
    folder = Path(f"{gguf_cache_path(gguf_path, cache_dir)}-tokenizer")
    if not (folder / SPECIAL_FILE).is_file():
        code = "import sys; from far.llm.tokenizer import build_tokenizer_cache as b; b(sys.argv[1], sys.argv[2])"
        done = subprocess.run([sys.executable, "-c", code, str(gguf_path), str(folder)], capture_output=True, text=True)
        if done.returncode != 0 or not (folder / SPECIAL_FILE).is_file():
            raise RuntimeError(f"converting the tokenizer of {gguf_path} failed:\n{done.stderr[-3000:]}")
    special = json.loads((folder / SPECIAL_FILE).read_text())
    return LeanTokenizer(
        Tokenizer.from_file(str(folder / TOKENIZER_FILE)), special["pad_token_id"], special["eos_token_id"]
    )
