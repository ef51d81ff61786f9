"""Users swapped in place: one base, many learners files, base + the active file bit for bit."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_state, state, tiny_batch, tiny_model
from safetensors.torch import load_file

import far
from far.saving import active_learners, unload_learners

LABELS = torch.tensor([0, 1, 2])


@torch.no_grad()
def logits(model: torch.nn.Module) -> torch.Tensor:
    return model(**tiny_batch()).logits


def user(path, *, seed: int, base_seed: int = 0, steps: int = 2, **config) -> tuple[torch.Tensor, dict]:
    """A user's file: random learners (`seed`) on the base, trained a few steps; its logits and state."""
    model = tiny_model("bert", seed=base_seed)
    far.reconfigure(model, selection="random", seed=seed, **({"retention": 0.4} | config))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(steps):
        model(**tiny_batch(seed=seed), labels=LABELS).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    far.save_learners(model, path)
    return logits(model), {k: v.clone() for k, v in model.state_dict().items()}


USERS = {  # different learners, retentions, frozen embeddings or not
    "a": dict(seed=3),
    "b": dict(seed=4, retention=0.25, freeze_embeddings=True),
    "c": dict(seed=5, retention=0.4),
}


@pytest.fixture
def files(tmp_path):
    return {
        name: (tmp_path / f"{name}.safetensors", *user(tmp_path / f"{name}.safetensors", **kw))
        for name, kw in USERS.items()
    }


def test_swaps_compute_base_plus_the_active_file_bit_for_bit(files):
    model = tiny_model("bert")
    for name in ["a", "b", "a", "c", "c", "b", "a"]:
        path, expected_logits, expected_state = files[name]
        far.load_learners(model, path)
        assert torch.equal(logits(model), expected_logits), name
        assert_state(model, expected_state)
        assert active_learners(model).path == str(path)
    unload_learners(model)
    assert not far.is_reconfigured(model) and active_learners(model) is None
    assert_state(model, state(tiny_model("bert")))


def test_bookkeeping_holds_exactly_the_active_files_tensors(files):
    model = tiny_model("bert")
    for name in ["a", "b"]:
        path = files[name][0]
        far.load_learners(model, path)
        data = {k: t for k, t in load_file(path).items() if not k.endswith(".learner_indices")}
        assert active_learners(model).nbytes == sum(t.numel() * t.element_size() for t in data.values())


def test_a_bad_file_is_refused_and_leaves_the_active_user_loaded_exactly(files, tmp_path):
    model = tiny_model("bert")
    far.load_learners(model, files["a"][0])
    before, active = state(model), active_learners(model)
    other_base = tmp_path / "other.safetensors"
    user(other_base, seed=4, base_seed=1)
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(files["b"][0].read_bytes()[:-50])
    heads = tmp_path / "heads.safetensors"
    user(heads, seed=6, attention_retention=0.5)
    for path, message in [
        (other_base, "trained from a different base model"),
        (corrupt, "not a readable safetensors file"),
        (heads, "unload_learners"),
    ]:
        with pytest.raises(far.saving.LearnersFileError, match=message):
            far.load_learners(model, path)
        assert_state(model, before)
        assert active_learners(model) is active
        assert torch.equal(logits(model), files["a"][1])


def test_heads_split_files_swap_too(tmp_path):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    logits_a, state_a = user(a, seed=3, attention_retention=0.5)
    logits_b, state_b = user(b, seed=8, attention_retention=0.25)
    model = tiny_model("bert")
    for path, expected, expected_state in [(a, logits_a, state_a), (b, logits_b, state_b), (a, logits_a, state_a)]:
        far.load_learners(model, path)
        assert torch.equal(logits(model), expected)
        assert_state(model, expected_state)


def test_unload_needs_a_loaded_file():
    with pytest.raises(ValueError, match="no learners file is loaded"):
        unload_learners(tiny_model("bert"))
