"""Precision: which one "auto" picks from a CPU's flags, and bf16 autocast against fp32 on a reconfigured model.

The parity tests run on every CPU: bf16 autocast computes the same thing as fp32, rounded. Where the CPU emulates
bf16 they are slower, not different.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from conftest import load_experiment, tiny_batch, tiny_examples, tiny_model, write_rows
from torch import nn

import far
from far.cli.common import settings_from
from far.cli.main import build_parser
from far.data import load_text_files
from far.layers import SplitLinear
from far.recipes import glue_run, squad_run, text_files_run
from far.recipes.runs import SquadSettings
from far.recipes.settings import GLUE_DEFAULTS
from far.training.options import TrainOptions
from far.training.precision import (
    choose_precision,
    native_bf16_cpu,
    parse_cpu_flags,
    read_cpu_flags,
)

CPU = torch.device("cpu")
# Abridged /proc/cpuinfo texts: an AVX2-only AMD EPYC, Zen 4 with AVX-512 BF16, Sapphire Rapids with AMX, an Arm core.
AVX2_ONLY = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B12
flags\t\t: fpu vme sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi1 bmi2
bugs\t\t: sysret_ss_attrs
"""
AVX512_BF16 = AVX2_ONLY.replace("avx2 bmi1", "avx2 avx512f avx512bw avx512_bf16 avx512_vnni bmi1")
AMX = AVX2_ONLY.replace("avx2 bmi1", "avx2 avx512f amx_bf16 amx_tile amx_int8 bmi1")
ARM = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics bf16\n"
# bf16 keeps 8 bits of mantissa (a relative rounding error of 2^-9 per value); a tiny model's logits pass through a
# few dozen rounded products, so they agree with fp32 to a few hundredths, not to fp32's 1e-6.
BF16_ATOL = 5e-2


def test_flags_are_parsed_from_cpuinfo():
    assert {"avx2", "fma"} <= parse_cpu_flags(AVX2_ONLY)
    assert "avx512_bf16" in parse_cpu_flags(AVX512_BF16)
    assert "amx_bf16" in parse_cpu_flags(AMX)
    assert "bf16" in parse_cpu_flags(ARM)
    assert parse_cpu_flags("processor\t: 0\n") == frozenset()


def test_native_bf16_from_flags():
    assert not native_bf16_cpu(parse_cpu_flags(AVX2_ONLY))
    assert native_bf16_cpu(parse_cpu_flags(AVX512_BF16))
    assert native_bf16_cpu(parse_cpu_flags(AMX))
    assert not native_bf16_cpu(parse_cpu_flags(ARM))  # Arm's bf16 is not measured here: fp32 by default


def test_auto_picks_fp32_on_avx2_and_bf16_where_native():
    avx2 = choose_precision("auto", CPU, cpu_flags=parse_cpu_flags(AVX2_ONLY))
    assert (avx2.name, avx2.requested, avx2.bf16) == ("fp32", "auto", False)
    assert "no native bf16" in avx2.reason
    native = choose_precision("auto", CPU, cpu_flags=parse_cpu_flags(AVX512_BF16))
    assert (native.name, native.bf16) == ("bf16", True)
    assert "avx512_bf16" in native.reason
    assert choose_precision("auto", CPU, cpu_flags=parse_cpu_flags(AMX)).name == "bf16"
    assert choose_precision("auto", torch.device("meta")).name == "fp32"


def test_an_explicit_precision_is_taken_as_it_is():
    for name in ("fp32", "bf16"):
        chosen = choose_precision(name, CPU, cpu_flags=parse_cpu_flags(AVX2_ONLY))
        assert (chosen.name, chosen.requested) == (name, name)
        assert chosen.to_dict() == {"name": name, "requested": name, "reason": f"{name} was asked for"}


def test_this_machine_is_read(tmp_path):
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():  # Linux: the first processor's flags, as the file lists them
        keys = ("flags", "Features")  # x86's, Arm's
        first = next(line for line in cpuinfo.read_text().splitlines() if line.split(":")[0].strip() in keys)
        assert read_cpu_flags() == frozenset(first.partition(":")[2].split()) != frozenset()
    else:
        assert read_cpu_flags() is None
    assert read_cpu_flags(tmp_path / "no-cpuinfo") is None
    (tmp_path / "cpuinfo").write_text(AVX512_BF16)
    listed = "fpu vme sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 avx512f avx512bw avx512_bf16 avx512_vnni bmi1 bmi2"
    assert read_cpu_flags(tmp_path / "cpuinfo") == frozenset(listed.split())


