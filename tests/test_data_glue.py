"""far.data.glue: local GLUE TSVs in the hub's form, clear errors, tokenisation."""

from __future__ import annotations

import logging

import pytest

from far.data import GLUE_TASKS, load_glue, read_glue_tsv, tokenize_glue
from far.data.glue import features


def _write(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture
def glue_dir(tmp_path):
    """A GLUE folder in the download layout: CoLA (no header), STS-B (10 columns), MNLI (named labels)."""
    root = tmp_path / "data"
    cola = ["gj04\t1\t\tThe sailors rode the breeze clear of the rocks.", 'gj04\t0\t*\tThe "more" he "reads".']
    _write(root / "glue" / "CoLA" / "train.tsv", cola * 3)
    _write(root / "glue" / "CoLA" / "dev.tsv", cola)
    head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    stsb = [
        head,
        "0\tmain\tMSRvid\t2012\t0\tnone\tnone\tA man is dancing.\tA man dances.\t4.750",
        '1\tmain\tMSRvid\t2012\t1\tnone\tnone\tA cat.\tA dog "barks".\t0.5',
    ]
    _write(root / "glue" / "STS-B" / "train.tsv", stsb)
    _write(root / "glue" / "STS-B" / "dev.tsv", stsb)
    mnli = [
        "index\tsentence1\tsentence2\tgold_label",
        "0\tA\tB\tneutral",
        "1\tC\tD\tcontradiction",
        "2\ttoo short",
    ]  # a malformed row: skipped
    _write(root / "MNLI" / "train.tsv", mnli)  # <dir>/<Task>/ directly works too
    _write(root / "MNLI" / "dev_matched.tsv", mnli)
    return root


def test_local_cola_without_header_in_hub_form(glue_dir):
    splits = load_glue("cola", glue_dir)
    assert set(splits) == {"train", "validation"}
    train = splits["train"]
    assert train.column_names == ["sentence", "label", "idx"]
    assert len(train) == 6 and train["idx"] == list(range(6))
    assert train[1] == {"sentence": 'The "more" he "reads".', "label": 0, "idx": 1}  # quotes kept: quoting off
    assert train.features["label"].names == ["unacceptable", "acceptable"]


def test_stsb_scores_and_mnli_label_names(glue_dir, caplog):
    stsb = load_glue("stsb", glue_dir, splits=("validation",))["validation"]
    assert stsb.column_names == ["sentence1", "sentence2", "label", "idx"]
    assert stsb["label"] == pytest.approx([4.75, 0.5])
    assert stsb[1]["sentence2"] == 'A dog "barks".'
    with caplog.at_level(logging.WARNING, logger="far.data.glue"):
        mnli = load_glue("mnli", glue_dir)["validation"]
    assert mnli["label"] == [1, 2] and mnli.column_names[:2] == ["premise", "hypothesis"]
    assert "skipped 1 row" in caplog.text


def test_env_var_locates_data(glue_dir, monkeypatch):
    monkeypatch.setenv("FAR_DATA_DIR", str(glue_dir))
    assert len(load_glue("cola")["validation"]) == 2


def test_missing_data_dir_says_where_and_how(tmp_path, monkeypatch):
    monkeypatch.delenv("FAR_DATA_DIR", raising=False)
    with pytest.raises(FileNotFoundError, match=r"nope \(from --data-dir\) does not exist.*--data-dir.*FAR_DATA_DIR"):
        load_glue("cola", tmp_path / "nope")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match=r"looked in: nowhere.*--data-dir.*FAR_DATA_DIR"):
        load_glue("cola")
    monkeypatch.setenv("FAR_DATA_DIR", str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match=r"from \$FAR_DATA_DIR"):
        load_glue("cola")


