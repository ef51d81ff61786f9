"""`--method lora` (Hugging Face PEFT): trains, saves the adapter and the merged model, loads both back alike."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import datasets
import pytest
import torch
from conftest import tiny_model
from conftest import write_rows as write
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from far.cli.main import main
from far.data import load_text_files
from far.methods.lora import LoraSettings, add_lora, load_lora_adapter
from far.models import load_trained_model
from far.recipes import RunSettings, predict, text_files_run, train_and_report
from far.recipes.settings import train_and_eval_splits

pytest.importorskip("peft")

GOOD = "good great lovely fine superb warm".split()
BAD = "bad awful dull boring poor tired".split()
TEXTS = ["good great film", "dull boring poor", "warm fine", "awful"]


def _rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        positive = rng.random() < 0.5
        words = " ".join(rng.choice(GOOD if positive else BAD) for _ in range(4))
        rows.append({"text": words, "label": "positive" if positive else "negative"})
    return rows


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _logits(model, tokenizer) -> torch.Tensor:
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model.eval()(**batch).logits


@pytest.fixture(scope="module")
def lora_run(tiny_model_dir, tmp_path_factory):
    """A LoRA run on the user's own files, from the Python entry point (rank 4, every attention projection)."""
    root = tmp_path_factory.mktemp("lora")
    train, dev = write(root / "t.csv", _rows(32, 0)), write(root / "d.csv", _rows(8, 1))
    settings = RunSettings(
        model=str(tiny_model_dir),
        method="lora",
        lora_r=4,
        lora_alpha=8,
        lora_target_modules=("query", "key", "value"),
        lr=1e-2,
        max_steps=6,
        batch_size=8,
        output_dir=str(root / "run"),
        progress=False,
    )
    run = text_files_run(settings, load_text_files(train, dev))
    record = train_and_report(run)
    return root / "run", record, run.model


def test_lora_run_records_and_saves_both_forms(lora_run, tiny_model_dir):
    out, record, _ = lora_run
    assert record["method"] == "lora" and record["retention"] is None
    assert record["lora"] == {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["key", "query", "value"]}
    # Trainable: A (r x 32) and B (32 x r) on 3 projections x 2 layers, plus the classifier (PEFT's
    # modules_to_save for SEQ_CLS; BERT's pooler stays frozen).
    adapters = 3 * 2 * (4 * 32 + 32 * 4)
    head = 32 * 2 + 2
    assert record["trainable_parameters"] == adapters + head
    assert {p.name for p in (out / "adapter").iterdir()} >= {
        "adapter_config.json",
        "adapter_model.safetensors",
        "config.json",
        "tokenizer.json",
    }
    assert record["adapter_file_bytes"] == (out / "adapter" / "adapter_model.safetensors").stat().st_size
    assert record["adapter_file_bytes"] < record["model_bytes"] / 4
    weights = load_file(out / "adapter" / "adapter_model.safetensors")
    assert any("lora_B" in k for k in weights) and any("classifier" in k for k in weights)
    assert all(v.abs().sum() > 0 for k, v in weights.items() if "lora_B" in k)  # B starts at zero: it trained
    merged = json.loads((out / "model" / "config.json").read_text())
    assert "far" not in merged and merged["architectures"] == ["BertForSequenceClassification"]
    assert merged["id2label"] == {"0": "negative", "1": "positive"}


def test_adapter_and_merged_model_give_the_same_logits(lora_run, tiny_model_dir):
    out, _, trained = lora_run
    tokenizer = AutoTokenizer.from_pretrained(out / "model")
    merged_saved, _ = load_trained_model(out / "model")
    adapter_merged, _ = load_trained_model(out / "adapter")  # onto the base the run named, merged
    adapter_unmerged = load_lora_adapter(out / "adapter", tiny_model_dir, merge=False)
    reference = _logits(trained, tokenizer)  # the run's model, merged in place by the save
    for model in (merged_saved, adapter_merged, adapter_unmerged):
        torch.testing.assert_close(_logits(model, tokenizer), reference, atol=1e-5, rtol=1e-5)
    base = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir)
    assert not torch.allclose(_logits(base, tokenizer), reference, atol=1e-3)  # training changed the outputs
    assert type(merged_saved).__name__ == "BertForSequenceClassification"
    assert not any("lora" in name for name, _ in merged_saved.named_parameters())


def test_predict_reads_the_adapter_folder(lora_run):
    out, _, _ = lora_run
    assert predict(out / "adapter", TEXTS) == predict(out / "model", TEXTS)


def _glue(tiny_model_dir, data_dir, out, *extra) -> int:
    return main(
        [
            *("glue", "--task", "cola", "--model", str(tiny_model_dir), "--data-dir", str(data_dir)),
            *("--output-dir", str(out), "--max-steps", "2", "--batch-size", "8", "--no-progress"),
            *("--max-train-samples", "32", "--max-eval-samples", "16", *extra),
        ]
    )


