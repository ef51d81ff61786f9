"""Splitting attention heads: exact outputs and gradients on every architecture that allows it, refusals elsewhere."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import ARCHITECTURES, tiny_batch, tiny_examples, tiny_model
from transformers import Trainer

import far
from far.architectures import BUILTIN_ATTENTION_SPECS
from far.layers import INPUT, OUTPUT, SplitLinear, node_rows

SPLITTABLE = [a for a in ARCHITECTURES if not isinstance(BUILTIN_ATTENTION_SPECS.get(a), str)]
REFUSED = [a for a in ARCHITECTURES if isinstance(BUILTIN_ATTENTION_SPECS.get(a), str)]


def _model(arch):
    """Attention dropout off: a head split reorders heads, so a dropout mask drawn with the same seed
    falls on other heads (the same distribution, other draws); every other dropout lines up."""
    return tiny_model(arch, attention_probs_dropout_prob=0.0, attention_dropout=0.0).train()


def _random_scores(groups, seed):
    generator = torch.Generator().manual_seed(seed)
    return {name: torch.rand(g.n_nodes, generator=generator) for name, g in groups.items()}


def _split_copy(reference, attention_retention=0.5, **fields):
    return far.reconfigure(
        copy.deepcopy(reference),
        0.4,
        scores=_random_scores(far.find_ffns(reference), 3),
        head_scores=_random_scores(far.find_attention(reference), 4),
        attention_retention=attention_retention,
        **fields,
    )


def _backward(model, batch, seed=0):
    torch.manual_seed(seed)  # the same dropout masks in both models
    out = model(**batch)
    out.loss.backward()
    return out.logits.detach()


def _rows_of_heads(heads, width):
    return (heads.unsqueeze(1) * width + torch.arange(width)).reshape(-1)


def test_the_table_names_every_built_in_architecture():
    assert set(BUILTIN_ATTENTION_SPECS) == set(far.BUILTIN_SPECS)
    assert set(REFUSED) == {"gpt2", "mpnet"}


@pytest.mark.parametrize("arch", SPLITTABLE)
@pytest.mark.parametrize("recompute", [False, True])
def test_logits_and_gradients_equal_the_unsplit_models(arch, recompute):
    reference = _model(arch)
    model = _split_copy(reference, recompute_activations=recompute)
    batch = dict(tiny_batch(), labels=torch.tensor([0, 2, 1]))
    torch.testing.assert_close(_backward(model, batch), _backward(reference, batch), atol=1e-6, rtol=1e-6)

    chosen = far.learners(model)
    config = reference.config
    head_dim = config.hidden_size // config.num_attention_heads
    group = config.num_attention_heads // (getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    for block in far.find_attention(reference).values():
        heads = chosen[block.name]
        assert heads.numel() == 1 if group > 1 else heads.numel() == 2  # half of 2 groups, half of 4 heads
        query, key, value = block.inputs
        widths = {query: head_dim * group, key: head_dim, value: head_dim, block.output: head_dim * group}
        for name, width in widths.items():
            role = OUTPUT if name == block.output else INPUT
            split, original = model.get_submodule(name), reference.get_submodule(name)
            rows = _rows_of_heads(heads, width)
            expected = node_rows(original, role, original.weight.grad)[rows]
            torch.testing.assert_close(split.learner_weight.grad, expected, atol=1e-6, rtol=1e-5, msg=name)
            assert split.frozen_weight.grad is None and not split.frozen_weight.requires_grad
            if role == INPUT and original.bias is not None:
                torch.testing.assert_close(split.learner_bias.grad, original.bias.grad[rows], atol=1e-6, rtol=1e-5)
            if role == OUTPUT and original.bias is not None:  # belongs to no head: trained as before
                torch.testing.assert_close(split.bias.grad, original.bias.grad, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("arch", ["bert", "llama"])
def test_frozen_heads_stay_bit_identical_while_learners_train_and_restore_merges(arch):
    reference = _model(arch)
    model = _split_copy(reference)
    frozen_before = {n: m.frozen_weight.clone() for n, m in model.named_modules() if isinstance(m, SplitLinear)}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    batch = dict(tiny_batch(), labels=torch.tensor([0, 2, 1]))
    for _ in range(3):
        _backward(model, batch)
        optimizer.step()
        optimizer.zero_grad()
    for name, before in frozen_before.items():
        assert torch.equal(model.get_submodule(name).frozen_weight, before), name
    chosen = far.learners(model)
    model.eval()
    with torch.no_grad():
        logits = model(**batch).logits
    restored = far.restore(copy.deepcopy(model)).eval()
    assert not any(isinstance(m, SplitLinear) for m in restored.modules())
    with torch.no_grad():
        torch.testing.assert_close(restored(**batch).logits, logits, atol=1e-6, rtol=1e-6)
    # In the merged model, the rows of frozen heads are the pretrained ones, the learners' moved.
    block = next(iter(far.find_attention(reference).values()))
    query = block.inputs[0]
    width = reference.get_submodule(query).weight.shape[0] // block.n_nodes
    learner_rows = _rows_of_heads(chosen[block.name], width)
    frozen_rows = torch.tensor([r for r in range(width * block.n_nodes) if r not in set(learner_rows.tolist())])
    before, after = reference.get_submodule(query).weight, restored.get_submodule(query).weight
    assert torch.equal(after[frozen_rows], before[frozen_rows])
    assert not torch.equal(after[learner_rows], before[learner_rows])


@pytest.mark.parametrize("arch", REFUSED)
def test_architectures_whose_heads_cannot_be_split_are_refused_before_any_change(arch):
    model = tiny_model(arch)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="cannot split the attention heads") as error:
        far.reconfigure(model, 0.4, selection="random", attention_retention=0.5)
    assert "attention_retention" in str(error.value)
    assert not far.is_reconfigured(model) and far.get_config(model) is None
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_an_unknown_architecture_needs_an_attention_spec():
    model = tiny_model("bert")
    model.config.model_type = "my-bert"
    with pytest.raises(ValueError, match="AttentionSpec"):
        far.find_attention(model)
    spec = far.AttentionSpec(
        query="attention.self.query",
        key="attention.self.key",
        value="attention.self.value",
        output="attention.output.dense",
    )
    assert len(far.find_attention(model, spec)) == 2


def test_head_counts_that_do_not_fit_the_shapes_are_refused():
    model = tiny_model("bert")
    model.config.num_attention_heads = 3  # 32 rows are not 3 heads
    with pytest.raises(ValueError, match="do not fit 3 heads"):
        far.find_attention(model)


def test_attention_retention_is_checked_by_the_config():
    with pytest.raises(ValueError, match="attention_retention must be in"):
        far.FARConfig(attention_retention=0.0)
    with pytest.raises(TypeError, match="attention_retention must be a number"):
        far.FARConfig(attention_retention="half")
    assert far.FARConfig().attention_retention is None


def test_head_scores_are_needed_for_a_score_based_selection_and_nothing_changes_without_them():
    model = tiny_model("bert")
    far.Primer(model)  # FFNs only
    with pytest.raises(ValueError, match=r"Primer\(model, heads=True\)"):
        far.reconfigure(model, 0.4, attention_retention=0.5, scores=_random_scores(far.find_ffns(model), 0))
    assert not far.is_reconfigured(model)


def test_the_primer_scores_each_head_by_its_rows_and_columns_and_reconfigure_keeps_the_top_heads():
    model = tiny_model("llama")  # 4 query heads in 2 key/value groups: a node is a group
    primer = far.Primer(model, heads=True)
    block = next(iter(far.find_attention(model).values()))
    query, key, _, output = (model.get_submodule(n) for n in block.projections)
    with torch.no_grad():
        query.weight[16:32] += 0.5  # query heads 2 and 3 = group 1 (head size 8)
        key.weight[0:8] += 0.01  # group 0, a little
        output.weight[:, 0:8] += 0.01
        for ffn in far.find_ffns(model).values():  # priming moves the FFNs too
            model.get_submodule(ffn.output).weight[:, :3] += 0.1
    scores = primer.head_scores()[block.name]
    torch.testing.assert_close(scores, torch.tensor([0.01 * 8 * 32 * 2, 0.5 * 16 * 32]), rtol=1e-4, atol=1e-4)
    far.reconfigure(model, 0.4, attention_retention=0.5, selection="per_layer")
    assert far.learners(model)[block.name].tolist() == [1]
    # Group 1's query heads (rows 16..31) and key/value head 1 (rows 8..15) are the learners.
    assert model.get_submodule(block.inputs[0]).learner_indices().tolist() == list(range(16, 32))
    assert model.get_submodule(block.inputs[1]).learner_indices().tolist() == list(range(8, 16))


def test_random_head_selection_leaves_the_ffn_selection_unchanged():
    reference = tiny_model("bert")
    ffn_only = far.reconfigure(copy.deepcopy(reference), 0.4, selection="random", seed=5)
    with_heads = far.reconfigure(copy.deepcopy(reference), 0.4, selection="random", seed=5, attention_retention=0.5)
    expected = far.learners(ffn_only)
    got = far.learners(with_heads)
    assert all(torch.equal(got[name], idx) for name, idx in expected.items())
    assert set(got) - set(expected) == set(far.find_attention(reference))


def test_mezo_moves_only_learner_heads():
    model = _split_copy(tiny_model("opt"), attention_retention=0.25).eval()
    frozen = {n: m.frozen_weight.clone() for n, m in model.named_modules() if isinstance(m, SplitLinear)}
    learner = {n: m.learner_weight.clone() for n, m in model.named_modules() if isinstance(m, SplitLinear)}
    optimizer = far.MeZO([p for p in model.parameters() if p.requires_grad], lr=1e-2, eps=1e-3)
    batch = dict(tiny_batch(), labels=torch.tensor([0, 2, 1]))
    optimizer.step(lambda: model(**batch).loss)
    for name, before in frozen.items():
        assert torch.equal(model.get_submodule(name).frozen_weight, before)
    assert any(not torch.equal(model.get_submodule(n).learner_weight, w) for n, w in learner.items())


def _trained_with_heads(arch, steps=2):
    model = tiny_model(arch)
    far.reconfigure(model, 0.4, selection="random", seed=3, attention_retention=0.5)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(steps):
        model(**tiny_batch(), labels=torch.tensor([0, 1, 2])).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.eval()


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("arch", ["bert", "opt", "llama"])
def test_learners_file_and_checkpoint_round_trip_with_split_heads(arch, tmp_path):
    model = _trained_with_heads(arch)
    with torch.no_grad():
        expected = model(**tiny_batch()).logits
    path = far.save_learners(model, tmp_path / "learners.safetensors")
    base = tiny_model(arch)
    far.load_learners(base, path)
    assert far.get_config(base) == far.get_config(model)
    assert {k: v.tolist() for k, v in far.learners(base).items()} == {
        k: v.tolist() for k, v in far.learners(model).items()
    }
    with torch.no_grad():
        assert torch.equal(base(**tiny_batch()).logits, expected)

    far.save_pretrained(model, tmp_path / "ckpt")
    loaded = far.from_pretrained(tmp_path / "ckpt")
    assert far.get_config(loaded).attention_retention == 0.5
    assert _state(loaded).keys() == _state(model).keys()
    assert all(torch.equal(a, b) for a, b in zip(_state(loaded).values(), _state(model).values(), strict=True))


def test_a_learners_file_with_heads_is_refused_by_another_base_before_any_change(tmp_path):
    path = far.save_learners(_trained_with_heads("bert"), tmp_path / "learners.safetensors")
    other = tiny_model("bert", seed=1)
    before = _state(other)
    with pytest.raises(ValueError, match="different base model"):
        far.load_learners(other, path)
    assert not far.is_reconfigured(other)
    assert all(torch.equal(before[k], v) for k, v in other.state_dict().items())


@pytest.mark.parametrize("optimizer", ["adamw", "mezo"])
def test_finetune_primes_heads_and_resumes_exactly(tmp_path, optimizer):
    options = dict(optimizer=optimizer, lr=1e-2, priming=2, max_steps=6, batch_size=4)
    options["config"] = far.FARConfig(0.4, attention_retention=0.5)

    def run(**kwargs):
        model = tiny_model("bert")
        far.finetune(model, tiny_examples(20), progress=False, **options, **kwargs)
        return model

    whole = run(output_dir=tmp_path / "a", checkpoint_every=3, keep_checkpoints=None)
    assert far.get_config(whole).attention_retention == 0.5
    blocks = far.find_attention(whole)
    assert set(blocks) <= set(far.learners(whole)) and all(far.learners(whole)[b].numel() == 2 for b in blocks)
    resumed = run(output_dir=tmp_path / "b", checkpoint_every=3, resume_from=tmp_path / "a" / "checkpoints" / "step-3")
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.allclose(a.float(), b.float(), rtol=0, atol=1e-6), name


def test_attention_retention_without_far_is_refused():
    with pytest.raises(ValueError, match="give a retention"), pytest.warns(DeprecationWarning, match="config="):
        far.finetune(tiny_model("bert"), tiny_examples(20), retention=None, attention_retention=0.5, progress=False)
    with pytest.raises(ValueError, match="cannot split the attention heads"):
        config = far.FARConfig(0.4, attention_retention=0.5)
        far.finetune(tiny_model("gpt2"), tiny_examples(20), config, max_steps=10, batch_size=4, progress=False)


@pytest.mark.slow
def test_the_trainer_callback_splits_heads_after_priming_and_resumes(tmp_path):
    from test_trainer_callback import arguments

    run_dir = tmp_path / "run"
    args = arguments(run_dir, save_strategy="steps", save_steps=4)
    whole = tiny_model("bert")
    callback = far.FARCallback(retention=0.5, priming=2, attention_retention=0.5)
    Trainer(model=whole, args=args, train_dataset=tiny_examples(), callbacks=[callback]).train()
    assert far.get_config(whole).attention_retention == 0.5
    assert set(far.find_attention(whole)) <= set(far.learners(whole))

    model = tiny_model("bert")
    callback = far.FARCallback(retention=0.5, priming=2, attention_retention=0.5)
    trainer = Trainer(model=model, args=args, train_dataset=tiny_examples(), callbacks=[callback])
    callback.restore_layout(model, run_dir / "checkpoint-4")
    trainer.train(resume_from_checkpoint=str(run_dir / "checkpoint-4"))
    for (name, a), b in zip(whole.state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.allclose(a.float(), b.float(), rtol=0, atol=1e-6), name
