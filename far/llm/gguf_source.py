"""Which GGUF file a lean model was read from: what a learners file's base fingerprint is checked against.

A learners file fits only the exact file its base weights came from, named by its sha256 (about 0.1 s
per 100 MB), computed once per model on first need. The file's identity on disk (inode, size, times)
is kept from when the model was read, so a file rewritten since is noticed.

    >>> model.source.sha256()        # the GGUF file's, computed once
    '5b8b0...'
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from far.storage.atomic import file_sha256


def file_identity(path: Path) -> tuple[int, ...]:
    """What changes whenever a file's bytes do: any write moves its ctime, a new file is a new inode."""
    st = path.stat()
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


@dataclass
class GGUFSource:
    """The GGUF file a model was read from, as it was then.

    Attributes:
        path: The file.
        identity: `file_identity(path)` when the model was read.
    """

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
        """The file's sha256 (hex), hashed on the first call.

        Raises:
            ValueError: the file was changed or removed since the model was read from it.
        """
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
