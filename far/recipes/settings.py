"""What a training run of a task is asked to do: the method, the optimizer, hyper-parameters, outputs.

`RunSettings` is what the `far` command's flags fill in (and what a script or notebook may build
itself); the method comes from the one table `far.methods.METHODS`. Its `FARConfig` is built once,
when the settings are (`RunSettings.far`). Hyper-parameters left None take the task's defaults for
the optimizer (`GLUE_DEFAULTS`, ...), resolved by `RunSettings.hyperparameters`; with them the
settings give `far.finetune` one checked `TrainOptions` (`RunSettings.train_options`), which the
command line's memory plan reads too.

    >>> settings = RunSettings(method="far", retention=0.4, max_steps=100)
    >>> settings.train_options(settings.hyperparameters(GLUE_DEFAULTS)).config is settings.far
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import torch

from far.config import FARConfig
from far.llm.lean_far import Layout, lean_layout
from far.methods import METHODS, LoraSettings, Method
from far.models import DEFAULT_MODEL, RUNTIMES, is_causal_lm, lean_runtime_fits
from far.recipes.configuration import Configuration
from far.recipes.outputs import check_output_dir, claim_output_dir
from far.saving.layout_file import SharedLayout, read_shared_layout
from far.saving.safetensors_file import DTYPES
from far.training.budget import ENCODERS_ONLY
from far.training.distributed import check_shardable, writes_outputs
from far.training.options import LEARNING_RATES, TrainOptions, check_int

# "zo-batched" (the batched one-sided zeroth-order estimator, far.llm.zo_batched) trains causal LMs on texts only.
OPTIMIZERS = ("adamw", "mezo", "zo-batched")
# Under torchrun: a replica (DDP) or a share (FSDP2) of the model in each process (far.training.distributed).
DISTRIBUTED = ("ddp", "fsdp")
DEFAULT_RETENTION = 0.4  # the paper's; a causal LM's lean run has its own default (`far.llm.lean_far.lean_layout`)
# Storage of what MeZO trains in a GGUF causal LM's lean runtime (far.llm.compact); compute is fp32 either way.
TRAINABLE_DTYPES = tuple(DTYPES)
HYPERPARAMETERS = ("lr", "epochs", "max_steps", "batch_size", "max_length", "warmup")
# What sets a run's length: given on the command line, none of them comes from the defaults (a default's
# `step_budget` caps the default length only).
LENGTH_KEYS = ("epochs", "max_steps", "step_budget")
# far.finetune options recorded in metrics.json beside the resolved hyper-parameters.
RECORDED_OPTIONS = (
    "priming",
    "priming_scores",
    "weight_decay",
    "grad_accum",
    "bf16",
    "precision",
    "reset_frozen",
    "prime_frozen",
    "cache_frozen",
    "group_by_length",
    "seed",
    "mezo_eps",
    "mezo_directions",
)

# Per optimizer. The learning rates come from the one table, far.training.options.LEARNING_RATES, which says why.
_LR = LEARNING_RATES
GLUE_DEFAULTS = {
    "adamw": dict(lr=_LR["encoder"]["adamw"], epochs=3.0, max_steps=None, batch_size=32, max_length=128, warmup=0.06),
    "mezo": dict(lr=_LR["encoder"]["mezo"], epochs=None, max_steps=5000, batch_size=16, max_length=128, warmup=0.0),
}
# The user's own files (`far train`): GLUE's defaults, for sentences and pairs of GLUE's lengths.
FILE_DEFAULTS = GLUE_DEFAULTS
SQUAD_DEFAULTS = {
    "adamw": dict(lr=_LR["encoder QA"]["adamw"], epochs=2.0, max_steps=None, batch_size=16, max_length=384, warmup=0.1),
    "mezo": dict(lr=_LR["encoder QA"]["mezo"], epochs=None, max_steps=5000, batch_size=16, max_length=384, warmup=0.0),
}
# SmolLM2-135M on SST-2 prompts (experiments/llm_sst2.py).
PROMPT_DEFAULTS = {
    "adamw": dict(
        lr=_LR["causal LM prompts"]["adamw"], epochs=1.0, max_steps=None, batch_size=16, max_length=128, warmup=0.0
    ),
    "mezo": dict(
        lr=_LR["causal LM prompts"]["mezo"], epochs=None, max_steps=1000, batch_size=16, max_length=128, warmup=0.0
    ),
}


@dataclass(frozen=True)
class RunSettings:
    """Everything a training run of a task is asked for; checked when built, before anything loads.

    Hyper-parameters (`HYPERPARAMETERS`) left None take the task's defaults. Paths: `output_dir`
    (default `runs/<task>-<model>-<method>`) gets metrics.json, predictions and logs; the model is saved
    to `model_dir` (default `<output_dir>/model`) unless `save_model` is False.
    """

    model: str = DEFAULT_MODEL
    method: str = "far"
    retention: float | str | None = None  # None: DEFAULT_RETENTION (a causal LM: `lean_layout`)
    attention_retention: float | None = None
    optimizer: str = "adamw"
    lr: float | None = None
    epochs: float | None = None
    max_steps: int | None = None
    batch_size: int | None = None
    max_length: int | None = None
    warmup: float | int | None = None
    priming: float | int = 0.1
    priming_scores: str = "change"  # or "gradient" (far.finetune's priming_scores)
    weight_decay: float = 0.0
    grad_accum: int = 1
    mezo_eps: float = 1e-3
    mezo_directions: int = 1
    lora_r: int = 8
    lora_alpha: int = 8
    lora_dropout: float = 0.0
    lora_target_modules: tuple[str, ...] | None = None
    freeze_embeddings: bool = False
    freeze_layers: int | str | None = None
    reset_frozen: bool = True
    prime_frozen: bool | None = None  # None: not when reset_frozen (far.finetune)
    cache_frozen: bool = False  # keep the frozen bottom's output per example (far.training.frozen_bottom)
    group_by_length: bool = False  # batches of similar lengths (far.training.batches)
    bf16: bool = False
    precision: str = "fp32"  # of the training steps; "auto": bf16 where native (far.training.precision)
    trainable_dtype: str = "bfloat16"
    eval_every: int | None = None
    seed: int = 0
    max_train_samples: int | None = None
    validation_from_train: float | None = None
    max_eval_samples: int | None = None
    eval_batch_size: int = 64
    data_dir: str | None = None
    output_dir: str | None = None
    model_dir: str | None = None
    save_model: bool = True
    progress: bool = True
    checkpoint_every: int | None = None
    resume: bool = False
    overwrite: bool = False  # replace the run that output_dir holds (far.recipes.outputs)
    distributed: str = "ddp"  # under torchrun, one of DISTRIBUTED
    memory_budget: float | None = None  # MiB of whole-process peak RSS (far.training.budget)
    runtime: str = "auto"  # the encoder's code: "transformers", "lean" (far.encoder), or "auto" (encoder_runtime)
    # A layout file that `far prime` wrote: the run splits the model with its learners at step 0, no priming.
    layout: str | None = None
    # Which configuration the fields above make and why, as the command line chose it (far.recipes.configuration);
    # None: as the fields say. metrics.json records it.
    configuration: Configuration | None = field(default=None, compare=False)
    # Derived, built once from the fields above: the run's surgery (None: the method makes none), and what the run
    # asks of far.finetune, all but the task's hyper-parameters (`train_options` adds them).
    far: FARConfig | None = field(init=False, repr=False, compare=False)
    options: TrainOptions = field(init=False, repr=False, compare=False)
    shared_layout: SharedLayout | None = field(init=False, repr=False, compare=False)  # `layout`, read and verified

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.trainable_dtype not in TRAINABLE_DTYPES:
            raise ValueError(
                f"trainable_dtype must be one of {', '.join(TRAINABLE_DTYPES)}, got {self.trainable_dtype!r}"
            )
        far_config = METHODS[self.method].far_config(
            DEFAULT_RETENTION if self.retention is None else self.retention,
            seed=self.seed,
            freeze_embeddings=self.freeze_embeddings,
            attention_retention=self.attention_retention,
            freeze_layers=self.freeze_layers,
        )  # FARConfig checks retention
        shared = None if self.layout is None else self._shared_layout()
        object.__setattr__(self, "shared_layout", shared)
        object.__setattr__(self, "far", far_config if shared is None else shared.config)
        self.lora_settings()  # LoraSettings checks rank, alpha, dropout
        if self.validation_from_train is not None and not 0.0 < self.validation_from_train < 1.0:
            raise ValueError(
                f"validation_from_train is the fraction of the training data held out, in (0, 1); "
                f"got {self.validation_from_train}"
            )
        if self.runtime not in ("auto", *RUNTIMES):
            raise ValueError(f"runtime must be one of auto, {', '.join(RUNTIMES)}, got {self.runtime!r}")
        if self.runtime == "lean" and self.method_spec.wraps_model:
            runnable = ", ".join(name for name, method in METHODS.items() if not method.wraps_model)
            raise ValueError(
                f"--method {self.method} wraps a transformers model (PEFT); the lean runtime runs {runnable}: use "
                "--runtime transformers (or auto) with it"
            )
        if self.memory_budget is not None and is_causal_lm(self.model):
            raise ValueError(ENCODERS_ONLY)
        if self.distributed not in DISTRIBUTED:
            raise ValueError(f"distributed must be one of {', '.join(DISTRIBUTED)}, got {self.distributed!r}")
        if self.shards:
            check_shardable({self.optimizer}, micro_batches=self.memory_budget is not None)
        counts = ("grad_accum", "eval_batch_size", "eval_every", "max_train_samples", "max_eval_samples")
        for name in (*counts, "checkpoint_every"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), 1)
        # The options check the rest (priming, the frozen-bottom cache, ...); the task's hyper-parameters are theirs.
        object.__setattr__(self, "options", self._options())

    def _shared_layout(self) -> SharedLayout:
        """The layout file, read and verified; the run's surgery is then the layout's."""
        if self.method != "far" or is_causal_lm(self.model):
            raise ValueError(
                "--layout trains an encoder with FAR's surgery as far prime chose it: use it with --method far and an "
                "encoder model"
            )
        if self.attention_retention is not None:
            raise ValueError("--layout sets the surgery, attention included: drop --attention-retention")
        return read_shared_layout(self.layout)

    def _options(self) -> TrainOptions:
        as_asked = {name: getattr(self, name) for name in _AS_ASKED}
        return TrainOptions(
            config=self.far,
            # The batched estimator is a zeroth-order optimizer of the text runs: MeZO's ranges hold for it.
            optimizer="mezo" if self.optimizer == "zo-batched" else self.optimizer,
            # With a FARConfig the surgery freezes them (the config says so); else plain freezing.
            freeze_embeddings=self.freeze_embeddings and self.far is None,
            freeze_layers=self.freeze_layers if self.far is None else None,
            freeze_ffn=self.method_spec.freezes_ffn,
            precision=None if self.bf16 else self.precision,  # --bf16 asks for bf16, whatever --precision says
            layout=self.shared_layout,
            **as_asked,
        )

    @property
    def shards(self) -> bool:
        """Whether the processes of a torchrun run shard the model (FSDP2) rather than replicate it (DDP)."""
        return self.distributed == "fsdp"

    @property
    def method_spec(self) -> Method:
        return METHODS[self.method]

    @property
    def encoder_runtime(self) -> str:
        """The code that runs the encoder: `runtime` as given, or with "auto" the lean runtime (`far.encoder`)
        under a memory budget where it runs the model (a local BERT folder; not LoRA), else transformers."""
        if self.runtime != "auto":
            return self.runtime
        lean = self.memory_budget is not None and not self.method_spec.wraps_model and lean_runtime_fits(self.model)
        return "lean" if lean else "transformers"

    def lora_settings(self) -> LoraSettings:
        """LoRA's options (used by `--method lora` only)."""
        targets = tuple(self.lora_target_modules) if self.lora_target_modules else None
        return LoraSettings(self.lora_r, self.lora_alpha, self.lora_dropout, targets)

    def hyperparameters(self, defaults: Mapping[str, Mapping]) -> dict:
        """Every hyper-parameter, the ones left None filled from `defaults[optimizer]`, checked.

        The run's length comes whole from the settings (epochs and/or max_steps) or whole from the defaults.
        """
        if self.optimizer not in defaults:
            raise ValueError(f"--optimizer {self.optimizer} is not available for this run; use {' or '.join(defaults)}")
        chosen = {k: getattr(self, k) for k in HYPERPARAMETERS}
        user_length = self.epochs is not None or self.max_steps is not None
        for key, value in defaults[self.optimizer].items():
            if chosen.get(key) is None and not (user_length and key in LENGTH_KEYS):
                chosen[key] = value
        if chosen["epochs"] is None and chosen["max_steps"] is None:
            raise ValueError("give epochs or max_steps")
        if chosen["max_length"] is None or chosen["max_length"] < 8:
            raise ValueError(f"max_length {chosen['max_length']} is out of range: give at least 8 tokens")
        self.train_options(chosen)  # the options check their own ranges (lr, batch size, length, warmup)
        return chosen

    def train_options(self, hyperparameters: Mapping) -> TrainOptions:
        """What `far.finetune` is asked to do: the settings' `options` with the task's `hyperparameters` (checked)."""
        chosen = {name: hyperparameters[name] for name in HYPERPARAMETERS}
        if chosen["epochs"] is None:  # the run's length is max_steps
            chosen["epochs"] = 1.0
        return replace(self.options, **chosen)

    def lean_layout(self, n_layers: int, dtype: torch.dtype) -> Layout:
        """What a causal LM's lean run over `n_layers` layers trains, its trainable weights stored in `dtype`.

        The default (MeZO + FAR's depth and retention) is decided in `far.llm.lean_far.lean_layout` alone.
        """
        given = self.retention is not None
        ffn, frozen = self.method_spec.lean_ffn, self.freeze_layers
        return lean_layout(self.far, n_layers, dtype, ffn=ffn, frozen_layers=frozen, retention_given=given)

    def output_path(self, task: str) -> Path:
        """Where the run of `task` writes its outputs: `output_dir`, or `runs/<task>-<model>-<method>`."""
        if self.output_dir:
            return Path(self.output_dir)
        model = Path(self.model.rstrip("/\\")).name.removesuffix(".gguf") or "model"
        return Path("runs") / f"{task}-{model}-{self.method}"

    def run_identity(self, task: str) -> dict:
        """What the run of `task` is, as its output folder records it (`far.recipes.outputs`)."""
        return {"task": task, "model": self.model, "method": self.method, "optimizer": self.optimizer}

    def check_output(self, task: str) -> None:
        """Refuse, before anything loads or changes, an output folder that holds another run (`far.recipes.outputs`);
        under torchrun, the first process does (it writes the run's files, `train_and_report`)."""
        if not writes_outputs():
            return
        check_output_dir(self.output_path(task), self.run_identity(task), resume=self.resume, overwrite=self.overwrite)

    def claim_output(self, task: str) -> Path:
        """The run's output folder, made its own just before training (its old run removed with `overwrite`)."""
        return claim_output_dir(
            self.output_path(task), self.run_identity(task), resume=self.resume, overwrite=self.overwrite
        )

    def model_path(self, output: Path) -> Path | None:
        """Where the fine-tuned model goes; None when it is not saved."""
        if not self.save_model:
            return None
        return Path(self.model_dir) if self.model_dir else output / "model"


