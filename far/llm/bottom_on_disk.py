"""A text run's frozen bottom computed once for every chunk the run will read, kept on disk, then freed.

The states go into a scratch file (`far.llm.state_file`) before `LeanCausalLM.release_bottom` frees the
bottom's weights and before the optimizer's state is made, so an AdamW run's peak never holds both.

    >>> cache = keep_bottom_on_disk(model, depth, [train_chunks, validation_chunks], out)
    >>> cache.store.close()   # gives the disk back (so does the process's end)
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from torch import Tensor

from far.llm.lean_model import LeanCausalLM
from far.llm.prefix import PrefixCache
from far.llm.state_file import StateFile

# Room left on the disk after the states: never fill it for a cache.
SPARE_DISK_BYTES = 256 * 2**20
logger = logging.getLogger(__name__)


def states_bytes(model: LeanCausalLM, n_rows: int, length: int) -> int:
    """Disk the states of `n_rows` chunks of `length` tokens take (fp32, as the bottom computes them)."""
    return n_rows * length * model.config.hidden_size * 4


def keep_bottom_on_disk(model: LeanCausalLM, depth: int, chunks: list[Tensor], folder: Path) -> PrefixCache | None:
    """Keep the bottom `depth` layers' output of every row of `chunks` in a scratch file in `folder`, then
    release those layers. None (nothing changed) when the disk has no room: the caller keeps states in memory.
    """
    rows = sum(len(c) for c in chunks)
    need = sum(states_bytes(model, len(c), c.shape[1]) for c in chunks)
    free = shutil.disk_usage(folder).free
    if need + SPARE_DISK_BYTES > free:
        logger.warning(
            "the frozen bottom's output of %d chunks would take %d MiB of disk in %s, which has %d MiB free: kept in "
            "memory instead, as many as fit",
            rows,
            need >> 20,
            folder,
            free >> 20,
        )
        return None
    logger.info(
        "computing the bottom %d layers' output of %d chunks once, into %d MiB of scratch disk in %s",
        depth,
        rows,
        need >> 20,
        folder,
    )
    cache = PrefixCache(model, depth, store=StateFile(folder))
    try:
        for c in chunks:
            cache.prefill(c)
    except BaseException:
        cache.store.close()
        raise
    freed = model.release_bottom(depth)
    logger.info(
        "kept the bottom %d layers' output of %d chunks on disk (%d MiB) and freed their weights (%d MiB)",
        depth,
        rows,
        cache.store.bytes >> 20,
        freed >> 20,
    )
    return cache
