"""One verified read of a safetensors file that records its own sha256, and the names such files go by.

An encoder's learners file (`far.saving.learners_file`) and a GGUF causal LM's (`far.llm.lean_learners`)
both keep, in their metadata, the sha256 of their own contents (`content_sha256`): the metadata without
that entry, then every tensor's name, dtype, shape and bytes. `read_verified` is the one reader of
either: nothing is unpickled (safetensors only), a file of another format is refused from its metadata
before its contents are trusted, and a flipped byte or a truncated file is refused before anything
uses a tensor.

    >>> metadata, tensors = read_verified(path, check_format, LearnersFileError, writer="far.save_learners")
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor

from far.saving.digests import CONTENT_KEY, content_sha256, hash_tensors  # noqa: F401 - read here, named here too
from far.storage.atomic import file_identity

# A run folder's learners file (far.save_learners' for an encoder, far.llm.lean_saving's for a GGUF causal LM).
LEARNERS_FILE = "learners.safetensors"
# The dtypes that learners files and trainable weights are stored in, by the name metadata and flags give them.
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
MAX_VERIFIED = 4096  # files a swapping model remembers as verified (a few hundred bytes each)
SETTLED_NS = 2_000_000_000  # a file written this recently is hashed on every load


def read_verified(
    path: str | os.PathLike,
    check_format: Callable[[Path, Mapping[str, str]], None],
    error: Callable[[str], ValueError],
    *,
    writer: str,
    verified: dict[tuple, str] | None = None,
) -> tuple[dict[str, str], dict[str, Tensor]]:
    """Metadata and tensors of a file whose contents match the sha256 it records; raises before anything is used.

    Args:
        check_format: `check_format(path, metadata)` raises unless the metadata names the caller's format;
            called before the contents are hashed.
        error: The exception to raise, from a message that starts with the file's path.
        writer: What writes such files, for the messages ("far.save_learners").
        verified: `{file identity: content sha256}`, kept on a model that swaps users: a file verified before
            and unchanged since (same inode, size, mtime and ctime, before and after this read) is not hashed
            again. A file is added once its last write is `SETTLED_NS` old: a write in the same timestamp tick
            would leave its ctime as it was (git's "racily clean" files), so a recent file is hashed every time.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no learners file at {str(path)!r}; write one with {writer}")
    try:
        identity = file_identity(path)
        with safe_open(path, framework="pt", device="cpu") as f:  # safetensors only: nothing is ever unpickled
            metadata = f.metadata() or {}
            tensors = {key: f.get_tensor(key) for key in f.keys()}
        unchanged = file_identity(path) == identity  # no write while it was read
    except Exception as failure:  # SafetensorError and OSError alike: the file is unreadable
        raise error(
            f"{str(path)!r} is not a readable safetensors file (truncated or corrupted?): {failure}. "
            f"Write it again with {writer}"
        ) from failure
    check_format(path, metadata)
    recorded = metadata.get(CONTENT_KEY)
    if unchanged and verified is not None and recorded is not None and verified.get(identity) == recorded:
        return metadata, tensors  # these very bytes matched their sha256 before
    if recorded != content_sha256(metadata, tensors):
        raise error(f"{str(path)!r} is corrupted: its contents do not match the sha256 recorded when it was written")
    if unchanged and verified is not None and identity[-1] < time.time_ns() - SETTLED_NS:
        if len(verified) >= MAX_VERIFIED:
            verified.clear()
        verified[identity] = recorded
    return metadata, tensors


def sorted_node_indices(idx: Tensor | None, n_nodes: int, empty_ok: bool = False) -> bool:
    """Whether a file's `idx` are sorted distinct int64 node indices in [0, n_nodes), none only if `empty_ok`."""
    ok = idx is not None and idx.dtype == torch.int64 and idx.dim() == 1
    if not ok or not (0 if empty_ok else 1) <= idx.numel() <= n_nodes:
        return False
    return not idx.numel() or (bool(idx[0] >= 0) and bool(idx[-1] < n_nodes) and bool((idx[1:] > idx[:-1]).all()))
