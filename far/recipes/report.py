"""The one train-and-report path: fine-tune a task's model, evaluate it, write what the run did.

Every encoder training command (GLUE, SQuAD, the user's files) builds a `TrainingRun`
and hands it to `train_and_report`, which writes into the run's output folder:

    metrics.json      the metric, method, retention, seconds per phase, peak RSS, parameters, files
    predictions.*     the evaluator's last predictions (`Evaluator.write_predictions`)
    train.log         every `far.*` log record of the run
    log.jsonl         far.finetune's per-step log
    model/            the fine-tuned model and its tokenizer (`far.save_pretrained`), unless not saved
    ...               what the method saves (`far.methods.Method.save`): learners.safetensors for
                      FAR's surgery (what training changed, `far.save_learners`), adapter/ for LoRA
                      (its model/ is then the adapters merged into the base, a plain model)

Nothing here prints; the caller shows the returned record as it likes.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

import far
from far.models import resolve_model
from far.recipes.configuration import configuration_record
from far.recipes.settings import RECORDED_OPTIONS, RunSettings
from far.saving.layout_file import layout_metadata
from far.saving.stock import stock_reader
from far.storage.atomic import write_json
from far.training.distributed import Parallel
from far.training.plan import plan_training

if TYPE_CHECKING:  # a type only: the evaluators module imports datasets
    from far.evaluation.evaluators import Evaluator

logger = logging.getLogger("far.recipes")

LOG_FILE = "train.log"
METRICS_FILE = "metrics.json"


@dataclass(kw_only=True)
class TrainingRun:
    """One fine-tuning run of a task, ready to go.

    Args:
        task: The task's name, e.g. "cola", "squad".
        settings: What the run was asked for.
        model / tokenizer: The model to train (in place), and the tokenizer saved beside it (None:
            the model is not saved).
        train_data / collate_fn / loss_fn: As `far.finetune` takes them (loss_fn None: the model's own).
        evaluator: Scores the model and writes its predictions.
        hyperparameters: The resolved hyper-parameters (`RunSettings.hyperparameters`).
        extra: More fields for the record (example counts, the data split, ...).
    """

    task: str
    settings: RunSettings
    model: nn.Module
    tokenizer: Any = None
    train_data: Any
    collate_fn: Callable
    loss_fn: Callable | None = None
    evaluator: Evaluator
    hyperparameters: dict
    extra: dict = field(default_factory=dict)

    @property
    def title(self) -> str:
        """e.g. "cola (far)"."""
        return f"{self.task} ({self.settings.method})"

    @property
    def output_dir(self) -> Path:
        return self.settings.output_path(self.task)


class _RunLogHandler(logging.FileHandler):
    """train.log's handler: a record its disk refuses ends the file, without logging's printed traceback (the
    run's next write raises `DiskFull`, which names the disk)."""

    full = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.full:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if not (isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)):
            super().handleError(record)
            return
        self.full = True
        stream, self.stream = self.stream, None
        with contextlib.suppress(OSError):  # its buffer holds what the disk refused: a flush would raise again
            stream.close()


@contextmanager
def run_log(directory: Path) -> Iterator[Path]:
    """Copy every `far.*` log record into `<directory>/train.log` while the block runs."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOG_FILE
    handler = _RunLogHandler(path, mode="w", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO)
    root = logging.getLogger("far")
    previous_level = root.level
    root.addHandler(handler)
    if root.getEffectiveLevel() > logging.INFO:
        root.setLevel(logging.INFO)
    try:
        yield path
    finally:
        root.removeHandler(handler)
        root.setLevel(previous_level)
        handler.close()


def frozen_layers(model: nn.Module) -> int | None:
    """Bottom layers that ended frozen whole, or None where far cannot find the layers (a PEFT wrapper, ...)."""
    try:
        return far.summary(model, verbose=False).frozen_layers[0]
    except (ValueError, TypeError):
        return None


def train_and_report(run: TrainingRun) -> dict | None:
    """Train with `far.finetune`, evaluate, then write predictions, the model and metrics.json.

    Under torchrun (WORLD_SIZE > 1) every process trains on its share of each batch (DDP,
    `far.training.distributed`) and the first one writes the run's files.

    Returns:
        The record that metrics.json holds: the task, method, `far.FinetuneResult`'s fields, the
        metrics, the hyper-parameters, `run.extra`, the files and their sizes. None in a process of a
        distributed run other than the first.
    """
    settings, model = run.settings, run.model
    options = settings.train_options(run.hyperparameters)
    plan_training(len(run.train_data), options)  # steps that cannot hold the priming are refused before the folder
    # Under torchrun: every process trains, the first one writes the run's files (far.training.distributed).
    parallel = Parallel.from_environment(cuda=next(model.parameters()).is_cuda, shard=settings.shards)
    main = parallel.is_main
    out = parallel.on_main(settings.claim_output, run.task)
    with run_log(out) if main else contextlib.nullcontext():
        logger.info(
            "far %s: model %s, optimizer %s, %d training examples; hyper-parameters %s",
            run.title,
            settings.model,
            settings.optimizer,
            len(run.train_data),
            run.hyperparameters,
        )
        # FAR's priming reads the stock FFNs back from the model's file instead of keeping a copy of them.
        base_weights = stock_reader(resolve_model(settings.model), model) if settings.far is not None else None
        result = far.finetune(
            model,
            run.train_data,
            base_weights=base_weights,
            options=options,
            collate_fn=run.collate_fn,
            loss_fn=run.loss_fn,
            eval_fn=run.evaluator,
            output_dir=out,
            # A killed run goes on from its newest intact checkpoint, to the same end as an uninterrupted one.
            resume_from=out if settings.resume else None,
            parallel=parallel,
        )
        if not main:  # the first process evaluates, writes and reports
            parallel.close()
            return None
        metrics = dict(result.metrics or {})
        if not metrics or run.evaluator.predictions is None:
            # No evaluation ran in this process (none was asked for, or a finished run was resumed): run it here,
            # so that the predictions written beside the metrics are this model's.
            metrics = run.evaluator(model)
        logger.info("%s: %s", run.title, metrics)
    files = {"log": LOG_FILE, **run.evaluator.write_predictions(out)}
    if result.log_path:
        files["step_log"] = Path(result.log_path).name
    model_dir = settings.model_path(out)
    saved = None
    if model_dir and run.tokenizer:  # a learners file records the layout it was trained with
        extra = layout_metadata(settings.shared_layout)
        saved = settings.method_spec.save(model, run.tokenizer, out, model_dir, learners_metadata=extra)
    files.update(saved.files if saved else {})
    far_config = settings.far
    record = {
        "task": run.task,
        "method": settings.method,
        "retention": None if far_config is None else far_config.retention,
        "selection": None if far_config is None else far_config.selection,
        "optimizer": settings.optimizer,
        "model": settings.model,
        "runtime": settings.encoder_runtime,
        **result.to_dict(),
        "metrics": metrics,
        "hyperparameters": {
            **run.hyperparameters,
            **{k: getattr(options, k) for k in RECORDED_OPTIONS},
            "attention_retention": None if far_config is None else far_config.attention_retention,
            "freeze_embeddings": settings.freeze_embeddings,
            "freeze_layers": settings.freeze_layers,
        },
        # Bottom layers frozen whole as trained ("auto" resolved): backward stopped above them.
        "frozen_layers": frozen_layers(model),
        "configuration": configuration_record(settings, frozen_layers(model)),
        **run.extra,
        **(saved.sizes if saved else {}),
        "files": files,
        "far_version": far.__version__,
    }
    write_json(out / METRICS_FILE, record)
    parallel.close()
    return record
