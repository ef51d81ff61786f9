"""`far export`: merge to a plain Hugging Face folder (with tokenizer), or extract the learners."""

from __future__ import annotations

import argparse
import importlib.util
import json

import pytest
import torch
from conftest import tiny_model
from test_learners_file import logits, trained
from transformers import AutoModelForSequenceClassification, AutoTokenizer, BertTokenizer

import far
from far.cli import export
from far.cli.export import _micro_batch
from far.cli.main import build_parser

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "far", "world"]


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="far")
    export.register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["export", *argv])


@pytest.fixture
def checkpoint(tmp_path):
    """A FAR checkpoint folder of a trained tiny BERT, with a tokenizer; and the trained model."""
    model = trained()
    far.save_pretrained(model, tmp_path / "ckpt")
    BertTokenizer(vocab={w: i for i, w in enumerate(WORDS)}).save_pretrained(tmp_path / "ckpt")
    return tmp_path / "ckpt", model


def test_merge_writes_a_plain_folder_with_the_tokenizer(checkpoint, tmp_path, capsys):
    ckpt, model = checkpoint
    out = tmp_path / "plain"
    args = parse(["--checkpoint", str(ckpt), "--merge", str(out)])
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert f"wrote a plain Hugging Face model to {out}" in printed and "tokenizer.json" in printed
    size = sum(p.stat().st_size for p in out.iterdir())
    assert f"size: {size:,} bytes" in printed
    assert "far" not in json.loads((out / "config.json").read_text())
    loaded = AutoModelForSequenceClassification.from_pretrained(out).eval()
    assert torch.equal(logits(loaded), logits(far.restore(model)))
    text = "hello far world"
    assert AutoTokenizer.from_pretrained(out)(text)["input_ids"] == [2, 5, 6, 7, 3]
    assert AutoTokenizer.from_pretrained(out)(text) == AutoTokenizer.from_pretrained(ckpt)(text)


def test_learners_only_writes_a_file_that_loads_onto_the_base(checkpoint, tmp_path, capsys):
    ckpt, model = checkpoint
    out = tmp_path / "user.safetensors"
    args = parse(["--checkpoint", str(ckpt), "--learners-only", str(out)])
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    full = (ckpt / "model.safetensors").stat().st_size
    assert f"wrote the learners-only file {out}" in printed
    assert f"size: {out.stat().st_size:,} bytes" in printed and f"full checkpoint's {full:,} bytes" in printed
    base = far.load_learners(tiny_model(), out)
    assert torch.equal(logits(base), logits(model))


def test_bad_arguments_are_refused_before_anything_is_written(checkpoint, tmp_path):
    ckpt, _ = checkpoint
    with pytest.raises(ValueError, match="is not a model folder"):
        export.run(parse(["--checkpoint", str(tmp_path / "none"), "--merge", str(tmp_path / "out")]))
    with pytest.raises(ValueError, match="must name a new folder, not the checkpoint itself"):
        export.run(parse(["--checkpoint", str(ckpt), "--merge", str(ckpt)]))
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file; name a folder"):
        export.run(parse(["--checkpoint", str(ckpt), "--merge", str(tmp_path / "file")]))
    with pytest.raises(ValueError, match="is a folder; name a .safetensors file"):
        export.run(parse(["--checkpoint", str(ckpt), "--learners-only", str(tmp_path)]))
    tiny_model().save_pretrained(tmp_path / "plain")
    with pytest.raises(ValueError, match="holds a plain model, with no FAR learners to export"):
        export.run(parse(["--checkpoint", str(tmp_path / "plain"), "--learners-only", str(tmp_path / "l.st")]))
    assert not (tmp_path / "out").exists() and not (tmp_path / "l.st").exists()
    with pytest.raises(SystemExit) as exit_info:  # argparse: exactly one of --merge / --learners-only
        parse(["--checkpoint", str(ckpt), "--merge", "a", "--learners-only", "b"])
    assert exit_info.value.code == 2


@pytest.mark.skipif(importlib.util.find_spec("far.cli.main") is None, reason="far/cli/main.py not there yet")
def test_console_entry_point_reports_user_errors(tmp_path, capsys):
    from far.cli.main import main

    try:
        code = main(["export", "--checkpoint", str(tmp_path / "none"), "--merge", str(tmp_path / "out")])
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2
    assert "far export: error:" in capsys.readouterr().err


@pytest.mark.parametrize(
    "given,micro,level",
    [
        ([], 8, "none"),
        (["--batch-size", "12"], 12, "none"),
        (["--micro-batch-size", "4", "--xnnpack", "all"], 4, "all"),
    ],
)
def test_the_device_export_defaults_to_micro_batches_and_a_lowering_that_finishes(given, micro, level):
    """Defaults that finish: no delegate (seconds to export, not ten minutes) and passes of 8 examples."""
    args = build_parser().parse_args(["export", "--checkpoint", "ckpt", "--executorch", "out", *given])
    assert (_micro_batch(args), args.xnnpack) == (micro, level)
