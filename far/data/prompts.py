"""Prompt-based classification with a causal LM, as in MeZO: a template and one label word per class.

SST-2 becomes `"<sentence> It was"` followed by ` terrible` (label 0) or ` great` (label 1). The
class logits are the LM's logits of the label words at the answer position (the prompt's last
token) only: the base model's hidden state there times the LM-head rows of the label words. The
(B, T, vocab) logits of an ordinary LM forward are never built, which at SmolLM2's 49k vocabulary
would be the largest tensor of a step.
"""

from __future__ import annotations

import csv
import os
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

if TYPE_CHECKING:
    from far.llm.tokenizer import LeanTokenizer


@dataclass(frozen=True)
class PromptTemplate:
    """A prompt with a `{sentence}` slot and one label word per class (label i -> `label_words[i]`).

    Each label word, as it follows the prompt (so usually with its leading space), must be a single
    token of the model's tokenizer.

    Example:
        >>> SST2_TEMPLATE.format("a gorgeous film")
        'a gorgeous film It was'
    """

    template: str
    label_words: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "label_words", tuple(self.label_words))
        if "{sentence}" not in self.template:
            raise ValueError(f"the template needs a '{{sentence}}' slot, got {self.template!r}")
        if len(self.label_words) < 2 or len(set(self.label_words)) != len(self.label_words):
            raise ValueError(f"need at least two distinct label words, got {self.label_words!r}")

    def format(self, sentence: str) -> str:
        return self.template.format(sentence=sentence.strip())


# MeZO's SST-2 template and verbalizer (Malladi et al. 2023, Table 13).
SST2_TEMPLATE = PromptTemplate("{sentence} It was", (" terrible", " great"))


def label_word_ids(tokenizer, template: PromptTemplate) -> Tensor:
    """Token id of each label word: a (n_labels,) LongTensor; each word must be one token of its own."""
    ids = []
    for word in template.label_words:
        tokens = tokenizer(word, add_special_tokens=False)["input_ids"]
        if len(tokens) != 1:
            raise ValueError(
                f"label word {word!r} is {len(tokens)} tokens for this tokenizer; choose words that are one token "
                "each (with the leading space they have after the prompt, e.g. ' great')"
            )
        ids.append(tokens[0])
    if len(set(ids)) != len(ids):
        raise ValueError(f"label words {template.label_words!r} map to the same token ids {ids}")
    return torch.tensor(ids, dtype=torch.long)


def encode_prompts(
    tokenizer, sentences: Sequence[str], labels: Sequence[int], template: PromptTemplate, max_length: int = 256
) -> list[dict[str, object]]:
    """Tokenise each `template.format(sentence)` into `{"input_ids": list[int], "labels": int}`, keeping the *last*
    `max_length` tokens of a longer prompt, so the answer position (the prompt's end) survives truncation."""
    if len(sentences) != len(labels):
        raise ValueError(f"got {len(sentences)} sentences but {len(labels)} labels")
    n_labels = len(template.label_words)
    examples = []
    for sentence, label in zip(sentences, labels, strict=True):
        if not 0 <= int(label) < n_labels:
            raise ValueError(f"label {label!r} is outside [0, {n_labels}) for label words {template.label_words!r}")
        ids = tokenizer(template.format(sentence))["input_ids"][-max_length:]
        examples.append({"input_ids": ids, "labels": int(label)})
    return examples


class PromptCollator:
    """Pads `encode_prompts` examples on the right into `input_ids`, `attention_mask`, `labels`."""

    def __init__(self, pad_token_id: int) -> None:
        if not isinstance(pad_token_id, int):
            raise ValueError(f"pad_token_id must be an int (set tokenizer.pad_token), got {pad_token_id!r}")
        self.pad_token_id = pad_token_id

    def __call__(self, examples: Sequence[dict]) -> dict[str, Tensor]:
        longest = max(len(e["input_ids"]) for e in examples)
        ids = torch.full((len(examples), longest), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(examples), longest), dtype=torch.long)
        for row, example in enumerate(examples):
            n = len(example["input_ids"])
            ids[row, :n] = torch.as_tensor(example["input_ids"], dtype=torch.long)
            mask[row, :n] = 1
        labels = torch.tensor([int(e["labels"]) for e in examples], dtype=torch.long)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def label_logits(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, label_ids: Tensor) -> Tensor:
    """The LM's logits of the label words at each prompt's last token: (B, n_labels).

    Runs the base model (no LM head, no KV cache), takes the hidden state at the last attended
    position of each right-padded row and multiplies it by the label words' LM-head rows only.
    A `far.llm.lean_model.LeanCausalLM` computes the same with its own `label_logits`.
    """
    if callable(getattr(model, "label_logits", None)):  # the lean runtime computes exactly this itself
        return model.label_logits(input_ids, attention_mask, label_ids)
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if head is None or not hasattr(head, "weight"):
        raise ValueError(f"{type(model).__name__} has no LM head (get_output_embeddings()); load a causal LM")
    hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    last = attention_mask.sum(dim=1) - 1  # (B,) answer position of each right-padded row
    answer = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]  # (B, d)
    label_ids = label_ids.to(head.weight.device)
    logits = answer.to(head.weight.dtype) @ head.weight[label_ids].t()  # (B, n_labels)
    if getattr(head, "bias", None) is not None:
        logits = logits + head.bias[label_ids]
    return logits