def test_bad_precisions_are_refused_with_the_choices():
    with pytest.raises(ValueError, match="precision must be one of 'auto', 'fp32', 'bf16', got 'fp16'"):
        choose_precision("fp16", CPU)
    with pytest.raises(ValueError, match="precision must be one of"):
        TrainOptions(precision="half")
    with pytest.raises(ValueError, match="give one"):
        TrainOptions(bf16=True, precision="fp32")
    assert TrainOptions(bf16=True).requested_precision == "bf16"
    # A library call computes the same on every machine unless asked: fp32 by default.
    assert TrainOptions().requested_precision == "fp32"
    assert TrainOptions(precision="auto").requested_precision == "auto"


def _reconfigured(seed: int = 0) -> torch.nn.Module:
    model = tiny_model("bert", seed=seed)
    far.reconfigure(model, 0.4, selection="random", seed=seed, freeze_embeddings=True)
    return model.train()


def _loss_and_logits(model: torch.nn.Module, batch: dict, bf16: bool) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = model(**batch)
    return out.loss.float(), out.logits.float()


def test_bf16_autocast_matches_fp32_and_trains_only_learners():
    model = _reconfigured()
    model.eval()  # no dropout: the two passes must see the same network
    batch = {**tiny_batch(batch=4, length=9), "labels": torch.tensor([0, 1, 2, 1])}
    loss32, logits32 = _loss_and_logits(model, batch, bf16=False)
    loss32.backward()
    fp32_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    loss16, logits16 = _loss_and_logits(model, batch, bf16=True)
    loss16.backward()
    assert logits16.dtype == torch.float32
    torch.testing.assert_close(logits16, logits32, atol=BF16_ATOL, rtol=0)
    torch.testing.assert_close(loss16, loss32, atol=BF16_ATOL, rtol=0)
    bf16_grads = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            assert param.grad is None, f"{name} is frozen and got a gradient"
            continue
        assert param.grad is not None and param.grad.dtype == torch.float32, name  # fp32 master weights' gradients
        bf16_grads[name] = param.grad
    assert bf16_grads.keys() == fp32_grads.keys()
    # The gradients agree with fp32's to bf16's precision, measured against the largest gradient (some tensors,
    # e.g. the key bias that softmax ignores, have a gradient of rounding noise alone).
    scale = max(float(g.abs().max()) for g in fp32_grads.values())
    for name, grad in bf16_grads.items():
        torch.testing.assert_close(grad, fp32_grads[name], atol=BF16_ATOL * scale, rtol=0, msg=name)
    whole16, whole32 = (torch.cat([g.flatten() for g in grads.values()]) for grads in (bf16_grads, fp32_grads))
    assert torch.nn.functional.cosine_similarity(whole16, whole32, dim=0) > 0.99
    split = [m for m in model.modules() if isinstance(m, SplitLinear)]
    assert split and all(m.learner_weight.grad is not None and m.frozen_weight.grad is None for m in split)


def test_bf16_steps_move_learners_and_leave_frozen_weights_bit_for_bit():
    model = _reconfigured(seed=1)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    learners = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    batch = {**tiny_batch(batch=4, length=9), "labels": torch.tensor([0, 1, 2, 1])}
    for _ in range(3):
        loss, _ = _loss_and_logits(model, batch, bf16=True)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    for name, param in model.named_parameters():
        assert param.dtype == torch.float32, name  # autocast casts products' operands, never the parameters
        if name in frozen:
            assert torch.equal(param, frozen[name]), f"{name} is frozen and moved"
    assert all(not torch.equal(model.get_parameter(n), before) for n, before in learners.items() if "learner" in n)


def _finetune(precision: str | None, **keywords) -> tuple[torch.nn.Module, far.FinetuneResult]:
    model = tiny_model("bert", seed=2)
    config = far.FARConfig(retention=0.4, freeze_embeddings=True, seed=2)
    result = far.finetune(
        model,
        tiny_examples(),
        config,
        lr=1e-2,
        max_steps=3,
        batch_size=8,
        precision=precision,
        progress=False,
        **keywords,
    )
    return model, result


@pytest.mark.slow
def test_finetune_records_the_precision_and_bf16_stays_close_to_fp32():
    model32, result32 = _finetune("fp32")
    model16, result16 = _finetune("bf16")
    assert result32.precision == {"name": "fp32", "requested": "fp32", "reason": "fp32 was asked for"}
    assert result16.precision["name"] == "bf16"
    batch = tiny_batch(batch=4, length=9)
    with torch.no_grad():
        logits32, logits16 = model32.eval()(**batch).logits, model16.eval()(**batch).logits
    # Three steps at lr 1e-2 from the same start on the same batches: the runs part by bf16's rounding only.
    torch.testing.assert_close(logits16, logits32, atol=0.15, rtol=0)


