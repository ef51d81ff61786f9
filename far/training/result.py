"""`FinetuneResult`: what a `far.finetune` run reports at its end."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from far.storage.atomic import atomic_file


@dataclass(frozen=True)
class FinetuneResult:
    """Final metrics, time and memory of one `far.finetune` run.

    Times are wall-clock seconds, summed over the runs of a resumed training. `priming_seconds`
    includes the surgery; `training_seconds` is the steps after it; neither includes evaluation
    (`eval_seconds`) or checkpoint writing (only in `total_seconds`).

    Attributes:
        metrics: The last evaluation's metrics (empty without an `eval_fn`).
        steps: Optimizer steps of the run, priming included.
        priming_steps: Of those, the priming steps (0 without priming).
        priming_seconds / training_seconds / eval_seconds / total_seconds: See above.
        peak_rss_bytes: Peak resident memory of the process (its whole life, not only this call).
        trainable_parameters / total_parameters: After surgery; tied weights count once.
        log_path: The JSON-lines log, or None without an `output_dir`.
        final_loss: The loss of the last step.
        checkpoint: The last checkpoint written, or None.
        frozen_cache_bytes: Memory the kept states of the frozen bottom took at the end (`cache_frozen`; else 0).
        memory_plan: With a memory budget, the plan the run trained by (`far.training.budget.MemoryPlan`'s
            fields: micro-batches, the levers turned on, the estimate); else None.
        priming_layer_change: Each layer's share of the change priming measured in the FFNs (its nodes' mean
            score over the layers' sum), bottom layer first: what `freeze_layers="auto"` reads. None without
            priming, or for a model whose layers cannot be told apart.
        learner_shares: `{group name: learners / nodes}` of every group the surgery split (FFNs, and attention
            blocks where split): the retention each got, which `retention="auto"` chooses per group. None
            without surgery.
        precision: The precision the steps computed in and why (`far.training.precision.Precision`'s fields:
            name, requested, reason).
    """

    metrics: dict[str, float]
    steps: int
    priming_steps: int
    priming_seconds: float
    training_seconds: float
    eval_seconds: float
    total_seconds: float
    peak_rss_bytes: int
    trainable_parameters: int
    total_parameters: int
    log_path: str | None = None
    final_loss: float | None = None
    checkpoint: str | None = None
    frozen_cache_bytes: int = 0
    priming_layer_change: list[float] | None = None
    memory_plan: dict | None = None
    learner_shares: dict[str, float] | None = None
    precision: dict | None = None
    history: list[dict] = field(default_factory=list, repr=False)  # every eval: {"step": s, **metrics}

    def to_dict(self) -> dict:
        return asdict(self)

    def write(self, path: Path) -> None:
        """Write the result as JSON to `path` (a run's result.json), whole or not at all."""
        with atomic_file(path) as tmp:
            tmp.write_text(json.dumps(self.to_dict(), indent=1))
