"""Loading a model by name with the head a task needs: transformers' classes, far's lean BERT, or a lean GGUF LM.

>>> model, tokenizer = load_model_and_tokenizer("minilm", "classification", num_labels=2)
>>> lm, tokenizer = load_causal_lm("smollm2-135m")
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

import far
from far import encoder as lean_encoder
from far.encoder.tasks import task_overrides
from far.llm.gguf_file import load_lean_model
from far.llm.lean_model import LeanCausalLM
from far.llm.lean_saving import load_trained
from far.llm.tokenizer import LeanTokenizer, load_gguf_tokenizer
from far.methods.lora import adapter_base_model, is_adapter_folder, load_lora_adapter
from far.models.aliases import DEFAULT_MODEL, RUNTIMES, FindSpec, find_gguf, resolve_model

logger = logging.getLogger(__name__)

if TYPE_CHECKING:  # transformers is imported where a model is loaded: a GGUF alias's lean run never needs it
    import transformers

# task kind -> (head, Auto class name, name of transformers' table of the model types that have that head)
_HEADS = {
    "classification": ("sequence-classification", "AutoModelForSequenceClassification", "SEQUENCE_CLASSIFICATION"),
    "regression": ("sequence-classification", "AutoModelForSequenceClassification", "SEQUENCE_CLASSIFICATION"),
    "question-answering": ("question-answering", "AutoModelForQuestionAnswering", "QUESTION_ANSWERING"),
}


def load_model_and_tokenizer(
    name_or_path: str = DEFAULT_MODEL,
    task_kind: str = "classification",
    num_labels: int = 2,
    *,
    label_names: Sequence[str] | None = None,
    finetuning_task: str | None = None,
    seed: int = 0,
    runtime: str = "transformers",
    head_replaced: bool = False,
) -> tuple[torch.nn.Module, transformers.PreTrainedTokenizerBase]:
    """A fp32 model with a fresh task head, and its tokenizer (given a pad token if it has none).

    Args:
        name_or_path: an alias (see `MODEL_ALIASES`), a Hugging Face model folder, or a hub name.
        task_kind: "classification", "regression" (one output) or "question-answering".
        num_labels: classes for "classification".
        label_names: class names, stored as the config's id2label.
        finetuning_task: recorded in the config (so `far eval` knows the task of a saved model).
        seed: seeds the new head's initialisation (a forked RNG: the global one is left alone).
        runtime: "transformers", or "lean" for far's own BERT (`far.encoder`; BERT folders only).
        head_replaced: the caller replaces the fresh head at once (a learners file's), so transformers'
            report that it was newly initialised is not logged.

    Raises:
        ValueError: unknown task kind, a model that cannot be found, or one with no head for the task.
    """
    overrides = task_overrides(task_kind, num_labels, label_names)  # checks task_kind
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    try:
        path = resolve_model(name_or_path)
    except ModuleNotFoundError as e:
        raise ValueError(str(e)) from None
    if runtime == "lean":
        tokenizer = _padding_tokenizer(path, name_or_path)
        model = lean_encoder.from_pretrained(
            path,
            task_kind,
            num_labels,
            label_names=label_names,
            finetuning_task=finetuning_task,
            seed=seed,
            pad_token_id=tokenizer.pad_token_id,
        )
        return model, tokenizer
    import transformers
    from transformers.models.auto import modeling_auto

    head, class_name, table = _HEADS[task_kind]
    auto_class = getattr(transformers, class_name)
    supported = getattr(modeling_auto, f"MODEL_FOR_{table}_MAPPING_NAMES")
    try:
        config = transformers.AutoConfig.from_pretrained(path, **overrides)
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
    tokenizer = _padding_tokenizer(path, name_or_path)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # the new head's weights, reproducibly, without touching the caller's RNG
        # A checkpoint with another task's head (say 2 classes, now 1 output) gets a fresh head.
        with _load_report_silenced():
            model, loading = auto_class.from_pretrained(
                path, config=config, dtype=torch.float32, ignore_mismatched_sizes=True, output_loading_info=True
            )
    _report_loading(model, loading, name_or_path, head if not head_replaced else None, seed)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def _report_loading(model, loading: dict, name: str | os.PathLike, head: str | None, seed: int) -> None:
    """Transformers' load report in far's words: the new head in a line (when `head` names it), and as a warning
    only what a user should look at, weights of the body that the checkpoint lacked. Weights it holds and the model
    does not use are left unsaid: another task's head, a pooler that question answering has no use for."""
    body = model.base_model_prefix + "."
    fresh = sorted(key for key in loading["missing_keys"] if not key.startswith(body))
    fresh += sorted(key for key, *_ in loading["mismatched_keys"])
    if head is not None and fresh:
        logger.info("a new %s head (%s), initialised with seed %d, trains with the run", head, ", ".join(fresh), seed)
    missing = sorted(key for key in loading["missing_keys"] if key.startswith(body))
    if missing:
        logger.warning(
            "model %s: its checkpoint lacks %d of the model's own weights (%s), initialised at random: check that "
            "it is the model you meant",
            name,
            len(missing),
            ", ".join(missing[:5]) + (", ..." if len(missing) > 5 else ""),
        )


@contextlib.contextmanager
def _load_report_silenced() -> Iterator[None]:
    """Transformers' warnings and progress bar held back while a model loads: its load report (the head's weights
    newly initialised) among them, which `_report_loading` says in far's words. Through its verbosity: its own
    loggers' levels steer what it checks."""
    from transformers.utils import logging as hf_logging

    verbosity, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # a bar for a few hundred milliseconds of reading weights
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()


def _padding_tokenizer(path: str | os.PathLike, name: str | os.PathLike) -> transformers.PreTrainedTokenizerBase:
    """The model's tokenizer, given a pad token (its end-of-sequence token) if it has none."""
    tokenizer = _load_tokenizer(path, name)
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                f"the tokenizer of {name!r} has neither a pad nor an end-of-sequence token to pad batches with"
            )
        tokenizer.pad_token = tokenizer.eos_token  # decoder-only models: pad with EOS, masked out anyway
    return tokenizer


