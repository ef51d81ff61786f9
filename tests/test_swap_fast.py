"""Fast user swaps: cached base digests, in-place re-splits and files verified once, every check kept."""

from __future__ import annotations

import dataclasses
import json
import struct
import time

import pytest
import torch
from conftest import assert_state, state, tiny_batch, tiny_model
from safetensors.torch import load_file, save_file

import far
from far.saving import active_learners, safetensors_file
from far.saving.digests import DigestCache, content_sha256, sha256_rows
from far.saving.fingerprint import base_fingerprint
from far.surgery.reconfigure import resplit
from far.surgery.state import node_groups

LABELS = torch.tensor([0, 1, 2])
LEARNERS = "bert.encoder.layer.0.output.dense"  # an FFN, keyed by its output projection


@torch.no_grad()
def logits(model: torch.nn.Module) -> torch.Tensor:
    return model(**tiny_batch()).logits


def trained(*, seed: int, base_seed: int = 0, **config) -> torch.nn.Module:
    """A user's model: random learners (`seed`) on the base, trained two AdamW steps."""
    model = tiny_model("bert", seed=base_seed)
    far.reconfigure(model, selection="random", seed=seed, **({"retention": 0.4} | config))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):
        model(**tiny_batch(seed=seed), labels=LABELS).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model


def saved(path, **kw) -> tuple:
    model = trained(**kw)
    far.save_learners(model, path)
    return path, logits(model), state(model)


def metadata(path) -> dict:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n])["__metadata__"]


def as_version_1(path, model: torch.nn.Module) -> None:
    """Rewrite a learners file as far wrote it before the version-2 fingerprint."""
    tensors, meta = load_file(path), metadata(path)
    chosen = far.learners(model)
    others = [k for k in tensors if not k.endswith(("learner_indices", "learner_weight", "learner_bias"))]
    meta["format_version"] = "1"
    meta["base_fingerprint"] = base_fingerprint(model, node_groups(model), chosen, others, version=1)
    meta["content_sha256"] = content_sha256(meta, tensors)
    save_file(tensors, path, metadata=meta)


def test_version_1_files_still_load_and_swap(tmp_path):
    model_a = trained(seed=3)
    a = far.save_learners(model_a, tmp_path / "a.safetensors")
    as_version_1(a, model_a)
    assert metadata(a)["format_version"] == "1"
    b, logits_b, _ = saved(tmp_path / "b.safetensors", seed=4, retention=0.25)
    assert metadata(b)["format_version"] == "2"
    base = tiny_model("bert")
    for path, expected in [(a, logits(model_a)), (b, logits_b), (a, logits(model_a))]:
        far.load_learners(base, path)
        assert torch.equal(logits(base), expected)
    with pytest.raises(far.saving.LearnersFileError, match="trained from a different base model"):
        far.load_learners(tiny_model("bert", seed=1), a)


FROZEN_VALUES = {  # where one frozen value of the base changes (node 0 is no learner of seed 3's)
    "input-projection row": lambda m, node: m.bert.encoder.layer[0].intermediate.dense.weight[node, 5],
    "output-projection column": lambda m, node: m.bert.encoder.layer[0].output.dense.weight[5, node],
    "input-projection bias": lambda m, node: m.bert.encoder.layer[0].intermediate.dense.bias[node],
    "embedding": lambda m, node: m.bert.embeddings.word_embeddings.weight[7, 3],
}


@pytest.mark.parametrize("where", FROZEN_VALUES)
def test_a_base_with_one_frozen_value_changed_is_refused(tmp_path, where):
    model = trained(seed=3, freeze_embeddings=True)
    path = far.save_learners(model, tmp_path / "a.safetensors")
    frozen_node = min(set(range(40)) - set(far.learners(model)[LEARNERS].tolist()))
    base = tiny_model("bert")
    with torch.no_grad():
        FROZEN_VALUES[where](base, frozen_node).add_(1e-3)
    before = state(base)
    with pytest.raises(far.saving.LearnersFileError, match="trained from a different base model"):
        far.load_learners(base, path)
    assert_state(base, before)
    assert not far.is_reconfigured(base) and active_learners(base) is None


