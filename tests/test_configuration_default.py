"""FAR's automatic configuration is the default of `--method far`; the paper's is one flag (or a preset) away.

The default comes from one place (`far.recipes.configuration.choose_configuration`), read by the
command line and recorded in every run's metrics.json; `far.FARConfig.auto()` and
`far.finetune(config="auto")` give the same surgery in Python.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_batch, tiny_model

import far
from far.cli.main import build_parser, main
from far.recipes.configuration import UNGIVEN, choose_configuration

AUTO_FIELDS = {"retention": "auto", "freeze_embeddings": True, "freeze_layers": "auto", "cache_frozen": True}
PAPER_FIELDS = {"retention": 0.4, "freeze_embeddings": False, "freeze_layers": None, "cache_frozen": False}


def _parsed(*argv: str):
    return build_parser().parse_args(list(argv))


def _chosen(args) -> tuple[dict, str]:
    given = {name: getattr(args, name) for name in UNGIVEN}
    fields, configuration = choose_configuration(
        given, preset=args.preset, method=args.method, model=args.model, memory_budget=args.memory_budget
    )
    return fields, configuration.name


@pytest.mark.parametrize("command", [["glue", "--task", "cola"], ["train", "--train-file", "t.csv"], ["squad"]])
def test_help_defaults_resolve_to_the_automatic_configuration(command):
    args = _parsed(*command)  # every flag at the default `far <command> --help` shows
    assert args.method == "far" and args.preset is None and args.group_by_length is False
    assert _chosen(args) == (AUTO_FIELDS, "auto")


def test_a_number_gives_the_fixed_retention_and_nothing_else_frozen():
    assert _chosen(_parsed("glue", "--task", "cola", "--retention", "0.4")) == (PAPER_FIELDS, "paper")
    fields, name = _chosen(_parsed("glue", "--task", "cola", "--retention", "0.2", "--freeze-layers", "2"))
    assert name == "custom" and fields == {**PAPER_FIELDS, "retention": 0.2, "freeze_layers": 2}


def test_the_presets_and_a_flag_beside_them():
    assert _chosen(_parsed("glue", "--task", "cola", "--preset", "paper")) == (PAPER_FIELDS, "paper")
    assert _chosen(_parsed("glue", "--task", "cola", "--preset", "auto")) == (AUTO_FIELDS, "auto")
    fields, name = _chosen(_parsed("glue", "--task", "cola", "--no-cache-frozen"))
    assert name == "custom" and fields == {**AUTO_FIELDS, "cache_frozen": False}
    # No frozen bottom, none to keep.
    fields, _ = _chosen(_parsed("glue", "--task", "cola", "--freeze-layers", "0"))
    assert fields == {**AUTO_FIELDS, "freeze_layers": 0, "cache_frozen": False}


def test_the_old_explicit_flags_give_the_automatic_configuration():
    flags = ["--retention", "auto", "--freeze-embeddings", "--freeze-layers", "auto", "--cache-frozen"]
    args = _parsed("glue", "--task", "cola", *flags)
    assert _chosen(args) == (AUTO_FIELDS, "auto")


@pytest.mark.parametrize(
    "argv, fields",
    [
        (["--method", "full"], {**PAPER_FIELDS, "retention": None}),
        (["--method", "far", "--memory-budget", "600"], PAPER_FIELDS),  # planned for a fixed retention
        (["--model", "smollm2-135m"], {**PAPER_FIELDS, "retention": None}),  # the lean runtime's own default
    ],
)
def test_where_the_automatic_configuration_does_not_apply(argv, fields):
    assert _chosen(_parsed("glue", "--task", "sst2", *argv))[0] == fields


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--method", "full", "--preset", "auto"], "use it with --method far"),
        (["--preset", "auto", "--memory-budget", "600"], "use --preset paper with it"),
        (["--model", "smollm2-135m", "--preset", "paper"], "drop --preset"),
    ],
)
def test_a_preset_where_it_cannot_apply_is_refused(argv, message):
    with pytest.raises(ValueError, match=message):
        _chosen(_parsed("glue", "--task", "sst2", *argv))


def test_the_python_names_give_the_same():
    assert far.FARConfig.auto() == far.FARConfig(retention="auto", freeze_embeddings=True, freeze_layers="auto")
    assert far.FARConfig.paper() == far.FARConfig(retention=0.4) == far.FARConfig()
    assert far.FARConfig.preset("auto", seed=3) == far.FARConfig.auto(seed=3)
    assert far.FARConfig.auto().freezes_depth and not far.FARConfig.paper().freezes_depth
    with pytest.raises(ValueError, match="'auto', 'paper'"):
        far.FARConfig.preset("fast")


def _examples(n: int = 8) -> list[dict]:
    batch = tiny_batch()
    return [{k: v[i % len(v)] for k, v in batch.items()} | {"labels": torch.tensor(i % 3)} for i in range(n)]


def test_finetune_config_auto(tmp_path):
    model = tiny_model("bert")
    result = far.finetune(model, _examples(), "auto", max_steps=4, batch_size=4, priming=1, progress=False)
    assert far.get_config(model) == far.FARConfig.auto()
    assert result.steps == 4
    with pytest.raises(ValueError, match="config='paper'"):
        far.finetune(tiny_model("bert"), _examples(), "auto", max_steps=4, memory_budget=2000.0, progress=False)
    with pytest.raises(TypeError, match="names no configuration"):
        far.finetune(tiny_model("bert"), _examples(), "fast", max_steps=4, progress=False)


def test_a_tiny_runs_metrics_record_the_configuration(tiny_model_dir, data_dir, tmp_path, capsys):
    few = ["--max-steps", "4", "--max-train-samples", "32", "--max-eval-samples", "16", "--no-progress"]
    base = ["glue", "--task", "sst2", "--model", str(tiny_model_dir), "--data-dir", str(data_dir), *few]
    assert main([*base, "--output-dir", str(tmp_path / "default"), "--no-save-model"]) == 0
    assert "configuration: auto (default of --method far)" in capsys.readouterr().out
    chosen = json.loads((tmp_path / "default" / "metrics.json").read_text())["configuration"]
    assert chosen["name"] == "auto" and chosen["why"] == "default of --method far"
    assert chosen["retention"] == "auto" and chosen["freeze_embeddings"] and chosen["cache_frozen"]
    assert isinstance(chosen["frozen_layers"], int)  # the depth priming chose
    assert main([*base, "--output-dir", str(tmp_path / "paper"), "--retention", "0.4", "--no-save-model"]) == 0
    record = json.loads((tmp_path / "paper" / "metrics.json").read_text())
    assert record["configuration"]["name"] == "paper" and record["retention"] == 0.4
    assert record["frozen_layers"] == 0 and not record["hyperparameters"]["cache_frozen"]
