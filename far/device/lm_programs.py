"""A causal LM export's programs through ExecuTorch's Python bindings: the bottom, then a training step on chunks.

>>> manifest = read_manifest("OUT", objective=NEXT_TOKEN)
>>> programs = LMPrograms("OUT", manifest)
>>> loss, hits = programs.forward_backward({"input_ids": chunks})   # (micro_batch_size, max_length)
>>> programs.gradients()["norm.weight.stored"]
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from torch import Tensor

from far.device.manifest import NEXT_TOKEN, DeviceFileError
from far.device.runtime import DevicePrograms


class LMPrograms(DevicePrograms):
    """The training and bottom programs of a next-token export (`far.device.lm_export`), ready to step."""

    def __init__(self, out_dir: str | Path, manifest: Mapping) -> None:
        if manifest.get("objective") != NEXT_TOKEN:
            raise DeviceFileError(f"{str(out_dir)!r} is not a causal LM's export; read it with read_manifest first")
        super().__init__(out_dir, manifest)

    def bottom(self, input_ids: Tensor) -> Tensor:
        """The frozen bottom's output for packed chunks (B, T): (B, T, hidden), the trained layers' input."""
        return self._bottom.run_method("forward", [input_ids.contiguous()])[0]

    def inputs(self, batch: Mapping[str, Tensor]) -> list[Tensor]:
        """The training program's inputs for chunks `batch["input_ids"]` (B, T): the bottom's output and the ids."""
        ids = batch["input_ids"].contiguous()
        return [self.bottom(ids), ids]
