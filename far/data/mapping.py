"""`Dataset.map` for tokenising: no hash of the function where no cache will be written.

`datasets` names each map's result by a fingerprint hashed from the function, closure and all: a
tokenising closure pickles the whole tokenizer (its vocabulary), 0.1-0.2 CPU s every call. The
fingerprint only names cache files, which a dataset held in memory (read from local files by far's
readers) never writes; there it is drawn at random, as `datasets` itself does for a function it
cannot hash. A dataset with cache files (the hub's) keeps the hashed fingerprint, so that its cache
is reused only for the same function. Importing this module does not import `datasets`.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import datasets


def map_batches(dataset: datasets.Dataset, function: Callable[..., dict], **kwargs: Any) -> datasets.Dataset:
    """`dataset.map(function, batched=True, **kwargs)`, fingerprinted without hashing `function` when in memory."""
    if not dataset.cache_files:
        kwargs.setdefault("new_fingerprint", secrets.token_hex(16))
    return dataset.map(function, batched=True, **kwargs)