def test_missing_task_folder_offline(glue_dir, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(FileNotFoundError) as e:
        load_glue("rte", glue_dir)
    message = str(e.value)
    assert str(glue_dir / "glue" / "RTE") in message and str(glue_dir / "RTE") in message
    assert "--data-dir" in message and "FAR_DATA_DIR" in message and "offline" in message.lower()
    (glue_dir / "glue" / "CoLA" / "dev.tsv").unlink()
    with pytest.raises(FileNotFoundError, match="dev.tsv does not exist"):
        load_glue("cola", glue_dir)


def test_file_without_expected_columns(tmp_path):
    bad = _write(tmp_path / "train.tsv", ["text\tlabel", "good movie\t1"])
    with pytest.raises(ValueError, match=r"has columns \['text', 'label'\] but GLUE sst2 needs \['sentence'\]"):
        read_glue_tsv(bad, "sst2")
    headed_cola = _write(tmp_path / "cola.tsv", ["sentence\tlabel", "A sentence.\t1"])
    with pytest.raises(ValueError, match="does not look like GLUE CoLA: expected 4 tab-separated fields"):
        read_glue_tsv(headed_cola, "cola")
    bad_label = _write(tmp_path / "rte.tsv", ["index\tsentence1\tsentence2\tlabel", "0\ta\tb\tmaybe"])
    with pytest.raises(ValueError, match=r"rte.tsv:2: label 'maybe' is not one of \['entailment'"):
        read_glue_tsv(bad_label, "rte")
    with pytest.raises(ValueError, match="is empty"):
        read_glue_tsv(_write(tmp_path / "empty.tsv", []), "sst2")
    with pytest.raises(ValueError, match="unknown GLUE task 'foo'; choose one of cola"):
        load_glue("foo", tmp_path)


def test_every_task_has_hub_features():
    for task in GLUE_TASKS.values():
        feats = features(task)
        assert list(feats)[-2:] == ["label", "idx"]
        assert task.num_labels == (1 if task.name == "stsb" else len(feats["label"].names))


def test_tokenize_glue_pairs_and_truncation(glue_dir, minilm_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    stsb = tokenize_glue(load_glue("stsb", glue_dir)["train"], tokenizer, "stsb", max_length=128)
    assert stsb.column_names == ["input_ids", "token_type_ids", "attention_mask", "labels"]
    assert stsb[0]["labels"] == pytest.approx(4.75)
    assert set(stsb[0]["token_type_ids"]) == {0, 1}  # a sentence pair
    assert tokenizer.decode(stsb[0]["input_ids"]) == "[CLS] a man is dancing. [SEP] a man dances. [SEP]"
    short = tokenize_glue(load_glue("cola", glue_dir)["train"], tokenizer, "cola", max_length=8)
    assert max(len(ids) for ids in short["input_ids"]) == 8
    with pytest.raises(ValueError, match="at least 8"):
        tokenize_glue(load_glue("cola", glue_dir)["train"], tokenizer, "cola", max_length=4)


def test_shared_glue_data(data_dir):
    cola, sst2, stsb = (load_glue(t, data_dir) for t in ("cola", "sst2", "stsb"))
    assert (len(cola["train"]), len(cola["validation"])) == (8551, 1043)
    assert (len(sst2["train"]), len(sst2["validation"])) == (67349, 872)
    assert (len(stsb["train"]), len(stsb["validation"])) == (5749, 1500)
    assert set(cola["validation"]["label"]) == {0, 1}
    assert 0.0 <= min(stsb["train"]["label"]) and max(stsb["train"]["label"]) <= 5.0


def test_mrpc_with_glue_byte_order_mark(tmp_path):
    # GLUE's MRPC files (download_glue_data.py) start with the MSR file's UTF-8 byte order mark
    head = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"
    path = tmp_path / "dev.tsv"
    path.write_text("\ufeff" + head + "\n1\t702876\t702977\tA man sings .\tA man is singing .\n", encoding="utf-8")
    split = read_glue_tsv(path, "mrpc")
    assert split[0] == {"sentence1": "A man sings .", "sentence2": "A man is singing .", "label": 1, "idx": 0}