@pytest.mark.slow
def test_finetune_auto_is_fp32_on_an_avx2_only_cpu(monkeypatch, tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(AVX2_ONLY)
    monkeypatch.setattr("far.training.precision.CPUINFO", cpuinfo)
    _, result = _finetune("auto")
    assert result.precision["name"] == "fp32" and result.precision["requested"] == "auto"
    cpuinfo.write_text(AVX512_BF16)
    _, result = _finetune("auto")
    assert result.precision["name"] == "bf16"
    _, forced = _finetune(None, bf16=True)  # the older flag is precision="bf16"
    assert forced.precision["requested"] == "bf16"
    _, default = _finetune(None)
    assert default.precision["name"] == "fp32"


def test_the_command_line_asks_for_fp32_unless_told_and_bf16_still_means_bf16():
    def requested(*flags: str) -> str:
        args = build_parser("glue").parse_args(["glue", "--task", "cola", *flags])
        settings = settings_from(args)
        return settings.train_options(settings.hyperparameters(GLUE_DEFAULTS)).requested_precision

    # fp32 unless asked: bf16 autocast is faster where native but has not kept CoLA's metric (docs/results.md).
    assert requested() == "fp32"
    assert requested("--precision", "auto") == "auto"
    assert requested("--bf16") == "bf16"
    with pytest.raises(SystemExit):
        requested("--precision", "fp16")


def test_the_benchmark_stores_only_wholly_frozen_weights_in_bf16_and_pairs_its_ratios():
    bench = load_experiment("bench_bf16")
    model = tiny_model("bert")
    far.reconfigure(model, 0.4, selection="random", freeze_embeddings=True, freeze_layers=1)
    bench.store_frozen_bf16(model)
    for name, param in model.named_parameters():
        owner = model.get_submodule(name.rsplit(".", 1)[0])
        wholly_frozen = not any(p.requires_grad for p in owner.parameters(recurse=False))
        expected = torch.bfloat16 if wholly_frozen and isinstance(owner, (nn.Linear, nn.Embedding)) else torch.float32
        assert param.dtype == expected, name
    assert any(p.dtype == torch.bfloat16 for p in model.parameters())
    far_fp32, far_bf16 = bench.arm_name(bench.FAR, "fp32"), bench.arm_name(bench.FAR, "bf16")
    times = {
        "full fp32": [2.0, 4.0],
        "full bf16": [1.0, 2.0],
        far_fp32: [1.6, 3.2],
        far_bf16: [0.8, 1.0],
    }
    rows = bench.summarize(times)
    assert rows[far_fp32]["paired_ratio_to_full_same_precision"] == pytest.approx(0.8)
    assert rows[far_bf16]["paired_ratio_to_far_fp32"] == pytest.approx((0.5 + 1.0 / 3.2) / 2)
    assert rows[far_bf16]["paired_ratio_to_full_same_precision"] == pytest.approx((0.8 + 0.5) / 2)


@pytest.mark.parametrize("flags", [("--precision", "bf16"), ("--bf16",), ("--precision", "auto"), ()])
def test_every_evaluator_computes_in_the_training_precision(tmp_path, tiny_model_dir, data_dir, flags):
    rows = [{"text": f"{word} film", "label": word} for word in ("good", "bad") * 4]
    train, dev = write_rows(tmp_path / "t.csv", rows), write_rows(tmp_path / "d.csv", rows)
    common = [
        "--model",
        str(tiny_model_dir),
        "--max-steps",
        "1",
        "--max-eval-samples",
        "4",
        "--max-length",
        "64",
        *flags,
    ]
    files = settings_from(
        build_parser("train").parse_args(["train", "--train-file", str(train), "--validation-file", str(dev), *common])
    )
    glue = settings_from(
        build_parser("glue").parse_args(["glue", "--task", "cola", "--data-dir", str(data_dir), *common])
    )
    squad = settings_from(build_parser("squad").parse_args(["squad", "--data-dir", str(data_dir), *common]))
    runs = {
        "far train": text_files_run(files, load_text_files(train, dev)),
        "far glue": glue_run(dataclasses.replace(glue, max_train_samples=4), "cola"),
        "far squad": squad_run(dataclasses.replace(squad, max_train_samples=4), SquadSettings(doc_stride=16)),
    }
    for command, run in runs.items():
        trains_in = choose_precision(run.settings.train_options(run.hyperparameters).requested_precision, CPU)
        assert run.evaluator.bf16 == trains_in.bf16, command
    if "bf16" in " ".join(flags):
        assert all(run.evaluator.bf16 for run in runs.values())
