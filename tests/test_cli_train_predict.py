"""`far train` on the user's own files and `far predict`, end to end on a tiny BERT; their user errors."""

from __future__ import annotations

import io
import json
import random

import pytest
import torch
from conftest import tiny_model
from conftest import write_rows as write
from safetensors import safe_open
from transformers import AutoConfig, AutoTokenizer, BertForSequenceClassification

import far
from far.cli.main import main
from far.recipes import predict

GOOD = "good great lovely fine superb warm".split()
BAD = "bad awful dull boring poor tired".split()


def _rows(n: int, seed: int, pairs: bool = False) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        positive = rng.random() < 0.5
        words = " ".join(rng.choice(GOOD if positive else BAD) for _ in range(4))
        row = {"sentence1": words, "sentence2": "the film"} if pairs else {"text": words.capitalize() + "."}
        rows.append({**row, "label": "positive" if positive else "negative"})
    return rows


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


QUICK = ["--max-steps", "3", "--batch-size", "8", "--no-progress"]


def _train(tiny_model_dir, train, dev, out, *extra) -> int:
    return main(
        [
            "train",
            "--train-file",
            str(train),
            "--validation-file",
            str(dev),
            "--model",
            str(tiny_model_dir),
            "--output-dir",
            str(out),
            *QUICK,
            *extra,
        ]
    )


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".json", ".jsonl"])
def test_train_every_format_writes_glue_outputs(tiny_model_dir, tmp_path, capsys, suffix):
    train = write(tmp_path / f"reviews{suffix}", _rows(24, 0))
    dev = write(tmp_path / f"dev{suffix}", _rows(8, 1))
    out = tmp_path / "run"
    assert _train(tiny_model_dir, train, dev, out) == 0
    printed = capsys.readouterr().out
    assert "reviews (far): accuracy = " in printed and "reviews (far): macro_f1 = " in printed
    record = json.loads((out / "metrics.json").read_text())
    assert set(record["metrics"]) == {"accuracy", "macro_f1"}
    assert record["labels"] == ["negative", "positive"] and record["text_columns"] == ["text"]
    assert record["files"]["learners"] == "learners.safetensors"
    assert record["learners_file_bytes"] == (out / "learners.safetensors").stat().st_size
    config = AutoConfig.from_pretrained(out / "model")
    assert config.id2label == {0: "negative", 1: "positive"}
    assert config.label2id == {"negative": 0, "positive": 1}
    assert config.far_columns == {"text": ["text"], "label": "label"}
    assert (out / "predictions.tsv").read_text().splitlines()[1].split("\t")[2] in ("negative", "positive")


@pytest.mark.parametrize(
    "extra",
    [
        ["--method", "full"],
        ["--method", "random"],
        ["--method", "freeze-ffn"],
        ["--method", "far", "--optimizer", "mezo", "--freeze-embeddings"],
        ["--method", "full", "--optimizer", "mezo"],
        ["--method", "full", "--freeze-embeddings", "--freeze-layers", "1"],
        ["--method", "far", "--retention", "0.2", "--freeze-layers", "auto"],
        ["--method", "random", "--freeze-layers", "1"],
    ],
)
def test_train_every_method_and_optimizer(tiny_model_dir, tmp_path, extra):
    train, dev = write(tmp_path / "t.csv", _rows(24, 0)), write(tmp_path / "d.csv", _rows(8, 1))
    out = tmp_path / "run"
    assert _train(tiny_model_dir, train, dev, out, *extra) == 0
    record = json.loads((out / "metrics.json").read_text())
    optimizer = extra[extra.index("--optimizer") + 1] if "--optimizer" in extra else "adamw"
    assert record["method"] == extra[1] and record["optimizer"] == optimizer
    if "--freeze-layers" in extra:
        layers = extra[extra.index("--freeze-layers") + 1]
        assert record["hyperparameters"]["freeze_layers"] == (layers if layers == "auto" else int(layers))
        assert record["frozen_layers"] >= (1 if layers == "1" else 0)
    reconfigured = extra[1] in ("far", "random")
    assert (out / "learners.safetensors").exists() == reconfigured
    assert (out / "model" / "config.json").exists()


