"""What the surgery is given, checked before anything changes: the model, priming scores, learner indices.

Every check here raises with what to do instead, so that `far.reconfigure` and its siblings can
validate all of their input first and leave the model exactly as it was when a call fails.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from far.architectures import FFN
from far.config import FARConfig
from far.freezing import few_names
from far.priming import Primer, primer_of


def check_scores(scores: object, ffns: Mapping[str, FFN], argument: str = "scores") -> dict[str, Tensor]:
    unit = "attention block" if argument == "head_scores" else "FFN"
    if not isinstance(scores, Mapping):
        raise TypeError(
            f"{argument} must be a dict of {unit} name -> 1-D tensor (as Primer.{argument}() returns), "
            f"got {type(scores).__name__}"
        )
    missing, extra = sorted(set(ffns) - set(scores)), sorted(set(scores) - set(ffns))
    if missing or extra:
        raise ValueError(
            f"{argument} must have one entry per {unit}, keyed by the output projection's name; missing "
            f"{few_names(missing)}, unexpected {few_names(extra)}. Use the scores of a Primer created on this "
            "same model"
        )
    checked = {}
    for name, ffn in ffns.items():
        s = scores[name]
        if not isinstance(s, Tensor) or s.shape != (ffn.n_nodes,) or not s.is_floating_point():
            shape = tuple(s.shape) if isinstance(s, Tensor) else type(s).__name__
            raise ValueError(
                f"{argument}[{name!r}] must be a 1-D float tensor of {ffn.n_nodes} node scores, got {shape}"
            )
        if not torch.isfinite(s).all():
            raise ValueError(
                f"{argument}[{name!r}] has NaN or infinite values; priming diverged, lower the learning rate"
            )
        checked[name] = s.detach().cpu()
    return checked


def check_learners(learners: object, ffns: Mapping[str, FFN], empty_ok: bool = False) -> dict[str, Tensor]:
    if not isinstance(learners, Mapping) or set(learners) != set(ffns):
        raise ValueError(
            "learners must map every FFN name (see far.find_ffns), and every attention block's when the config "
            "splits attention (see far.find_attention), to its learner node indices"
        )
    checked = {}
    for name, ffn in ffns.items():
        idx = torch.as_tensor(learners[name])
        if idx.dtype not in (torch.int64, torch.int32) or idx.dim() != 1 or (idx.numel() == 0 and not empty_ok):
            raise ValueError(f"learners[{name!r}] must be a non-empty 1-D integer tensor")
        idx = idx.long().cpu().sort().values
        if idx.numel() and (idx[0] < 0 or idx[-1] >= ffn.n_nodes or (idx[1:] == idx[:-1]).any()):
            raise ValueError(f"learners[{name!r}] must hold distinct node indices in [0, {ffn.n_nodes})")
        checked[name] = idx
    return checked


def watching_primer(model: nn.Module, scores: Primer | Mapping[str, Tensor] | None) -> Primer | None:
    """The Primer `reconfigure` reads: the one passed as `scores`, else the one attached to `model`."""
    if isinstance(scores, Primer):
        if not scores.watches(model):
            raise ValueError(
                "scores=primer: this Primer was created on another model; pass the Primer (or the scores) of "
                "the model being reconfigured"
            )
        return scores
    return primer_of(model) if scores is None else None


def primer_head_scores(model: nn.Module, scores: object, head_scores: object) -> object:
    """The head scores `reconfigure` selects from: given, or those of the Primer that watched `model`."""
    if head_scores is not None:
        return head_scores
    primer = watching_primer(model, scores)
    if primer is None or not primer.watches_heads:
        raise ValueError(
            "attention_retention with a score-based selection needs head priming scores: create "
            "far.Primer(model, heads=True) before the priming steps (far.finetune does when attention_retention "
            "is set), pass head_scores=..., or use selection='random'"
        )
    return primer.head_scores()


def primer_scores(model: nn.Module, scores: Primer | Mapping[str, Tensor] | None, config: FARConfig) -> object:
    """The scores `reconfigure` selects from: given, or those of the Primer that watched `model`."""
    if scores is not None and not isinstance(scores, Primer):
        return scores
    primer = watching_primer(model, scores)
    if primer is None:
        needs, instead = (
            ("freeze_layers='auto'", "or give freeze_layers an int")
            if config.selection == "random"
            else (f"selection={config.selection!r}", "or use selection='random'")
        )
        raise ValueError(
            f"{needs} needs priming scores, and this model was never primed. Create "
            "far.Primer(model) and run a few training steps first (or use far.finetune), pass "
            f"scores=..., {instead}"
        )
    result = primer.scores()
    if all(bool((s == 0).all()) for s in result.values()):
        raise ValueError(
            "every priming score is zero: no FFN weight changed since far.Primer(model) was created. "
            "Run the priming training steps (optimizer.step()) before reconfiguring"
        )
    return result