@pytest.mark.parametrize("where", ["embedding", "frozen FFN row"])
def test_a_base_changed_in_place_between_swaps_is_refused(tmp_path, where):
    """The digests kept for swaps follow in-place writes: a base changed since is another base."""
    a, _, _ = saved(tmp_path / "a.safetensors", seed=3, freeze_embeddings=True)
    b, _, _ = saved(tmp_path / "b.safetensors", seed=4, retention=0.25, freeze_embeddings=True)
    model = tiny_model("bert")
    for path in [a, b, a]:  # every digest of the base is cached now
        far.load_learners(model, path)
    split = model.get_submodule(LEARNERS)
    learners_b = set(load_file(b)[f"{LEARNERS}.learner_indices"].tolist())
    # A stored row of a's frozen block whose node is frozen in b too.
    row = next(i for i in range(split.n_learners, split.n_nodes) if int(split.node_order[i]) not in learners_b)
    with torch.no_grad():
        if where == "embedding":
            model.bert.embeddings.word_embeddings.weight[7, 3] += 1e-3
        else:
            split.frozen_weight[row - split.n_learners, 2] += 1e-3
    before, active = state(model), active_learners(model)
    with pytest.raises(far.saving.LearnersFileError, match="trained from a different base model"):
        far.load_learners(model, b)
    assert_state(model, before)
    assert active_learners(model) is active


def test_the_digest_cache_never_returns_a_stale_digest():
    cache = DigestCache()
    weight = torch.nn.Parameter(torch.randn(6, 5))
    first = cache.rows(weight.detach()).copy()
    assert (cache.rows(weight.detach()) == first).all()
    with torch.no_grad():
        weight[2, 1] += 1.0  # in place, through the parameter
    second = cache.rows(weight.detach())
    assert (second == sha256_rows(weight.detach())).all() and not (second[2] == first[2]).all()
    assert (second[[0, 1, 3, 4, 5]] == first[[0, 1, 3, 4, 5]]).all()
    view = weight.detach()[3:]
    with torch.no_grad():
        view.mul_(2.0)  # through a view: the same version counter
    assert (cache.rows(weight.detach()) == sha256_rows(weight.detach())).all()
    with torch.no_grad(), torch.inference_mode():
        weight[0].zero_()
    assert (cache.rows(weight.detach()) == sha256_rows(weight.detach())).all()
    weight.data = torch.randn(6, 5)  # new storage, the parameter's version counter kept
    assert (cache.rows(weight.detach()) == sha256_rows(weight.detach())).all()
    whole = cache.tensor(weight.detach())
    with torch.no_grad():
        weight.add_(1.0)
    assert cache.tensor(weight.detach()) != whole


def test_the_fingerprint_changes_when_a_base_tensor_changes_in_place():
    model = trained(seed=3, freeze_embeddings=True)
    ffns, chosen = far.find_ffns(model), far.learners(model)
    stored = [n for n, p in model.named_parameters() if p.requires_grad and "learner" not in n]
    cache = DigestCache()
    fingerprint = base_fingerprint(model, ffns, chosen, stored, digests=cache)
    assert len(cache) > 0 and base_fingerprint(model, ffns, chosen, stored, digests=cache) == fingerprint
    assert base_fingerprint(model, ffns, chosen, stored) == fingerprint  # cached or not, the same
    assert base_fingerprint(tiny_model("bert"), ffns, chosen, stored) == fingerprint  # the plain base too
    assert base_fingerprint(model, ffns, chosen, stored, version=1) != fingerprint  # another definition
    split = model.get_submodule(LEARNERS)
    for tensor in [model.bert.embeddings.word_embeddings.weight, split.frozen_weight]:
        with torch.no_grad():
            tensor[0, 0] += 1e-3
        changed = base_fingerprint(model, ffns, chosen, stored, digests=cache)
        assert changed != fingerprint
        assert changed == base_fingerprint(model, ffns, chosen, stored)  # what a fresh hash says
        fingerprint = changed


USERS = {  # other learners, other learner counts, heads split or not, embeddings frozen or not
    "a": dict(seed=3),
    "b": dict(seed=4, retention=0.25),
    "c": dict(seed=5, retention=0.6),
    "d": dict(seed=6, retention=0.25, freeze_embeddings=True),
}


