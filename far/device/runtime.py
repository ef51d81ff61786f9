"""An export folder's programs loaded through ExecuTorch's Python bindings, one training step at a time.

The training program's `forward` returns the user outputs (loss, logits), the gradients, then the
trainable tensors. Those last outputs are the program's own weights, not copies (they are read
with `clone_outputs=False`): writing into them updates what the next call computes with, which is
how an optimizer steps. They can be read only after a first call.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

from far.device.lowering import INSTALL_HINT, quietly
from far.device.manifest import BOTTOM, TRAIN, DeviceFileError


def _bindings():
    try:
        with quietly(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "experimental API" notes on every import
            from executorch.extension.pybindings import portable_lib
            from executorch.extension.training import TrainingModule
    except ImportError as error:
        raise ImportError(f"training through ExecuTorch needs executorch: {INSTALL_HINT}") from error
    return portable_lib, TrainingModule


class DevicePrograms:
    """The training program (and the bottom program, if any) of an export folder, ready to step.

    Example:
        >>> programs = DevicePrograms("OUT", read_manifest("OUT"))
        >>> loss, logits = programs.forward_backward(batch)
        >>> programs.parameters()["classifier.weight"]  # the program's own tensor: write to train it
    """

    def __init__(self, out_dir: str | Path, manifest: Mapping) -> None:
        portable_lib, training_module = _bindings()
        out_dir = Path(out_dir)
        self.names = [spec["name"] for spec in manifest["trainable"]]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._train = training_module(portable_lib._load_for_executorch(str(out_dir / TRAIN)))
        self._bottom = portable_lib._load_for_executorch(str(out_dir / BOTTOM)) if manifest["bottom"] else None
        self._checked = False

    def inputs(self, batch: Mapping[str, Tensor]) -> list[Tensor]:
        """The training program's inputs for a batch of examples (the bottom program run first, if any)."""
        ids, mask, types = (batch[k].contiguous() for k in ("input_ids", "attention_mask", "token_type_ids"))
        labels = batch["labels"].contiguous()
        if self._bottom is None:
            return [ids, mask, types, labels]
        hidden = self._bottom.run_method("forward", [ids, mask, types])[0]  # (B, T, hidden)
        return [hidden, mask, labels]

    def forward_backward(self, batch: Mapping[str, Tensor]) -> tuple[float, Tensor]:
        """Run forward and backward on a batch: (loss, logits), the gradients kept for `gradients()`."""
        loss, logits = self._train.forward_backward("forward", self.inputs(batch))[:2]
        if not self._checked:
            found = list(self._train.named_parameters())
            if found != self.names:
                raise DeviceFileError(
                    f"the training program's trainable tensors {found[:2]}... are not the manifest's {self.names[:2]}"
                    "...; export the folder again"
                )
            self._checked = True
        return float(loss), logits

    def parameters(self) -> dict[str, Tensor]:
        """`{name: the program's own trainable tensor}` (write into them to change the weights)."""
        return self._train.named_parameters()

    def gradients(self) -> dict[str, Tensor]:
        """`{name: gradient}` of the last `forward_backward`."""
        return self._train.named_gradients()

    @torch.no_grad()
    def load(self, tensors: Mapping[str, Tensor]) -> None:
        """Copy `tensors` into the program's trainable tensors (after a first `forward_backward`)."""
        params = self.parameters()
        for name in self.names:
            params[name].copy_(tensors[name])


def set_threads(n: int) -> None:
    """Size ExecuTorch's process-wide thread pool (its kernels' and XNNPACK's threads)."""
    portable_lib, _ = _bindings()
    portable_lib._unsafe_reset_threadpool(int(n))