def lean_runtime_fits(name_or_path: str | os.PathLike) -> bool:
    """Whether `far.encoder` can run this model: a local BERT folder (or alias) with one model.safetensors.

    Reads config.json only; a hub name not yet downloaded is False (transformers fetches it).
    """
    try:
        folder = Path(resolve_model(name_or_path, isolate=True))
    except (ModuleNotFoundError, ValueError, FileNotFoundError):
        return False
    config, weights = folder / "config.json", folder / "model.safetensors"
    if not (config.is_file() and weights.is_file()):
        return False
    try:
        return json.loads(config.read_text()).get("model_type") == "bert"
    except (OSError, ValueError):
        return False


def _load_tokenizer(path: str | os.PathLike, name: str | os.PathLike) -> transformers.PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"could not load a tokenizer for model {str(name)!r}: {e}") from None


def load_trained_model(folder: str | os.PathLike) -> tuple[torch.nn.Module, transformers.PreTrainedTokenizerBase]:
    """A model that a training run saved (plain or FAR, `far.from_pretrained`), and the tokenizer beside it.

    A LoRA adapter folder (a `--method lora` run's adapter/) is loaded onto its base model (the alias
    or folder the run trained from) and merged.

    Raises:
        ValueError: `folder` is not a model folder, or holds no tokenizer.
    """
    folder = Path(folder)
    if is_adapter_folder(folder):
        base = resolve_model(adapter_base_model(folder))
        return load_lora_adapter(folder, base), _load_tokenizer(folder, folder)
    if not folder.is_dir() or not (folder / "config.json").is_file():
        raise ValueError(
            f"checkpoint {folder} is not a model folder (no config.json there); pass the model "
            "folder a training run saved, e.g. runs/cola-minilm-far/model"
        )
    tokenizer = _load_tokenizer(folder, folder)
    return far.from_pretrained(folder), tokenizer


def check_max_length(model: torch.nn.Module, max_length: int) -> None:
    """Raise ValueError if `max_length` tokens do not fit the model's position embeddings."""
    positions = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)
    if max_length < 1:
        raise ValueError(f"max_length must be positive, got {max_length}")
    if positions is not None and max_length > positions:
        raise ValueError(
            f"max_length {max_length} exceeds the model's {positions} positions; use --max-length {positions} or less"
        )


def load_causal_lm(
    name_or_path: str | os.PathLike,
    *,
    dtype: torch.dtype = torch.float32,
    cache_dir: str | os.PathLike | None = None,
    find_spec: FindSpec = importlib.util.find_spec,
    isolate: bool = True,
    **kwargs,
) -> tuple[torch.nn.Module, transformers.PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer, in eval mode.

    Args:
        name_or_path: A model alias (`"smollm2-135m"`), a `.gguf` file, an HF folder or hub name.
        dtype: Weight dtype; float32 by default, since MeZO's updates (lr ~1e-6) vanish in bf16.
        cache_dir / find_spec / isolate: As for `resolve_model`.
        **kwargs: Passed on to `AutoModelForCausalLM.from_pretrained`.

    Returns:
        `(model, tokenizer)`; the tokenizer pads on the right and has a pad token (the EOS token
        when the model defines none).

    Example:
        >>> model, tokenizer = load_causal_lm("smollm2-135m")
        >>> model.config.model_type
        'llama'
    """
    source = resolve_model(name_or_path, cache_dir=cache_dir, find_spec=find_spec, isolate=isolate)
    from transformers import AutoModelForCausalLM

    tokenizer = _padding_tokenizer(source, name_or_path)
    tokenizer.padding_side = "right"  # the answer position is found from the attention mask
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs).eval()
    return model, tokenizer


def load_lean_lm(
    name: str, dtype: torch.dtype = torch.bfloat16, trained: str | Path | None = None
) -> tuple[LeanCausalLM, LeanTokenizer]:
    """A GGUF causal LM on the lean runtime and its tokenizer, by alias (`smollm2-135m`, `gemma3-270m`) or path.

    Args:
        trained: A fine-tune of this model (`trained.safetensors` of a `far glue` run) to apply.

    Example:
        >>> model, tokenizer = load_lean_lm("smollm2-135m", trained="runs/sst2-smollm2-135m-far/trained.safetensors")
        >>> label_ids = far.data.prompts.label_word_ids(tokenizer, far.data.prompts.SST2_TEMPLATE)
        >>> model.label_logits(input_ids, attention_mask, label_ids)   # (B, 2)
    """
    path = Path(name) if str(name).endswith(".gguf") else find_gguf(name)
    model = load_lean_model(path, dtype)
    if trained is not None:
        load_trained(model, trained, base=path)
    return model, load_gguf_tokenizer(path)
