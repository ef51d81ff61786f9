"""Many users from one process: memory stays at the base plus one file, from the first user to the last.

`predict_users` on a tiny seeded BERT (`tiny_model_dir`) over users' learners files: the process's
RSS after the last user is within a small margin of its RSS after the first few, and what the model
keeps across swaps (the digests of its base values, the files it verified) does not grow with the
number of users. The same for `far.load_learners` swapping 30 users on one model without predicting.
experiments/users_load.py measures the same on MiniLM and SmolLM2 in a child process.
"""

from __future__ import annotations

import copy
import gc
from pathlib import Path

import psutil
import pytest
import torch

import far
from far.models import load_model_and_tokenizer
from far.recipes.predict import Predictor
from far.recipes.users import predict_users
from far.saving import active_learners
from far.saving.digests import DigestCache
from far.saving.safetensors_file import MAX_VERIFIED

USERS = 30
# Predicting costs ~0.1 s of CPU a user even on the tiny model (datasets fingerprints the tokenizer on
# every map), so predictions are made for the first PREDICTED users; swaps alone for all of them.
PREDICTED = 12
WARM_UP = 3  # users after which RSS has its working set: the base split, the first batches run
RSS_MARGIN = 8 * 2**20  # bytes: allocator noise, far below a leak of a file per user


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def user_files(tiny_model_dir, tmp_path_factory) -> list[Path]:
    """`USERS` learners files of one base, as FAR at r=0.39 with the embeddings and the bottom layer frozen
    writes them: random learners per user and seeded noise on what trains (no training)."""
    folder = tmp_path_factory.mktemp("users")
    base, _ = load_model_and_tokenizer(str(tiny_model_dir), "classification", 2, label_names=["neg", "pos"])
    files = []
    with torch.no_grad():
        for seed in range(USERS):
            model = copy.deepcopy(base)
            far.reconfigure(model, far.FARConfig(0.39, "random", seed=seed, freeze_embeddings=True, freeze_layers=1))
            generator = torch.Generator().manual_seed(seed)
            for p in model.parameters():
                if p.requires_grad:
                    p.add_(torch.randn(p.shape, generator=generator) * 0.1)
            files.append(far.save_learners(model, folder / f"user-{seed:02d}.safetensors"))
    return files


def test_the_digest_cache_forgets_a_tensor_when_it_is_freed():
    cache = DigestCache()
    kept = torch.randn(4, 3)
    cache.rows(kept)
    for _ in range(10):
        cache.rows(torch.randn(4, 3))  # freed at once: nothing of it may stay in the cache
        cache.carry(kept, kept.clone())
    gc.collect()
    assert len(cache) == 1
    assert (cache.rows(kept) == far.saving.digests.sha256_rows(kept)).all()


def test_swapping_users_keeps_the_caches_bounded(tiny_model_dir, user_files):
    model, _ = load_model_and_tokenizer(str(tiny_model_dir), "classification", 2, label_names=["neg", "pos"])
    sizes = []
    for path in user_files:
        far.load_learners(model, path)
        active = active_learners(model)
        sizes.append(len(active.digests))
        assert len(active.verified) <= MAX_VERIFIED
    # Each user's digests replace the last one's: the same number of entries from the second user on.
    assert max(sizes[1:]) == sizes[1], sizes


def test_predictions_for_many_users_keep_memory_flat(tiny_model_dir, user_files, tmp_path):
    rows = tmp_path / "rows.csv"
    rows.write_text("text\n" + "".join(f"review {i}: a good film with a dull plot\n" for i in range(20)))
    process, rss, caches = psutil.Process(), [], []

    def measure(output: Path, info: dict, predictor: Predictor) -> None:
        rss.append(process.memory_info().rss)
        active = active_learners(predictor.model)
        caches.append((len(active.digests), len(active.verified)))

    files = user_files[:PREDICTED]
    done = predict_users(tiny_model_dir, files, rows, output_dir=tmp_path / "out", on_written=measure)
    assert not done.failed and len(done.written) == PREDICTED == len(rss)
    warm = max(rss[:WARM_UP])
    assert rss[-1] - warm < RSS_MARGIN, [round(r / 2**20, 1) for r in rss]
    assert max(c[0] for c in caches[1:]) == caches[1][0], caches
    assert max(c[1] for c in caches) <= MAX_VERIFIED
