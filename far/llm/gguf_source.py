"""Which GGUF file a lean model was read from: what a learners file's base fingerprint is checked against.

The sha256 (about 0.1 s per 100 MB) is computed once per model on first need; the file's identity on
disk is kept from when the model was read, so a file rewritten since is noticed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from far.storage.atomic import file_identity, file_sha256


@dataclass
class GGUFSource:
    """The GGUF file a model was read from, and its `file_identity` then."""

    path: Path
    identity: tuple[int, ...]
    _sha256: str | None = field(default=None, repr=False)

    @classmethod
    def of(cls, path: str | os.PathLike) -> GGUFSource:
        path = Path(path)
        return cls(path, file_identity(path))

    @property
    def size(self) -> int:
        return self.identity[2]

    def sha256(self) -> str:
        """The file's sha256 (hex), hashed on the first call; ValueError if the file changed since."""
        try:
            unchanged = file_identity(self.path) == self.identity
        except OSError:
            unchanged = False
        if not unchanged:
            raise ValueError(
                f"{self.path} changed (or is gone) since this model was read from it, so nothing can tell which "
                "weights the model holds; load the model from the GGUF file again"
            )
        if self._sha256 is None:
            self._sha256 = file_sha256(self.path)
        return self._sha256
