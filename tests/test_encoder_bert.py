"""The lean encoder runtime (far.encoder): parity with transformers' BERT, folders both ways, FAR on it."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertModel,
    RobertaConfig,
)

import far
from far.encoder import LeanBertForQuestionAnswering, LeanBertForSequenceClassification, from_pretrained
from far.encoder import save_pretrained as lean_save_pretrained
from far.layers import SplitLinear

VOCAB = 100
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=VOCAB)
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
CLOSE = dict(rtol=1e-5, atol=1e-6)


def bert_config(**overrides) -> BertConfig:
    return BertConfig(**{**SIZES, "max_position_embeddings": 16, **overrides})


LEAN_CLASSES = {
    BertForSequenceClassification: LeanBertForSequenceClassification,
    BertForQuestionAnswering: LeanBertForQuestionAnswering,
}


def hf_and_lean(hf_class: type = BertForSequenceClassification, seed: int = 0, **overrides):
    """A transformers model with every tensor drawn from a seeded generator (LayerNorms away from 1 and 0
    too), and the lean model of the same config (a copy: a loss may set problem_type) and state dict."""
    config = bert_config(**overrides)
    hf = hf_class(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.2 + name.endswith("LayerNorm.weight"))
    lean = LEAN_CLASSES[hf_class](copy.deepcopy(config))
    lean.load_state_dict(hf.state_dict(), strict=True)
    return hf, lean.eval()


def padded_batch(seed: int = 1) -> dict[str, torch.Tensor]:
    """Three rows padded on the right, two segments each (token_type_ids)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (3, 9), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    ids[mask == 0] = 0
    token_types = (torch.arange(9) >= 4).long().expand(3, 9) * mask
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": token_types}


@pytest.mark.parametrize("hidden_act", ["gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu"])
def test_classification_logits_equal_transformers(hidden_act):
    hf, lean = hf_and_lean(num_labels=3, hidden_act=hidden_act)
    batch = padded_batch()
    with torch.no_grad():
        torch.testing.assert_close(lean(**batch).logits, hf(**batch).logits, **CLOSE)
    assert [n for n, _ in lean.named_parameters()] == [n for n, _ in hf.named_parameters()]


def test_question_answering_logits_and_loss_equal_transformers():
    hf, lean = hf_and_lean(BertForQuestionAnswering)
    batch = padded_batch()
    # The last row's positions lie past the sequence: clamped to T and ignored, as transformers does.
    positions = {"start_positions": torch.tensor([1, 2, 20]), "end_positions": torch.tensor([3, 5, 20])}
    with torch.no_grad():
        want, got = hf(**batch, **positions), lean(**batch, **positions)
    torch.testing.assert_close(got.start_logits, want.start_logits, **CLOSE)
    torch.testing.assert_close(got.end_logits, want.end_logits, **CLOSE)
    torch.testing.assert_close(got.loss, want.loss, **CLOSE)
    assert lean(**batch).loss is None


@pytest.mark.parametrize(
    "num_labels, problem_type, labels",
    [
        (1, "regression", torch.tensor([0.5, -1.0, 2.0])),
        (1, None, torch.tensor([0.5, -1.0, 2.0])),  # inferred: regression
        (3, "single_label_classification", torch.tensor([0, 2, 1])),
        (3, None, torch.tensor([0, 2, 1])),  # inferred from integer labels
        (3, None, torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])),  # inferred: multi-label
    ],
)
def test_losses_equal_transformers(num_labels, problem_type, labels):
    hf, lean = hf_and_lean(num_labels=num_labels, problem_type=problem_type)
    batch = padded_batch()
    with torch.no_grad():
        want, got = hf(**batch, labels=labels), lean(**batch, labels=labels)
    torch.testing.assert_close(got.loss, want.loss, **CLOSE)
    assert lean.config.problem_type == hf.config.problem_type  # inferred the same way, and recorded
    # far's loop reads the loss either way
    assert got["loss"] is got.loss and got.get("loss") is got.loss and getattr(got, "loss", None) is got.loss


def test_train_mode_without_dropout_gives_the_transformers_loss_and_gradients():
    hf, lean = hf_and_lean(num_labels=3, **NO_DROPOUT)
    hf.train()
    lean.train()
    batch, labels = padded_batch(), torch.tensor([0, 2, 1])
    want, got = hf(**batch, labels=labels).loss, lean(**batch, labels=labels).loss
    want.backward()
    got.backward()
    torch.testing.assert_close(got, want, **CLOSE)
    grads = dict(hf.named_parameters())
    for name, p in lean.named_parameters():
        torch.testing.assert_close(p.grad, grads[name].grad, rtol=1e-4, atol=1e-6, msg=name)