# The options' fields that the settings hold under the same name and pass on as they are (the rest are built in
# `RunSettings._options`, or are the task's hyper-parameters).
_AS_ASKED = tuple(
    f.name
    for f in fields(TrainOptions)
    if f.name in {g.name for g in fields(RunSettings)}
    and f.name not in {*HYPERPARAMETERS, "optimizer", "freeze_embeddings", "freeze_layers", "precision", "layout"}
)


def first(dataset, n: int | None):
    """The first `n` rows of a `datasets.Dataset` or a `far.data.table.Table` (all when n is None or larger)."""
    return dataset if n is None or n >= len(dataset) else dataset.select(range(n))


def train_and_eval_splits(settings: RunSettings, train, validation):
    """The run's (training, evaluation) rows: the given splits, or a seeded part of `train` held out.

    With `validation_from_train` set, that fraction of the training rows (shuffled with the run's
    seed) is evaluated on and the rest trained on, and `validation` is not used: hyper-parameters are
    then chosen without looking at the dev set. `max_train_samples` / `max_eval_samples` apply after.
    """
    if settings.validation_from_train is not None:
        split = train.train_test_split(test_size=settings.validation_from_train, seed=settings.seed)
        train, validation = split["train"], split["test"]
    return first(train, settings.max_train_samples), first(validation, settings.max_eval_samples)
