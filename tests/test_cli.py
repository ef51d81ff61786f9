"""The `far` command in-process: glue / squad / eval end to end on tiny models, and its user errors."""

from __future__ import annotations

import json
import logging
import random
import shutil
import subprocess
import sys

import pytest
import torch

from far.cli.main import main

WORDS = "cat dog sat ran on under mat sofa quickly slowly big small red green house park".split()


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))).capitalize() + "."


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Synthetic CoLA, STS-B and SQuAD files in the shared data's layout."""
    rng = random.Random(0)
    root = tmp_path_factory.mktemp("data")
    for task in ("CoLA", "STS-B"):
        (root / "glue" / task).mkdir(parents=True)
    for split, n in (("train", 48), ("dev", 24)):
        rows = [f"src\t{rng.randint(0, 1)}\t\t{_sentence(rng)}" for _ in range(n)]
        (root / "glue" / "CoLA" / f"{split}.tsv").write_text("\n".join(rows) + "\n")
        head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
        rows = [
            f"{i}\tg\tf\ty\t{i}\ts\ts\t{_sentence(rng)}\t{_sentence(rng)}\t{rng.uniform(0, 5):.2f}" for i in range(n)
        ]
        (root / "glue" / "STS-B" / f"{split}.tsv").write_text("\n".join([head, *rows]) + "\n")
    articles = []
    for a in range(4):
        paragraphs = []
        for p in range(3):
            context = " ".join(_sentence(rng) for _ in range(6))
            qas = []
            for q in range(3):
                start = rng.randrange(0, len(context) - 10)
                start = context.index(" ", start) + 1
                end = context.find(" ", start)
                qas.append(
                    {
                        "id": f"{a}-{p}-{q}",
                        "question": f"What is word {q}?",
                        "answers": [{"text": context[start:end], "answer_start": start}],
                    }
                )
            paragraphs.append({"context": context, "qas": qas})
        articles.append({"title": f"article-{a}", "paragraphs": paragraphs})
    (root / "squad").mkdir()
    (root / "squad" / "dev-v1.1.json").write_text(json.dumps({"version": "1.1", "data": articles}))
    return root


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("FAR_DATA_DIR", raising=False)


QUICK = ["--max-steps", "2", "--batch-size", "8", "--no-progress"]


def _glue(task, model, data, out, *extra):
    return main(
        [
            "glue",
            "--task",
            task,
            "--model",
            str(model),
            "--data-dir",
            str(data),
            "--output-dir",
            str(out),
            *QUICK,
            *extra,
        ]
    )


def _metrics(out) -> dict:
    return json.loads((out / "metrics.json").read_text())