def prompt_loss_fn(label_ids: Tensor) -> Callable[[nn.Module, dict[str, Tensor]], Tensor]:
    """A `loss_fn(model, batch)` for `far.finetune`: cross-entropy over the label words' logits only (MeZO's)."""

    def loss_fn(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
        logits = label_logits(model, batch["input_ids"], batch["attention_mask"], label_ids)
        return F.cross_entropy(logits.float(), batch["labels"].to(logits.device))

    return loss_fn


@torch.no_grad()
def predict_batches(
    model: nn.Module,
    lengths: Sequence[int],
    batch_of: Callable[[list[int]], dict[str, Tensor]],
    label_ids: Tensor,
    batch_size: int = 32,
) -> Tensor:
    """Predicted label of each of `len(lengths)` examples: (N,) LongTensor, in the order given, in eval mode.
    Batched by `lengths` (less padding); `batch_of(indices)` makes a batch (tokenising only then, if it likes)."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    predictions = torch.empty(len(lengths), dtype=torch.long)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            batch = batch_of(chunk)
            logits = label_logits(model, batch["input_ids"], batch["attention_mask"], label_ids)
            predictions[chunk] = logits.argmax(dim=-1).cpu()
    finally:
        model.train(was_training)
    return predictions


def predict(
    model: nn.Module, examples: Sequence[dict], label_ids: Tensor, pad_token_id: int, batch_size: int = 32
) -> Tensor:
    """Predicted label of each `encode_prompts` example: (N,) LongTensor, in the order given."""
    collate = PromptCollator(pad_token_id)
    lengths = [len(e["input_ids"]) for e in examples]
    return predict_batches(model, lengths, lambda chunk: collate([examples[i] for i in chunk]), label_ids, batch_size)


def accuracy(
    model: nn.Module, examples: Sequence[dict], label_ids: Tensor, pad_token_id: int, batch_size: int = 32
) -> float:
    """Fraction of `examples` whose predicted label word is the right one."""
    if not examples:
        raise ValueError("accuracy needs at least one example")
    predictions = predict(model, examples, label_ids, pad_token_id, batch_size)
    labels = torch.tensor([int(e["labels"]) for e in examples])
    return float((predictions == labels).float().mean())


def sample_k_shot(labels: Iterable[int], k: int, seed: int = 0) -> list[int]:
    """Indices of `k` examples per class, sampled without replacement with `seed` (MeZO's k-shot sets), shuffled
    (classes interleaved) with the same seed; the global RNG is untouched."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int (examples per class, e.g. 16 or 512), got {k!r}")
    by_class: dict[int, list[int]] = {}
    for index, label in enumerate(labels):
        by_class.setdefault(int(label), []).append(index)
    rng = random.Random(seed)
    chosen = []
    for label in sorted(by_class):
        pool = by_class[label]
        if len(pool) < k:
            raise ValueError(f"class {label} has only {len(pool)} examples, fewer than k={k}; use a smaller k")
        chosen.extend(rng.sample(pool, k))
    rng.shuffle(chosen)
    return chosen


def read_labelled_tsv(
    path: str | os.PathLike, text_column: str = "sentence", label_column: str = "label"
) -> tuple[list[str], list[int]]:
    """Sentences and integer labels of a GLUE-style TSV with a header (SST-2's train.tsv, dev.tsv), read without
    `datasets`, which costs a memory-bound process more than the data (docs/design.md, "Resident memory")."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))  # GLUE's files: quoting off
    if rows and (text_column not in rows[0] or label_column not in rows[0]):
        raise ValueError(f"{path} has columns {list(rows[0])}, not {text_column!r} and {label_column!r}")
    return [r[text_column] for r in rows], [int(r[label_column]) for r in rows]


class PromptBatches:
    """Sentences and labels, tokenised only when a batch of them is asked for."""

    def __init__(
        self, tokenizer: LeanTokenizer, template: PromptTemplate, texts: Sequence[str], labels: Sequence[int], n: int
    ):
        self.tokenizer, self.template, self.max_length = tokenizer, template, n
        self.texts, self.labels = list(texts), [int(x) for x in labels]
        self.collate = PromptCollator(tokenizer.pad_token_id)

    def __len__(self) -> int:
        return len(self.texts)

    def batch(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        ids = self.tokenizer.encode_batch([self.template.format(self.texts[i]) for i in indices])
        rows = zip(ids, indices, strict=True)
        examples = [{"input_ids": row[-self.max_length :], "labels": self.labels[i]} for row, i in rows]
        return self.collate(examples)


def predict_labels(model: nn.Module, data: PromptBatches, label_ids: Tensor, chunk: int) -> list[int]:
    """Predicted label of every example, batched by text length in chunks of `chunk` prompts, tokenised per chunk."""
    return predict_batches(model, [len(t) for t in data.texts], data.batch, label_ids, chunk).tolist()