def _grads_with_dropout(model: torch.nn.Module, recompute: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    if recompute:
        model.gradient_checkpointing_enable()
    else:
        model.gradient_checkpointing_disable()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # the same dropout masks in both runs, in a forked RNG
        loss = model(**padded_batch(), labels=torch.tensor([0, 2, 1])).loss
        loss.backward()
        after = torch.get_rng_state()
    return after, {n: p.grad.clone() for n, p in model.named_parameters()}


def test_recompute_gives_the_same_gradients_with_dropout():
    _, lean = hf_and_lean(num_labels=3, hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.2)
    lean.train()
    rng_plain, plain = _grads_with_dropout(lean, recompute=False)
    rng_recomputed, recomputed = _grads_with_dropout(lean, recompute=True)
    assert lean.is_gradient_checkpointing
    assert torch.equal(rng_plain, rng_recomputed)  # backward's second pass left the caller's RNG alone
    for name, grad in plain.items():
        torch.testing.assert_close(recomputed[name], grad, rtol=1e-6, atol=1e-7, msg=name)


def test_recompute_reaches_layers_above_frozen_embeddings():
    _, lean = hf_and_lean(num_labels=3)
    lean.train().gradient_checkpointing_enable()
    lean.bert.embeddings.requires_grad_(False)
    lean(**padded_batch(), labels=torch.tensor([0, 2, 1])).loss.backward()
    assert lean.bert.encoder.layer[0].intermediate.dense.weight.grad.abs().sum() > 0


def test_from_pretrained_reads_bare_and_prefixed_checkpoints(tmp_path):
    config = bert_config()
    bare = BertModel(config)
    bare.save_pretrained(tmp_path / "bare")
    hf = BertForSequenceClassification(bert_config(num_labels=3))
    hf.bert.load_state_dict(bare.state_dict())
    hf.save_pretrained(tmp_path / "prefixed")
    assert not any(k.startswith("bert.") for k in load_file(tmp_path / "bare" / "model.safetensors"))

    from_bare = from_pretrained(tmp_path / "bare", "classification", num_labels=3, seed=1)
    from_prefixed = from_pretrained(tmp_path / "prefixed", "classification", num_labels=3, seed=1)
    for name, tensor in bare.state_dict().items():
        assert torch.equal(from_bare.bert.state_dict()[name], tensor), name
        assert torch.equal(from_prefixed.bert.state_dict()[name], tensor), name
    assert torch.equal(from_prefixed.classifier.weight, hf.classifier.weight)  # a head of the right shape loads
    assert all(p.dtype == torch.float32 and not p.is_meta for p in from_bare.parameters())
    assert not from_bare.training and from_bare.config.id2label == {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}


def test_fresh_heads_are_reproducible_per_seed(tmp_path):
    BertModel(bert_config()).save_pretrained(tmp_path)
    a, b = (from_pretrained(tmp_path, "regression", seed=7) for _ in range(2))
    c = from_pretrained(tmp_path, "regression", seed=8)
    assert torch.equal(a.classifier.weight, b.classifier.weight) and not torch.equal(
        a.classifier.weight, c.classifier.weight
    )
    assert torch.count_nonzero(a.classifier.bias) == 0 and 0.01 < a.classifier.weight.std() < 0.04
    assert a.config.num_labels == 1 and a.config.problem_type == "regression"
    # a 3-class head in the file does not fit a 2-class task: drawn fresh, as transformers does
    BertForSequenceClassification(bert_config(num_labels=3)).save_pretrained(tmp_path / "three")
    two = from_pretrained(tmp_path / "three", "classification", label_names=["no", "yes"], finetuning_task="rte")
    assert two.classifier.weight.shape == (2, 32) and two.config.label2id == {"no": 0, "yes": 1}
    assert two.config.finetuning_task == "rte"


@pytest.mark.parametrize("task_kind", ["classification", "question-answering"])
def test_saved_folder_loads_in_transformers_with_the_same_outputs(tmp_path, task_kind):
    hf_class = BertForSequenceClassification if task_kind == "classification" else BertForQuestionAnswering
    _, lean = hf_and_lean(hf_class)
    lean_save_pretrained(lean, tmp_path / "model")
    auto = AutoModelForSequenceClassification if task_kind == "classification" else AutoModelForQuestionAnswering
    hf, info = auto.from_pretrained(tmp_path / "model", output_loading_info=True)
    assert type(hf) is hf_class
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    batch = padded_batch()
    with torch.no_grad():
        want, got = hf.eval()(**batch), lean(**batch)
    for key in ("logits",) if task_kind == "classification" else ("start_logits", "end_logits"):
        torch.testing.assert_close(got[key], want[key], **CLOSE)
    again = from_pretrained(tmp_path / "model", task_kind)  # and back into the lean runtime
    assert all(torch.equal(again.state_dict()[k], v) for k, v in lean.state_dict().items())


@pytest.mark.parametrize("attention_retention", [None, 0.5])
def test_far_reconfigure_and_restore_work_on_the_lean_model(tmp_path, attention_retention):
    _, lean = hf_and_lean(num_labels=3)
    assert list(far.find_ffns(lean)) == [f"bert.encoder.layer.{i}.output.dense" for i in range(2)]
    batch = padded_batch()
    before = {k: v.clone() for k, v in lean.state_dict().items()}
    with torch.no_grad():
        logits = lean(**batch).logits
    far.reconfigure(lean, far.FARConfig(0.5, selection="random", attention_retention=attention_retention))
    assert any(isinstance(m, SplitLinear) for m in lean.modules())
    with torch.no_grad():
        torch.testing.assert_close(lean(**batch).logits, logits, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="far.restore"):
        lean_save_pretrained(lean, tmp_path / "model")
    far.restore(lean)
    assert not any(isinstance(m, SplitLinear) for m in lean.modules())
    assert all(torch.equal(before[k], v) for k, v in lean.state_dict().items())


def test_a_learners_file_of_the_lean_model_applies_to_its_base(tmp_path):
    _, lean = hf_and_lean(num_labels=3)
    base = copy.deepcopy(lean)
    far.reconfigure(lean, far.FARConfig(0.5, selection="random")).train()
    optimizer = torch.optim.SGD([p for p in lean.parameters() if p.requires_grad], lr=0.1)
    lean(**padded_batch(), labels=torch.tensor([0, 2, 1])).loss.backward()
    optimizer.step()
    far.save_learners(lean.eval(), tmp_path / "learners.safetensors")
    far.load_learners(base, tmp_path / "learners.safetensors")
    with torch.no_grad():
        torch.testing.assert_close(base(**padded_batch()).logits, lean(**padded_batch()).logits, rtol=0, atol=1e-6)


def test_a_far_checkpoint_of_the_lean_model_loads_as_a_transformers_model(tmp_path):
    _, lean = hf_and_lean(num_labels=3)
    far.reconfigure(lean, far.FARConfig(0.5, selection="random"))
    far.save_pretrained(lean, tmp_path / "ckpt")  # the FAR layout kept, as for a transformers model
    loaded = far.from_pretrained(tmp_path / "ckpt")
    assert isinstance(loaded, BertForSequenceClassification) and far.is_reconfigured(loaded)
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(**padded_batch()).logits, lean(**padded_batch()).logits, **CLOSE)