def test_train_with_the_frozen_bottom_kept(tiny_model_dir, tmp_path, capsys):
    train, dev = write(tmp_path / "t.csv", _rows(24, 0)), write(tmp_path / "d.csv", _rows(8, 1))
    out = tmp_path / "run"
    extra = ["--method", "far", "--freeze-layers", "1", "--cache-frozen", "--max-steps", "8"]
    assert _train(tiny_model_dir, train, dev, out, *extra) == 0
    record = json.loads((out / "metrics.json").read_text())
    assert record["hyperparameters"]["cache_frozen"] is True and record["frozen_cache_bytes"] > 0
    assert "MiB of it the frozen bottom's kept states" in capsys.readouterr().out


def test_train_pairs_and_regression(tiny_model_dir, tmp_path, capsys):
    rows = [{**r, "score": f"{i % 5 + 0.5}"} for i, r in enumerate(_rows(24, 0, pairs=True))]
    path = write(tmp_path / "sim.jsonl", [{k: v for k, v in r.items() if k != "label"} for r in rows])
    out = tmp_path / "run"
    assert _train(tiny_model_dir, path, path, out, "--label-column", "score") == 0
    assert "sim (far): pearson = " in capsys.readouterr().out
    record = json.loads((out / "metrics.json").read_text())
    assert record["labels"] == "regression" and record["text_columns"] == ["sentence1", "sentence2"]
    assert AutoConfig.from_pretrained(out / "model").problem_type == "regression"
    results = predict(out / "model", [("good great", "the film")])
    assert results[0]["label"] is None and isinstance(results[0]["score"], float)


@pytest.fixture(scope="module")
def trained(tiny_model_dir, tmp_path_factory):
    """A run of the random method (its learners file applies to the stock base, as every method's does)."""
    root = tmp_path_factory.mktemp("trained")
    train, dev = write(root / "t.csv", _rows(32, 0)), write(root / "d.csv", _rows(8, 1))
    assert _train(tiny_model_dir, train, dev, root / "run", "--method", "random", "--max-steps", "8") == 0
    return root / "run"


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_predict_writes_one_row_per_input(trained, tmp_path, capsys, suffix):
    inputs = write(tmp_path / "new.tsv", _rows(5, 3))  # the label column is ignored
    output = tmp_path / f"out{suffix}"
    assert main(["predict", "--model", str(trained / "model"), "--input", str(inputs), "--output", str(output)]) == 0
    if suffix == ".jsonl":
        rows = [json.loads(line) for line in output.read_text().splitlines()]
    else:
        lines = output.read_text().splitlines()
        assert lines[0] == "text,label,score"
        rows = [dict(zip(("text", "label", "score"), line.rsplit(",", 2), strict=True)) for line in lines[1:]]
    assert len(rows) == 5
    assert all(r["label"] in ("negative", "positive") and 0.5 <= float(r["score"]) <= 1 for r in rows)
    assert "wrote 5 predictions" in capsys.readouterr().err


def test_predict_from_stdin_and_in_python(trained, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("Good great lovely.\n\nBad awful dull.\n"))
    assert main(["predict", "--model", str(trained / "model")]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["text"] for r in rows] == ["Good great lovely.", "Bad awful dull."]
    same = predict(trained / "model", ["Good great lovely.", "Bad awful dull."])
    assert [r["label"] for r in same] == [r["label"] for r in rows]
    assert same[0]["score"] == pytest.approx(rows[0]["score"])


def test_predict_base_plus_learners_file(trained, tiny_model_dir, tmp_path):
    with safe_open(trained / "learners.safetensors", framework="pt") as f:
        assert json.loads(f.metadata()["model_config"])["id2label"] == {"0": "negative", "1": "positive"}
    texts = ["Good great lovely.", "Bad awful dull."]
    whole = predict(trained / "model", texts)
    output = tmp_path / "out.jsonl"
    argv = ["predict", "--model", str(tiny_model_dir), "--learners", str(trained / "learners.safetensors")]
    monkey_input = tmp_path / "in.jsonl"
    write(monkey_input, [{"text": t} for t in texts])
    assert main([*argv, "--input", str(monkey_input), "--output", str(output)]) == 0
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert [r["label"] for r in rows] == [r["label"] for r in whole]
    assert [r["score"] for r in rows] == pytest.approx([r["score"] for r in whole], abs=1e-6)


