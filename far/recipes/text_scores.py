"""Perplexity of any text under a causal LM fine-tuned on texts (`far eval --checkpoint RUN --text-file F`).

The run's folder says which GGUF model it trained (metrics.json) and holds what it trained
(`learners.safetensors`); the model is loaded from the GGUF file with that put back, and the text is
read, tokenised and packed as the training texts were (`far.data.texts`), into chunks of the run's length.

    >>> scores = text_perplexity("runs/notes-smollm2-135m-far", "letter.txt")
    >>> scores["perplexity"], scores["token_accuracy"]
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from far.data.texts import pack, read_texts, tokenize
from far.evaluation.perplexity import perplexity
from far.models import load_lean_lm

NEXT_TOKEN = "next-token"  # metrics.json's "objective" of a run on texts (far.recipes.own_texts)


def is_text_run(folder: str | os.PathLike) -> bool:
    """Whether `folder` holds a finished causal-LM run on texts."""
    try:
        return json.loads((Path(folder) / "metrics.json").read_text()).get("objective") == NEXT_TOKEN
    except (OSError, ValueError):
        return False


def text_perplexity(
    run_dir: str | os.PathLike, text_file: str | os.PathLike, batch_size: int = 8, max_length: int | None = None
) -> dict:
    """{"perplexity", "token_accuracy", "loss", "tokens"} of `text_file` (a file or folder) under the run's model.

    Raises:
        ValueError: not a finished run on texts, or a text that is unreadable or shorter than one chunk.
    """
    run_dir = Path(run_dir)
    if not is_text_run(run_dir):
        raise ValueError(f"{run_dir} holds no finished causal-LM run on texts (its metrics.json says otherwise)")
    record = json.loads((run_dir / "metrics.json").read_text())
    length = max_length or record["hyperparameters"]["max_length"]
    documents = read_texts(text_file)  # bad text is refused before the model loads
    learners = record["files"].get("learners")
    model, tokenizer = load_lean_lm(record["model"], trained=None if learners is None else run_dir / learners)
    chunks = pack(tokenize(documents, tokenizer), length, str(text_file))
    return {**perplexity(model, chunks, batch_size), "chunks": len(chunks), "max_length": length}
