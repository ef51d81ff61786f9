"""A shared layout's file, read without the model (`far.saving.shared_layout` gives the format), verified
against its digest: the command paths that never load transformers read it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

from far.config import FARConfig
from far.saving.safetensors_file import CONTENT_KEY, read_verified

LAYOUT_FORMAT, LAYOUT_FORMAT_VERSION = "far.layout", "1"  # far_layout.safetensors, beside a model or shared
SUFFIX = ".learner_indices"
WRITER = "far prime (far.training.prime_layout)"
_REQUIRED = ("far_config", "model_type", "nodes", "frozen_layers", "base_fingerprint", "record")


class LayoutFileError(ValueError):
    """A shared layout that cannot be used: unreadable, corrupted, not written by `far prime`, or for another base."""


@dataclass(frozen=True)
class SharedLayout:
    """A shared layout as read from its file (`read_shared_layout`): the learners, the config and the metadata."""

    path: str
    learners: Mapping[str, Tensor]
    config: FARConfig
    metadata: Mapping[str, str]

    @property
    def digest(self) -> str:
        """The file's content sha256: what a run trained with it records."""
        return self.metadata[CONTENT_KEY]

    @property
    def base_fingerprint(self) -> str:
        return self.metadata["base_fingerprint"]

    @property
    def frozen_layers(self) -> int:
        return int(self.metadata["frozen_layers"])

    @property
    def nodes(self) -> dict[str, int]:
        return json.loads(self.metadata["nodes"])

    @property
    def record(self) -> dict:
        return json.loads(self.metadata["record"])

    def describe(self) -> dict:
        """{path, digest}: what metrics.json and a learners file say of the layout a run trained with."""
        return {"path": self.path, "digest": self.digest}


def check_layout_output(path: str | os.PathLike, overwrite: bool) -> Path:
    """Refuse, writing nothing, a path where a layout cannot go: an existing file without `overwrite`, a folder."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(
            f"{str(path)!r} is a folder; give the layout a file name, e.g. {str(path / 'l.safetensors')!r}"
        )
    if path.exists() and not overwrite:
        raise ValueError(
            f"{str(path)!r} exists; nothing was changed. Add --overwrite to replace it, or another --output"
        )
    return path


def _check_format(path: Path, metadata: Mapping[str, str]) -> None:
    if metadata.get("format") != LAYOUT_FORMAT or metadata.get("format_version") != LAYOUT_FORMAT_VERSION:
        raise LayoutFileError(
            f"{str(path)!r} is not a FAR layout (format={metadata.get('format')!r}, version "
            f"{metadata.get('format_version')!r}); write one with {WRITER}"
        )
    missing = [key for key in (*_REQUIRED, CONTENT_KEY) if key not in metadata]
    if missing:
        raise LayoutFileError(
            f"{str(path)!r} is a layout saved beside a model's weights, without {', '.join(missing)}: it cannot be "
            f"checked against a base. Write a layout to share with {WRITER}"
        )


def read_shared_layout(path: str | os.PathLike) -> SharedLayout:
    """The layout in `path`, verified against its sha256 (`LayoutFileError` otherwise)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no layout file at {str(path)!r}; write one with {WRITER}")
    metadata, tensors = read_verified(path, _check_format, LayoutFileError, writer=WRITER)
    try:
        config = FARConfig(**json.loads(metadata["far_config"]))
        json.loads(metadata["nodes"])
        int(metadata["frozen_layers"])
    except (TypeError, ValueError) as error:
        raise LayoutFileError(f"{str(path)!r}: its recorded configuration is invalid: {error}") from error
    chosen = {key.removesuffix(SUFFIX): idx for key, idx in tensors.items() if key.endswith(SUFFIX)}
    return SharedLayout(str(path), chosen, config, metadata)


def layout_metadata(layout: SharedLayout | None) -> dict[str, str]:
    """What a learners file of a run trained with `layout` records of it (nothing without one)."""
    return {} if layout is None else {"layout_sha256": layout.digest}