def test_learners_file_for_another_base_is_refused(trained, tiny_model_dir, tmp_path, capsys):
    other = tmp_path / "other-base"
    model = BertForSequenceClassification.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        model.bert.encoder.layer[0].intermediate.dense.weight.add_(0.01)  # frozen FFN nodes differ
    model.save_pretrained(other)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(other)
    output = tmp_path / "out.csv"
    inputs = write(tmp_path / "in.csv", [{"text": "Good."}])
    argv = ["predict", "--model", str(other), "--learners", str(trained / "learners.safetensors")]
    assert main([*argv, "--input", str(inputs), "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert "was trained from a different base model" in err and "Load it onto the exact base model" in err
    assert not output.exists()
    assert list(tmp_path.glob(".out.csv*")) == []  # no half-written file either


@pytest.mark.parametrize(
    "case,argv,message",
    [
        ("missing column", ["--input", "{tmp}/wrong.csv"], "has no column 'text'; its columns are: review, label"),
        ("bad output suffix", ["--input", "{tmp}/in.csv", "--output", "{tmp}/out.txt"], "name a file ending in .csv"),
        (
            "not a model",
            ["--input", "{tmp}/in.csv", "--model", "{tmp}"],
            "has no config.json; give a Hugging Face model folder",
        ),
        ("empty input", ["--input", "{tmp}/empty.jsonl"], "is empty"),
    ],
)
def test_predict_user_errors(trained, tmp_path, capsys, case, argv, message):
    write(tmp_path / "wrong.csv", [{"review": "Good.", "label": "positive"}])
    write(tmp_path / "in.csv", [{"text": "Good."}])
    (tmp_path / "empty.jsonl").write_text("")
    argv = [a.format(tmp=tmp_path) for a in argv]
    base = ["predict", "--model", str(trained / "model")]
    assert main([*base, *argv]) == 2, case
    err = capsys.readouterr().err
    assert message in err, err
    assert "far predict: error: " in err and "Traceback" not in err


@pytest.mark.parametrize(
    "case,train_rows,dev_rows,extra,message",
    [
        ("misspelt column", None, None, ["--text-column", "txt"], "has no column 'txt'; its columns are: text, label"),
        ("misspelt label", None, None, ["--label-column", "lable"], "Did you mean 'label'?"),
        ("unseen label", None, [{"text": "Meh.", "label": "neutral"}], [], "never occur in the training file"),
        ("mixed labels", [{"text": "a", "label": "positive"}, {"text": "b", "label": 1}], None, [], "mix text and"),
        ("empty file", [], None, [], "is empty"),
        ("non-UTF-8", b"text,label\n\xff,positive\n", None, [], "is not UTF-8 text"),
        ("missing file", "missing", None, [], "does not exist"),
        (  # the paper's configuration freezes no bottom (the default, FAR's automatic one, does)
            "nothing frozen to keep",
            None,
            None,
            ["--retention", "0.4", "--cache-frozen"],
            "--freeze-layers K or --freeze-layers auto",
        ),
        (
            "kept states over a budget",
            None,
            None,
            ["--cache-frozen", "--freeze-layers", "1", "--memory-budget", "900"],
            "use one of the two",
        ),
    ],
)
def test_train_user_errors_exit_2_before_anything(
    tiny_model_dir, tmp_path, capsys, case, train_rows, dev_rows, extra, message
):
    train = tmp_path / "train.csv"
    if train_rows is None:
        write(train, _rows(8, 0))
    elif isinstance(train_rows, bytes):
        train.write_bytes(train_rows)
    elif train_rows == []:
        train.write_text("")
    elif isinstance(train_rows, list):
        write(train, train_rows)
    else:
        train = tmp_path / "missing.csv"
    dev = write(tmp_path / "dev.csv", dev_rows or _rows(4, 1))
    out = tmp_path / "out"
    assert _train(tiny_model_dir, train, dev, out, *extra) == 2, case
    err = capsys.readouterr().err
    assert message in err, err
    assert "far train: error: " in err and "Traceback" not in err
    assert not out.exists()  # nothing was trained or written


def test_learners_file_keeps_the_model_config(tmp_path):
    model = tiny_model("bert", num_labels=3)
    far.reconfigure(model, far.FARConfig(0.5, "random"))
    path = far.save_learners(model, tmp_path / "l.safetensors")
    assert len(far.saving.learners_model_config(path)["id2label"]) == 3
    far.load_learners(tiny_model("bert", num_labels=3, seed=0), path)  # the extra metadata changes nothing else


@pytest.mark.slow
def test_predict_serves_several_users_from_one_process(tiny_model_dir, tmp_path, capsys):
    train, dev = write(tmp_path / "t.csv", _rows(24, 0)), write(tmp_path / "d.csv", _rows(8, 1))
    users = tmp_path / "users"
    users.mkdir()
    for seed in range(3):  # three users: other data order and learners
        out = tmp_path / f"run{seed}"
        assert _train(tiny_model_dir, train, dev, out, "--seed", str(seed), "--retention", "0.3") == 0
        (out / "learners.safetensors").rename(users / f"user{seed}.safetensors")
    inputs = write(tmp_path / "in.csv", [{"text": "Good great lovely."}, {"text": "Bad awful dull."}])
    argv = ["predict", "--model", str(tiny_model_dir), "--learners", str(users), "--input", str(inputs)]
    assert main([*argv, "--output-dir", str(tmp_path / "out"), "--format", "csv"]) == 0
    assert "swapped in" in capsys.readouterr().err
    for seed in range(3):
        alone = predict(tiny_model_dir, inputs, learners=users / f"user{seed}.safetensors")
        served = (tmp_path / "out" / f"user{seed}.csv").read_text().splitlines()[1:]
        assert [line.split(",")[1] for line in served] == [r["label"] for r in alone]
        assert [float(line.split(",")[2]) for line in served] == pytest.approx([r["score"] for r in alone], abs=1e-6)


def test_several_users_with_a_bad_file_skip_it_and_exit_1(trained, tiny_model_dir, tmp_path, capsys):
    users = tmp_path / "users"
    users.mkdir()
    (users / "a.safetensors").write_bytes((trained / "learners.safetensors").read_bytes())
    (users / "b.safetensors").write_bytes(b"not a learners file")
    inputs = write(tmp_path / "in.csv", [{"text": "Good."}])
    argv = ["predict", "--model", str(tiny_model_dir), "--learners", str(users), "--input", str(inputs)]
    assert main([*argv, "--output-dir", str(tmp_path / "out")]) == 1
    assert "skipped " + str(users / "b.safetensors") in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.jsonl"]
    assert main([*argv, "--output", str(tmp_path / "one.jsonl")]) == 2
    assert "--output-dir" in capsys.readouterr().err


def test_export_peft_gives_the_learners_logits_through_peft(trained, tiny_model_dir, tmp_path, capsys):
    peft = pytest.importorskip("peft")
    learners = trained / "learners.safetensors"
    out = tmp_path / "user-lora"
    assert main(["export", "--checkpoint", str(tiny_model_dir), "--peft", str(out)]) == 2
    assert "add --learners FILE" in capsys.readouterr().err and not out.exists()
    assert main(["export", "--checkpoint", str(tiny_model_dir), "--learners", str(learners), "--peft", str(out)]) == 0
    assert "PEFT LoRA adapter" in capsys.readouterr().out
    batch = AutoTokenizer.from_pretrained(tiny_model_dir)(
        ["Good great lovely.", "Bad awful dull."], return_tensors="pt", padding=True
    )
    with torch.no_grad():
        expected = far.load_learners(BertForSequenceClassification.from_pretrained(tiny_model_dir), learners)
        adapted = peft.PeftModel.from_pretrained(BertForSequenceClassification.from_pretrained(tiny_model_dir), out)
        torch.testing.assert_close(adapted.eval()(**batch).logits, expected.eval()(**batch).logits, rtol=0, atol=1e-5)
