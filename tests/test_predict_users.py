"""`far predict` over many users: each learners file stands on its own, whatever came before it.

Every file's head (size, labels) and its refusal come from the file and the base alone; a bad file
is reported and skipped while the others are written. Tiny BERT base (`tiny_model_dir`), no training:
each user's file is the base reconfigured with its own learners and seeded noise on what it trains.
"""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path

import pytest
import torch
from conftest import write_rows

import far
from far.cli.main import main
from far.models import load_model_and_tokenizer
from far.recipes.predict import model_card, predict
from far.saving import LearnersFileError, learners_model_config, unload_learners

TEXTS = [{"text": "Good great lovely."}, {"text": "Bad awful dull."}, {"text": "The film."}]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@torch.no_grad()
def user_file(base: Path, path: Path, *, seed: int, kind: str = "classification", num_labels: int = 2, **options):
    """A user's learners file saved from Python: random learners on the base, seeded noise on what trains."""
    label_names = options.pop("label_names", None)
    model, _ = load_model_and_tokenizer(str(base), kind, num_labels, label_names=label_names)
    far.reconfigure(model, far.FARConfig(0.5, "random", seed=seed, **options))
    generator = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        if p.requires_grad:
            p.add_(torch.randn(p.shape, generator=generator) * 0.2)
    return far.save_learners(model, path)