def test_glue_far_run_writes_outputs_and_reloads(tiny_model_dir, data, tmp_path, capsys):
    out = tmp_path / "cola"
    assert _glue("cola", tiny_model_dir, data, out, "--method", "far", "--retention", "0.5") == 0
    printed = capsys.readouterr().out
    assert "cola (far): matthews_correlation = " in printed
    record = _metrics(out)
    assert record["task"] == "cola" and record["method"] == "far" and record["retention"] == 0.5
    assert record["steps"] == 2 and record["train_examples"] == 48 and record["eval_examples"] == 24
    for key in ("priming_seconds", "training_seconds", "eval_seconds", "peak_rss_bytes", "trainable_parameters"):
        assert record[key] > 0, key
    assert record["trainable_parameters"] < record["total_parameters"]
    assert set(record["metrics"]) == {"matthews_correlation"}
    lines = (out / "predictions.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction\tlabel" and len(lines) == 25
    assert {line.split("\t")[1] for line in lines[1:]} <= {"acceptable", "unacceptable"}
    assert "far cola (far): model " in (out / "train.log").read_text()

    # The saved FAR model scores the same through `far eval` (task read from its config).
    assert (
        main(
            [
                "eval",
                "--checkpoint",
                str(out / "model"),
                "--data-dir",
                str(data),
                "--output-dir",
                str(tmp_path / "eval"),
            ]
        )
        == 0
    )
    value = record["metrics"]["matthews_correlation"]
    assert f"matthews_correlation = {value:.4f}" in capsys.readouterr().out
    evaluated = json.loads((tmp_path / "eval" / "eval_metrics.json").read_text())
    assert evaluated["metrics"]["matthews_correlation"] == pytest.approx(value, abs=1e-6)
    assert evaluated["far"]["retention"] == 0.5


def test_glue_far_with_split_heads_records_them_and_reloads(tiny_model_dir, data, tmp_path, capsys):
    out = tmp_path / "cola"
    assert _glue("cola", tiny_model_dir, data, out, "--attention-retention", "0.5") == 0
    record = _metrics(out)
    assert record["hyperparameters"]["attention_retention"] == 0.5
    value = record["metrics"]["matthews_correlation"]
    argv = ["eval", "--checkpoint", str(out / "model"), "--data-dir", str(data), "--output-dir", str(tmp_path / "e")]
    assert main(argv) == 0
    evaluated = json.loads((tmp_path / "e" / "eval_metrics.json").read_text())
    assert evaluated["metrics"]["matthews_correlation"] == pytest.approx(value, abs=1e-6)
    assert evaluated["far"]["attention_retention"] == 0.5


def test_glue_runs_are_reproducible_and_methods_differ(tiny_model_dir, data, tmp_path, capsys):
    runs = {}
    for name, args in {
        "a": ["--method", "full"],
        "b": ["--method", "full"],
        "ffn": ["--method", "freeze-ffn"],
        "random": ["--method", "random"],
    }.items():
        assert _glue("stsb", tiny_model_dir, data, tmp_path / name, "--no-save-model", *args) == 0
        runs[name] = _metrics(tmp_path / name)
    assert "stsb (full): pearson = " in capsys.readouterr().out
    assert set(runs["a"]["metrics"]) == {"pearson", "spearmanr"}
    assert runs["a"]["metrics"] == runs["b"]["metrics"]  # same seed, same result
    assert (tmp_path / "a" / "predictions.tsv").read_text() == (tmp_path / "b" / "predictions.tsv").read_text()
    assert runs["a"]["retention"] is None and runs["a"]["trainable_parameters"] == runs["a"]["total_parameters"]
    assert runs["ffn"]["trainable_parameters"] < runs["a"]["trainable_parameters"]
    assert runs["random"]["selection"] == "random" and runs["random"]["priming_steps"] == 0
    assert not (tmp_path / "a" / "model").exists()


def test_glue_mezo(tiny_model_dir, data, tmp_path):
    assert _glue("cola", tiny_model_dir, data, tmp_path / "mezo", "--optimizer", "mezo", "--method", "full") == 0
    record = _metrics(tmp_path / "mezo")
    assert record["optimizer"] == "mezo" and record["hyperparameters"]["lr"] == 1e-5


def test_squad_article_split(tiny_model_dir, data, tmp_path, capsys):
    out = tmp_path / "squad"
    code = main(
        [
            "squad",
            "--model",
            str(tiny_model_dir),
            "--data-dir",
            str(data),
            "--output-dir",
            str(out),
            "--holdout-articles",
            "1",
            "--max-length",
            "32",
            "--doc-stride",
            "8",
            "--method",
            "far",
            *QUICK,
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "squad (far): exact_match = " in printed and "squad (far): f1 = " in printed
    predictions = json.loads((out / "predictions.json").read_text())
    assert set(predictions) == {f"3-{p}-{q}" for p in range(3) for q in range(3)}  # the held-out article
    record = _metrics(out)
    assert record["train_examples"] == 27 and record["eval_examples"] == 9
    assert record["train_features"] > record["train_examples"]  # 32-token windows: several per question
    assert set(record["metrics"]) == {"exact_match", "f1"}


def test_squad_v2_eval_file(tiny_model_dir, data, tmp_path, capsys):
    articles = json.loads((data / "squad" / "dev-v1.1.json").read_text())["data"]
    for article in articles:  # every third question becomes unanswerable
        for paragraph in article["paragraphs"]:
            paragraph["qas"][0].update(answers=[], is_impossible=True)
    (tmp_path / "dev-v2.0.json").write_text(json.dumps({"version": "v2.0", "data": articles}))
    out = tmp_path / "v2"
    argv = [
        *f"squad --version 2.0 --eval-file {tmp_path / 'dev-v2.0.json'} --holdout-articles 2".split(),
        *f"--model {tiny_model_dir} --output-dir {out} --max-length 32 --doc-stride 8".split(),
        *["--method", "random", "--no-save-model", *QUICK],
    ]
    assert main(argv) == 0
    assert "squad_v2 (random): HasAns_f1 = " in capsys.readouterr().out
    record = _metrics(out)
    assert record["task"] == "squad_v2" and record["metrics"]["NoAns_total"] == 6
    odds = json.loads((out / "null_odds.json").read_text())
    assert set(odds) == set(json.loads((out / "predictions.json").read_text())) and len(odds) == 18


@pytest.mark.slow
def test_default_model_on_shared_data(data_dir, minilm_path, tmp_path, capsys):
    """`far glue --task cola` with the embedded MiniLM on the real CoLA files."""
    code = main(
        [
            "glue",
            "--task",
            "cola",
            "--data-dir",
            str(data_dir),
            "--output-dir",
            str(tmp_path),
            "--max-steps",
            "2",
            "--max-train-samples",
            "32",
            "--max-eval-samples",
            "32",
            "--no-save-model",
            "--no-progress",
        ]
    )
    assert code == 0
    assert "cola (far): matthews_correlation = " in capsys.readouterr().out
    assert _metrics(tmp_path)["model"] == "minilm"


@pytest.fixture
def vision_model_dir(tmp_path):
    (tmp_path / "vit").mkdir()
    (tmp_path / "vit" / "config.json").write_text(json.dumps({"model_type": "vit"}))
    return tmp_path / "vit"


@pytest.mark.parametrize(
    "case,argv,message",
    [
        ("unknown task", ["glue", "--task", "foo"], "argument --task: invalid choice: 'foo'"),
        (
            "missing data dir",
            ["glue", "--task", "cola", "--data-dir", "{tmp}/nope"],
            "nope (from --data-dir) does not exist; point --data-dir or $FAR_DATA_DIR",
        ),
        (
            "missing task folder",
            ["glue", "--task", "rte", "--data-dir", "{data}"],
            "no GLUE RTE folder found (the hub is not an option",
        ),
        ("bad columns", ["glue", "--task", "stsb", "--data-dir", "{bad}"], "but GLUE stsb needs ['sentence1'"),
        (
            "model without the head",
            ["glue", "--task", "cola", "--data-dir", "{data}", "--model", "{vit}"],
            "model_type 'vit') has no sequence-classification head",
        ),
        (
            "missing model",
            ["glue", "--task", "cola", "--data-dir", "{data}", "--model", "{tmp}/no-model"],
            "is not an alias (minilm",
        ),
        (
            "bad retention",
            ["glue", "--task", "cola", "--data-dir", "{data}", "--retention", "1.5"],
            "retention must be in (0, 1], got 1.5",
        ),
        (
            "bad attention retention",
            ["glue", "--task", "cola", "--data-dir", "{data}", "--attention-retention", "0"],
            "attention_retention must be in (0, 1], got 0.0",
        ),
        (
            "heads without FAR",
            ["glue", "--task", "cola", "--data-dir", "{data}", "--method", "full", "--attention-retention", "0.5"],
            "method 'full' has none",
        ),
        (
            "squad split conflict",
            ["squad", "--data-dir", "{data}", "--train-file", "{data}/squad/dev-v1.1.json", "--holdout-articles", "2"],
            "not both",
        ),
        ("squad without data", ["squad", "--data-dir", "{tmp}"], "no SQuAD v1.1 file dev-v1.1.json found"),
        (
            "eval without checkpoint",
            ["eval", "--checkpoint", "{tmp}/nothing", "--data-dir", "{data}"],
            "is not a model folder",
        ),
    ],
)
def test_user_errors_exit_2_before_training(case, argv, message, data, vision_model_dir, tmp_path, capsys):
    bad = tmp_path / "bad"
    (bad / "glue" / "STS-B").mkdir(parents=True)
    for split in ("train", "dev"):
        (bad / "glue" / "STS-B" / f"{split}.tsv").write_text("s1\ts2\tscore\na\tb\t1.0\n")
    out = tmp_path / "out"
    fill = dict(tmp=tmp_path, data=data, bad=bad, vit=vision_model_dir)
    argv = [a.format(**fill) for a in argv]
    if argv[0] != "eval":
        argv += ["--output-dir", str(out), *QUICK]
    assert main(argv) == 2, case
    err = capsys.readouterr().err
    assert message in err, err
    assert "Traceback" not in err
    assert f"far {argv[0]}: error: " in err
    assert not out.exists()  # nothing was trained or written


def test_model_loading_aliases_heads_and_seeds(tiny_model_dir, monkeypatch):
    from far.models import MODEL_ALIASES, ModelAlias, check_max_length, load_model_and_tokenizer

    monkeypatch.setitem(MODEL_ALIASES, "ghost", ModelAlias("no_such_package_far", "no-such-package-far"))
    with pytest.raises(ValueError, match="needs the package 'no-such-package-far'.*pip install no-such-package-far"):
        load_model_and_tokenizer("ghost")
    rng_before = torch.get_rng_state()
    model, _ = load_model_and_tokenizer(str(tiny_model_dir), "regression", seed=1)
    assert torch.equal(torch.get_rng_state(), rng_before)  # the head is seeded on a forked RNG
    assert model.config.num_labels == 1 and model.config.problem_type == "regression"
    again, _ = load_model_and_tokenizer(str(tiny_model_dir), "regression", seed=1)
    other, _ = load_model_and_tokenizer(str(tiny_model_dir), "regression", seed=2)
    assert torch.equal(model.classifier.weight, again.classifier.weight)
    assert not torch.equal(model.classifier.weight, other.classifier.weight)
    qa, _ = load_model_and_tokenizer(str(tiny_model_dir), "question-answering", finetuning_task="squad")
    assert type(qa).__name__ == "BertForQuestionAnswering" and qa.config.finetuning_task == "squad"
    with pytest.raises(ValueError, match="exceeds the model's 128 positions; use --max-length 128"):
        check_max_length(model, 384)
    with pytest.raises(ValueError, match="task_kind must be one of"):
        load_model_and_tokenizer(str(tiny_model_dir), "translation")


@pytest.mark.slow  # a fresh process importing transformers' model code: 5-7 CPU s
@pytest.mark.device  # torchao comes with the device extra's executorch
def test_the_command_hides_the_cpu_warnings_torchao_brings_in_with_the_model_code():
    code = (
        "import sys\n"
        "from far.cli.main import main\n"
        "main(['--version'])\n"
        "from transformers import AutoModelForSequenceClassification, BertConfig\n"
        "config = BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16)\n"
        "AutoModelForSequenceClassification.from_config(config)\n"
        "print('torchao' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split()[-1] == "True"  # transformers did import it: the warnings would have shown
    assert "Failed to load" not in done.stderr and "is an Enum subclass" not in done.stderr, done.stderr


def test_loading_says_the_new_head_in_a_line_and_warns_of_a_body_the_checkpoint_lacks(
    tiny_model_dir, tmp_path, caplog, capfd
):
    from safetensors.torch import load_file, save_file

    from far.models import load_model_and_tokenizer

    with caplog.at_level(logging.INFO, logger="far.models.loading"):
        load_model_and_tokenizer(str(tiny_model_dir), "question-answering", seed=3)
    assert "a new question-answering head (qa_outputs.bias, qa_outputs.weight), initialised with seed 3" in caplog.text
    assert "LOAD REPORT" not in capfd.readouterr().err and "lacks" not in caplog.text
    # A checkpoint without one of the body's weights: a warning names it (transformers initialised it at random).
    damaged = tmp_path / "damaged"
    shutil.copytree(tiny_model_dir, damaged)
    weights = load_file(damaged / "model.safetensors")
    gone = next(key for key in weights if "encoder.layer.0.output.dense.weight" in key)
    save_file({k: v for k, v in weights.items() if k != gone}, damaged / "model.safetensors", metadata={"format": "pt"})
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="far.models.loading"):
        load_model_and_tokenizer(str(damaged), "classification", seed=3)
    assert "lacks 1 of the model's own weights (bert.encoder.layer.0.output.dense.weight)" in caplog.text