def test_glue_lora_with_mezo_trains_only_adapters_and_head(tiny_model_dir, data_dir, tmp_path, capsys):
    out = tmp_path / "cola"
    assert _glue(tiny_model_dir, data_dir, out, "--method", "lora", "--optimizer", "mezo", "--lr", "1e-3") == 0
    assert "cola (lora): matthews_correlation = " in capsys.readouterr().out
    record = json.loads((out / "metrics.json").read_text())
    assert record["optimizer"] == "mezo" and record["lora"]["target_modules"] == ["query", "value"]  # PEFT's
    assert record["trainable_parameters"] == 2 * 2 * (8 * 32 + 32 * 8) + 32 * 2 + 2
    # `far eval` on the adapter folder (base loaded, adapter merged) scores what the run scored.
    argv = ["eval", "--checkpoint", str(out / "adapter"), "--data-dir", str(data_dir), "--max-eval-samples", "16"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert f"matthews_correlation = {record['metrics']['matthews_correlation']:.4f}" in printed


def test_squad_lora(tiny_model_dir, data_dir, tmp_path, capsys):
    out = tmp_path / "squad"
    argv = ["squad", "--model", str(tiny_model_dir), "--data-dir", str(data_dir), "--output-dir", str(out)]
    argv += "--method lora --max-train-samples 8 --max-eval-samples 4 --max-length 64 --doc-stride 16".split()
    assert main([*argv, "--max-steps", "2", "--batch-size", "4", "--no-progress"]) == 0
    assert "squad (lora): f1 = " in capsys.readouterr().out
    weights = load_file(out / "adapter" / "adapter_model.safetensors")
    assert any("qa_outputs" in k for k in weights)  # the fresh QA head travels with the adapter


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--method", "lora", "--lora-r", "0"], "lora rank r must be at least 1, got 0"),
        (["--method", "lora", "--lora-dropout", "1"], "lora dropout must be in [0, 1), got 1.0"),
        (["--validation-from-train", "1.5"], "fraction of the training data held out, in (0, 1); got 1.5"),
    ],
)
def test_bad_options_exit_2_before_anything(tiny_model_dir, data_dir, tmp_path, capsys, extra, message):
    out = tmp_path / "out"
    assert _glue(tiny_model_dir, data_dir, out, *extra) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not out.exists()


def test_unknown_target_module_is_refused():
    with pytest.raises(ValueError, match="lora target modules ffn_in are not modules of this Bert.*: .*query"):
        add_lora(tiny_model("bert", num_labels=2), LoraSettings(target_modules=("ffn_in",)))


def test_squad_refuses_validation_from_train(tiny_model_dir, data_dir, tmp_path, capsys):
    argv = ["squad", "--model", str(tiny_model_dir), "--data-dir", str(data_dir), "--output-dir", str(tmp_path / "q")]
    assert main([*argv, "--validation-from-train", "0.2", "--max-steps", "1"]) == 2
    assert "use --holdout-articles instead of --validation-from-train" in capsys.readouterr().err


def test_validation_from_train_holds_out_a_seeded_part():
    train = datasets.Dataset.from_dict({"idx": list(range(100))})
    dev = datasets.Dataset.from_dict({"idx": [1000, 1001]})
    fit, held = train_and_eval_splits(RunSettings(validation_from_train=0.2, seed=3), train, dev)
    assert len(fit) == 80 and len(held) == 20 and not set(fit["idx"]) & set(held["idx"])
    again, _ = train_and_eval_splits(RunSettings(validation_from_train=0.2, seed=3), train, dev)
    other, _ = train_and_eval_splits(RunSettings(validation_from_train=0.2, seed=4), train, dev)
    assert fit["idx"] == again["idx"] and fit["idx"] != other["idx"]
    small, held = train_and_eval_splits(RunSettings(validation_from_train=0.2, max_train_samples=10), train, dev)
    assert len(small) == 10 and len(held) == 20
    assert train_and_eval_splits(RunSettings(), train, dev)[1]["idx"] == [1000, 1001]


@pytest.mark.slow
def test_far_imports_without_peft():
    # PEFT is imported by the LoRA functions only: `import far` and `far.recipes` (and the CLI) work without it.
    code = (
        "import sys; sys.modules['peft'] = None\n"
        "import far, far.recipes, far.cli.main\n"
        "from far.methods.lora import add_lora, LoraSettings\n"
        "from conftest import tiny_model\n"
        "try:\n"
        "    add_lora(tiny_model('bert', 2), LoraSettings())\n"
        "except ModuleNotFoundError as e:\n"
        "    print(e)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="tests", check=True)
    assert "needs Hugging Face PEFT; install it with: pip install 'peft>=0.21,<0.22'" in result.stdout