@pytest.fixture(scope="module")
def users(tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    """Three users of one base: named classes splitting attention heads too; classes saved, as before
    files recorded their head, without labels (transformers' LABEL_0, LABEL_1 left out of the file);
    a regression head (one output)."""
    root = tmp_path_factory.mktemp("users")
    files = {
        "alice": user_file(
            tiny_model_dir,
            root / "alice.safetensors",
            seed=1,
            label_names=["negative", "positive"],
            attention_retention=0.5,
        ),
        "reg": user_file(tiny_model_dir, root / "reg.safetensors", seed=3, kind="regression", num_labels=1),
    }
    with pytest.MonkeyPatch.context() as patch:  # a file as save_learners wrote it before it recorded the head
        patch.setattr("far.saving.learners_file.head_fields", lambda model: {})
        files["carol"] = user_file(tiny_model_dir, root / "carol.safetensors", seed=2)
    return files


def predict_cli(base: Path, learners: list[Path], inputs: Path, out: Path) -> tuple[int, dict[str, list[dict]]]:
    """`far predict --learners ... --output-dir out`: its exit code and the rows of every output file."""
    argv = ["predict", "--model", str(base), "--learners", *map(str, learners), "--input", str(inputs)]
    code = main([*argv, "--output-dir", str(out)])
    rows = {p.stem: [json.loads(line) for line in p.read_text().splitlines()] for p in sorted(out.glob("*.jsonl"))}
    return code, rows


def test_a_file_saved_from_python_records_its_head(tiny_model_dir, tmp_path):
    path = user_file(tiny_model_dir, tmp_path / "u.safetensors", seed=0)
    config = learners_model_config(path)
    assert config["num_labels"] == 2
    assert config["id2label"] == {"0": "LABEL_0", "1": "LABEL_1"}
    assert config["problem_type"] == "single_label_classification"
    card = model_card(tiny_model_dir, path)
    assert card.label_names == ("LABEL_0", "LABEL_1") and not card.names_classes


def test_a_file_without_recorded_labels_predicts_label_ids_alone(users, tiny_model_dir, tmp_path, caplog):
    card = model_card(tiny_model_dir, users["carol"])
    assert (card.head_size, card.label_names) == (2, ("LABEL_0", "LABEL_1"))
    with caplog.at_level(logging.WARNING, logger="far"):
        rows = predict(tiny_model_dir, [t["text"] for t in TEXTS], learners=users["carol"])
    assert {r["label"] for r in rows} <= {"LABEL_0", "LABEL_1"} and all(0.5 <= r["score"] <= 1 for r in rows)
    notes = [r.getMessage() for r in caplog.records if "records no label names" in r.getMessage()]
    assert len(notes) == 1 and "label ids LABEL_0, LABEL_1" in notes[0]


def test_every_order_of_users_gives_each_user_the_same_predictions(users, tiny_model_dir, tmp_path):
    inputs = write_rows(tmp_path / "in.jsonl", TEXTS)
    alone = {name: predict(tiny_model_dir, inputs, learners=path) for name, path in users.items()}
    assert all(r["label"] in ("negative", "positive") for r in alone["alice"])
    assert all(r["label"] is None for r in alone["reg"])
    assert all(r["label"] in ("LABEL_0", "LABEL_1") for r in alone["carol"])
    for i, order in enumerate(itertools.permutations(users)):
        code, rows = predict_cli(tiny_model_dir, [users[name] for name in order], inputs, tmp_path / f"out{i}")
        assert code == 0, order
        assert rows == alone, order


def test_a_bad_file_is_reported_and_skipped_and_the_others_written(users, tiny_model_dir, tmp_path, capsys):
    folder = tmp_path / "users"
    folder.mkdir()
    for name in ("alice", "carol"):
        (folder / f"{name}.safetensors").write_bytes(users[name].read_bytes())
    (folder / "bob.safetensors").write_bytes(b"not a learners file")  # between the two, in sorted order
    inputs = write_rows(tmp_path / "in.csv", TEXTS)
    code, rows = predict_cli(tiny_model_dir, [folder], inputs, tmp_path / "out")
    assert code == 1
    assert sorted(rows) == ["alice", "carol"] and all(len(r) == len(TEXTS) for r in rows.values())
    assert rows["carol"] == predict(tiny_model_dir, inputs, learners=users["carol"])
    err = capsys.readouterr().err
    assert "skipped" in err and "bob.safetensors" in err and "not a readable safetensors file" in err
    assert "1 of 3 learners files failed" in err and "Traceback" not in err


def test_a_folder_where_every_file_fails_writes_nothing_and_exits_2(tiny_model_dir, tmp_path, capsys):
    folder = tmp_path / "users"
    folder.mkdir()
    for name in ("a", "b"):
        (folder / f"{name}.safetensors").write_bytes(b"garbage")
    inputs = write_rows(tmp_path / "in.csv", TEXTS)
    code, rows = predict_cli(tiny_model_dir, [folder], inputs, tmp_path / "out")
    assert code == 2 and rows == {}
    assert "no user's predictions were written: all 2 learners file(s) failed" in capsys.readouterr().err


def test_no_load_report_for_a_head_the_file_replaces(users, tiny_model_dir, tmp_path, caplog):
    inputs = write_rows(tmp_path / "in.csv", TEXTS)
    # The base's checkpoint has a two-class head: one output is a head transformers would report as new.
    argv = ["predict", "--model", str(tiny_model_dir), "--learners", str(users["reg"]), "--input", str(inputs)]
    with caplog.at_level(logging.INFO):
        assert main(argv) == 0
        assert not [r for r in caplog.records if "LOAD REPORT" in r.getMessage() or "a new " in r.getMessage()]
        load_model_and_tokenizer(str(tiny_model_dir), "classification", 3)  # elsewhere the new head is said
    assert [r for r in caplog.records if "a new sequence-classification head (classifier." in r.getMessage()]


def test_a_head_of_another_size_is_refused_naming_both_sizes(users, tiny_model_dir):
    model, _ = load_model_and_tokenizer(str(tiny_model_dir), "classification", 3)
    with pytest.raises(LearnersFileError, match=r"the file's head has 1 output\(s\) and the model's 3") as info:
        far.load_learners(model, users["reg"])
    assert "num_labels=1" in str(info.value) and "another size or dtype" not in str(info.value)


def test_a_file_of_another_dtype_is_refused_naming_the_dtype(users, tiny_model_dir):
    model, _ = load_model_and_tokenizer(str(tiny_model_dir), "classification", 2)
    with pytest.raises(LearnersFileError, match="the file holds torch.float32 values and the model torch.float64"):
        far.load_learners(model.double(), users["carol"])


def test_a_file_for_another_base_names_the_flags_that_fix_it(users, tiny_model_dir, tmp_path):
    model, _ = load_model_and_tokenizer(str(tiny_model_dir), "classification", 2)
    with torch.no_grad():
        model.bert.encoder.layer[0].intermediate.dense.weight.add_(0.01)  # frozen FFN nodes differ
    with pytest.raises(LearnersFileError, match="trained from a different base model") as info:
        far.load_learners(model, users["carol"])
    message = str(info.value)
    assert "reset_frozen=False" in message and "--keep-primed-frozen" in message and "--model" in message


def test_load_learners_gives_the_model_each_files_labels_and_the_base_its_own_back(users, tiny_model_dir, tmp_path):
    dave = user_file(tiny_model_dir, tmp_path / "dave.safetensors", seed=4, label_names=["negative", "positive"])
    model, _ = load_model_and_tokenizer(str(tiny_model_dir), "classification", 2, label_names=["no", "yes"])
    far.load_learners(model, dave)
    assert model.config.id2label == {0: "negative", 1: "positive"}
    assert model.config.label2id == {"negative": 0, "positive": 1}
    far.load_learners(model, users["carol"])  # records no labels: the base's, not dave's
    assert model.config.id2label == {0: "no", 1: "yes"}
    far.load_learners(model, dave)
    unload_learners(model)
    assert model.config.id2label == {0: "no", 1: "yes"} and model.config.label2id == {"no": 0, "yes": 1}