def test_a_model_that_is_not_bert_is_refused_with_what_to_do(tmp_path):
    RobertaConfig(**SIZES).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"supports BERT only .*'roberta'.*--runtime transformers.*BERT model"):
        from_pretrained(tmp_path)


def test_a_missing_encoder_weight_is_named(tmp_path):
    BertModel(bert_config()).save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["encoder.layer.1.intermediate.dense.weight"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"encoder\.layer\.1\.intermediate\.dense\.weight .*missing.*config\.json"):
        from_pretrained(tmp_path)


def test_a_folder_without_safetensors_is_refused_with_what_to_do(tmp_path):
    bert_config().save_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors.*not pytorch_model\.bin.*save_pretrained"):
        from_pretrained(tmp_path)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"hidden_act": "quick_gelu"}, r"hidden_act='quick_gelu'; supported: gelu, gelu_new.*--runtime transformers"),
        ({"position_embedding_type": "relative_key"}, r"absolute position embeddings only.*--runtime transformers"),
    ],
)
def test_configs_the_lean_runtime_cannot_run_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        LeanBertForSequenceClassification(bert_config(**overrides))


@pytest.mark.slow
def test_loading_training_and_saving_leave_transformers_model_code_out(tmp_path):
    BertModel(bert_config()).save_pretrained(tmp_path / "base")  # here, so that the child need not
    code = f"""
import sys, torch
import far.encoder
model = far.encoder.from_pretrained({str(tmp_path / "base")!r}, "regression").train()
model.gradient_checkpointing_enable()
ids = torch.randint(1, {VOCAB}, (2, 5))
model(ids, torch.ones_like(ids), labels=torch.tensor([0.5, 1.0])).loss.backward()
far.encoder.save_pretrained(model, {str(tmp_path / "saved")!r})
heavy = ("transformers.modeling_utils", "torch._dynamo", "sympy", "scipy", "datasets", "evaluate")
print(sorted(m for m in heavy if m in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
    assert (tmp_path / "saved" / "model.safetensors").is_file()


@pytest.mark.slow
def test_real_minilm_logits_equal_transformers(minilm_path):
    lean = from_pretrained(minilm_path, "regression", seed=0)
    hf = AutoModelForSequenceClassification.from_pretrained(minilm_path, num_labels=1).eval()
    hf.classifier.load_state_dict(lean.classifier.state_dict())  # the fresh heads differ; the encoder must not
    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    batch = tokenizer(
        ["FAR freezes most FFN nodes.", "The rest keep learning, fast.", "A pair of", "sentences here."],
        ["", "with a second segment", "words", ""],
        padding=True,
        return_tensors="pt",
    )
    with torch.no_grad():
        torch.testing.assert_close(lean(**batch).logits, hf(**batch).logits, rtol=1e-4, atol=1e-5)