def test_swaps_between_other_learner_sets_and_counts_are_bit_for_bit_and_in_place(tmp_path):
    files = {name: saved(tmp_path / f"{name}.safetensors", **kw) for name, kw in USERS.items()}
    model = tiny_model("bert")
    far.load_learners(model, files["a"][0])
    previous = "a"
    for name in ["b", "a", "c", "b", "a", "d", "a", "c"]:
        path, expected_logits, expected_state = files[name]
        split = model.get_submodule(LEARNERS)
        params, storage = (split.learner_weight, split.frozen_weight), split.frozen_weight.untyped_storage()
        far.load_learners(model, path)
        assert torch.equal(logits(model), expected_logits), name
        assert_state(model, expected_state)
        embeddings = [USERS[user].get("freeze_embeddings", False) for user in (previous, name)]
        if embeddings[0] == embeddings[1]:  # only the learners differ: rows moved within the same storage
            assert model.get_submodule(LEARNERS) is split
            assert (split.learner_weight, split.frozen_weight) == params
            assert split.frozen_weight.untyped_storage().data_ptr() == storage.data_ptr()
        previous = name
    far.saving.unload_learners(model)
    assert_state(model, state(tiny_model("bert")))


def test_resplit_moves_rows_only_where_nothing_else_changes():
    model = far.reconfigure(tiny_model("bert"), 0.4, selection="random", seed=3)
    reference = far.reconfigure(tiny_model("bert"), 0.25, selection="random", seed=4)
    config = far.get_config(reference)
    before = state(model)
    frozen_embeddings = dataclasses.replace(config, freeze_embeddings=True)
    assert not resplit(model, far.learners(reference), frozen_embeddings)
    assert_state(model, before)
    with pytest.raises(ValueError, match="distinct node indices"):
        resplit(model, {**far.learners(reference), LEARNERS: torch.tensor([0, 0])}, config)
    assert_state(model, before)
    assert resplit(model, far.learners(reference), config)
    assert far.get_config(model) == config
    assert_state(model, state(reference))
    assert torch.equal(logits(model), logits(reference))


def test_a_file_damaged_in_place_after_it_was_verified_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(safetensors_file, "SETTLED_NS", 0)  # remember files written just now
    a, _, state_a = saved(tmp_path / "a.safetensors", seed=3)
    b, logits_b, _ = saved(tmp_path / "b.safetensors", seed=4, retention=0.25)
    model = tiny_model("bert")
    far.load_learners(model, a)
    far.load_learners(model, b)
    hashed = []
    monkeypatch.setattr(safetensors_file, "content_sha256", lambda *args: hashed.append(1) or content_sha256(*args))
    far.load_learners(model, a)
    far.load_learners(model, b)
    assert hashed == []  # both verified before and unchanged: not hashed again
    assert torch.equal(logits(model), logits_b)
    far.load_learners(model, a)
    time.sleep(0.02)  # past a coarse timestamp tick (the settling time covers it outside this test)
    raw = bytearray(b.read_bytes())
    raw[-10] ^= 0x01  # one bit of the last tensor, written in place: the same inode and size
    with b.open("r+b") as f:
        f.write(raw)
    with pytest.raises(far.saving.LearnersFileError, match="corrupted"):
        far.load_learners(model, b)
    assert hashed == [1]
    assert_state(model, state_a)


def test_swaps_with_frozen_layers_are_bit_for_bit(tmp_path):
    """Files that freeze the bottom layer (empty learner blocks there) swap with each other in place,
    and with files that freeze no layer the long way round."""
    kinds = {
        "a": dict(seed=3, freeze_layers=1),
        "b": dict(seed=4, retention=0.25, freeze_layers=1),
        "c": dict(seed=5),
    }
    files = {name: saved(tmp_path / f"{name}.safetensors", **kw) for name, kw in kinds.items()}
    model = tiny_model("bert")
    for name in ["a", "b", "a", "c", "b", "c"]:
        path, expected_logits, expected_state = files[name]
        far.load_learners(model, path)
        assert torch.equal(logits(model), expected_logits), name
        assert_state(model, expected_state)
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        assert any(n.startswith("bert.encoder.layer.0.") for n in trainable) == (name == "c")
