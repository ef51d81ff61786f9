"""FAR trained on ExecuTorch (far.device, runtime/executorch/far_train) against torch: step time, memory, metric.

    python experiments/device_train.py --part step      # step time: far_train vs torch eager, 32x64 and 8x128
    python experiments/device_train.py --part memory    # far_train's whole-process peak RSS on CoLA, batch 32
    python experiments/device_train.py --part metric --task cola   # device-trained vs far glue, same settings
    python experiments/device_train.py --part metric --task sst2
    python experiments/device_train.py --part lm-export  # far export --executorch --model smollm2-135m, once
    python experiments/device_train.py --part lowering --rounds 2 --steps 5   # every --xnnpack level (or --levels)
    python experiments/device_train.py --part bound      # the least a runtime must keep: torch's count, no runner
    python experiments/device_train.py --part lm-memory --export-dir OUT   # far_train on a causal LM's export
    python experiments/device_train.py --part lm-step --export-dir OUT --rounds 2 --steps 3   # vs the lean step
    python experiments/device_train.py --part lm-plan --layers 4   # what train.pte's memory plan holds, by kind
    python experiments/device_train.py --part lm-generate   # far_generate against far generate, SmolLM2

The configuration: all-MiniLM-L6-v2 (the embedded package), FAR r=0.2 with the embeddings
and the bottom 2 layers frozen (so the export has a forward-only bottom.pte and a train.pte over layers
2-5 and the head), AdamW (lr 1e-4, clipping at 1.0, far's linear schedule), one thread everywhere.
Build the runner first: `bash runtime/executorch/build.sh`. Each part writes
experiments/results/device_train/<part>[_<task>].json with the machine's lscpu flags.

- step: exports at 32x64 and 8x128 (XNNPACK "all"; 32x64 also as 4 micro-batches of 8 and 8 of 4), random
  full-length examples; far_train (one process per measurement, /usr/bin/time -v) and torch eager's
  AdamW step on the same reconfigured model and batches (a child process, eval mode: no dropout, as
  exported), alternating, `--rounds` each; medians of the steps after the first.
- memory: CoLA's training set written for exports of batch 32 in micro-batches of 32, 8 and 4;
  far_train trains `--steps` steps under /usr/bin/time -v.
- metric: `far glue --task T` with the settings above runs in this process in fp32, the device program's
  precision (far.finetune, checkpoint at the end of priming; its result goes on file before the device
  stage starts); the checkpoint there (priming done, FFNs split) is exported, and far_train
  trains the rest of the run's steps with the rest of its schedule; the state comes back as a learners
  file on the stock model and far's own evaluator scores it on the same dev set. Differences by design:
  the device program runs without dropout, and takes its batches in far.device's order at a fixed
  64 tokens.
- lm-export: `far export --executorch OUT --model smollm2-135m` (far train's text defaults, learners by
  magnitude) in a child process with one thread under /usr/bin/time -v: wall and CPU seconds, peak RSS, the
  files' sizes and each program's planned memory (the manifest's `planned_bytes`). Needs no runner.
- lowering: for each XNNPACK level of the training program (none, matmul, all), MiniLM with random learners
  exported at 32x64 in one pass, in a child process with one thread under /usr/bin/time -v (wall and CPU
  seconds, peak RSS, the files' sizes, planned memory); then far_train and torch eager's AdamW step on random
  full-length examples as in the step part, alternating, `--rounds` each, in CPU seconds (which the load of a
  shared machine moves less than wall seconds, though far_train's more than eager's): far_train's steps after
  the first are the CPU of a process of `--steps` steps less one of the first step alone, eager's the thread's
  CPU time of each step after the first.
- lm-memory: far_train (`--runner`, default the build's) on the first 16 training and 8 held-out chunks of
  an export folder's text.safetensors (`far export --executorch OUT --model smollm2-135m --train-file DIR`),
  written with far.device.lm_text.write_chunks, one epoch, a checkpoint every 2 steps, one thread, under
  /usr/bin/time -v: peak RSS, CPU seconds, the held-out perplexities it printed, and what a step holds at
  the least as the manifest counts it (the training program's planned memory, the optimizer's two moments,
  the micro-batches' gradient sum, the training program's file less the trained tensors' initial values,
  which are read once). `--label` names the result file (lm_memory_LABEL.json).
- lm-step: on an export folder with its texts, far_train (`--runner`) and the lean runtime's AdamW step
  (far.llm.text_steps.TextSteps, a child process with OMP_NUM_THREADS=1, on the stock GGUF model laid out as the
  export says: far.device.lm_to_learners of its state, then reconfigure_from_learners) on the same first
  `batch_size * --steps` training chunks, the same batches (far.device's order) and micro-batches, the frozen
  bottom's output of every chunk computed before the first step by both; alternating, `--rounds` each; a
  micro-batch's wall and CPU seconds (far_train's `cpu_s`, the lean child's thread time), medians of the steps
  after each run's first, their ratio, and the first step's loss on both. `--label` names the result file
  (lm_step_LABEL.json).
- lm-plan: SmolLM2-135M cut to its first `--layers` layers (the bottom two thirds frozen, as the export lays
  it out), its training program lowered at one chunk of 256 tokens with and without recomputation in backward
  (far.device.recompute): the planned bytes and, at the instruction where most memory is live, the live
  tensors by the operator that made them (views, which share their base's memory, left out).
- lm-generate: `far export --executorch OUT --model smollm2-135m --generate` (a cache of --max-length 256
  positions) under /usr/bin/time -v, then `far_generate` (one thread) on a fixed prompt with the export's state,
  32 new tokens, and `far generate` (the lean runtime, one thread) on the same prompt, each under /usr/bin/time
  -v: the export's seconds and sizes, far_generate's tokens per second (it prints them) and both peak RSS, and
  whether both wrote the same text; the lean runtime's tokens per second after its first token, in this process.
- bound: in this process, the bytes torch's autograd keeps for backward on the reconfigured model (eval mode, eager
  attention: the programs' explicit softmax) at 64 tokens and batches of 32, 8 and 4 (step_memory's
  saved-tensors count), the trained layers' frozen weights and the trainable tensors' bytes. Needs no runner.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness import peak_rss_mib

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "device_train"
RUNNER = ROOT / "runtime" / "executorch" / "build" / "far_train"
FAR_CONFIG = dict(retention=0.2, freeze_embeddings=True, freeze_layers=2)
LR, CLIP = 1e-4, 1.0


def cpu_flags() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = re.search(r"Model name:\s*(.*)", out)
    flags = re.search(r"Flags:\s*(.*)", out)
    keep = sorted(f for f in (flags.group(1).split() if flags else []) if re.match(r"avx|amx|fma|f16c", f))
    return f"{model.group(1).strip() if model else platform.processor()}; {' '.join(keep)}"


def read_result(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text())


def write_result(name: str, record: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    record = {"machine": cpu_flags(), "cores": os.cpu_count(), "command": " ".join(sys.argv), **record}
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}")
    return path


def reconfigured_minilm(selection: str = "random"):
    import far
    from far.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer("minilm", "classification", num_labels=2)
    far.reconfigure(model, far.FARConfig(selection=selection, **FAR_CONFIG))
    return model, tokenizer


def export(out: Path, batch: int, length: int, micro: int | None = None, xnnpack: str = "all", model=None, **opt):
    """Export (or reuse) a folder; the model defaults to MiniLM reconfigured with random learners (timing only)."""
    from far.device.export import export_executorch

    if (out / "manifest.json").is_file():
        return {"reused": str(out)}
    if model is None:
        model, tokenizer = reconfigured_minilm()
    else:
        model, tokenizer = model
    settings = dict(optimizer="adamw", lr=LR, max_grad_norm=CLIP) | opt
    start = time.perf_counter()
    result = export_executorch(
        model, tokenizer, out, batch_size=batch, micro_batch_size=micro, max_length=length, xnnpack=xnnpack, **settings
    )
    return {"export_s": round(time.perf_counter() - start, 1), "sizes": result.sizes}


def random_examples(path: Path, n: int, manifest: dict) -> None:
    """n full-length examples of random tokens, laid out as far.device.write_examples writes them."""
    import torch
    from safetensors.torch import save_file

    length = int(manifest["max_length"])
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1000, int(manifest["vocab_size"]), (n, length), generator=g)
    ids[:, 0] = 101
    tensors = {
        "input_ids": ids,
        "attention_mask": torch.ones(n, length, dtype=torch.long),
        "token_type_ids": torch.zeros(n, length, dtype=torch.long),
        "labels": torch.randint(0, 2, (n,), generator=g),
    }
    metadata = {
        "format": "far.device.examples",
        "format_version": "1",
        "max_length": str(length),
        "num_labels": "2",
        "base_fingerprint": manifest["base_fingerprint"],
        "truncated": "0",
    }
    save_file(tensors, path, metadata=metadata)


def run_runner(out: Path, examples: Path, work: Path, *extra: str) -> dict:
    state = work / "state.safetensors"
    shutil.copy(out / "state.safetensors", state)
    cmd = ["/usr/bin/time", "-v", str(RUNNER), str(out), "--examples", str(examples), "--state", str(state)]
    cmd += ["--threads", "1", *extra]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(done.stdout + done.stderr)
    steps = [dict(w.split("=") for w in line.split()) for line in done.stdout.splitlines() if line.startswith("step=")]
    times = [float(s["time_s"]) for s in steps]
    return {
        "command": " ".join(cmd[2:]),
        "step_s": round(statistics.median(times[1:]), 4) if len(times) > 1 else None,
        "steps": len(times),
        "cpu_s": round(cpu_seconds(done.stderr), 2),
        "last_loss": float(steps[-1]["loss"]),
        "peak_rss_MiB": peak_rss_mib(done.stderr),
        "process_s": round(time.perf_counter() - start, 1),
        "plan": done.stdout.splitlines()[0],
    }


def cpu_seconds(time_v_stderr: str) -> float:
    """A process's user + system CPU seconds, from the report `/usr/bin/time -v` wrote to its stderr."""
    return sum(float(re.search(rf"{k} time \(seconds\): ([\d.]+)", time_v_stderr).group(1)) for k in ("User", "System"))


def eager_child(examples: Path, batch: int) -> None:
    """Child process: torch eager's AdamW steps on the reconfigured model, the runner's batches; one JSON line."""
    import torch
    from safetensors.torch import load_file

    from far.device.order import batch_indices

    torch.set_num_threads(1)
    model, _ = reconfigured_minilm()
    model.eval()  # no dropout, as in the exported program; gradients flow all the same
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=LR)
    data = load_file(examples)
    n = data["labels"].shape[0]
    times, cpu = [], []
    for step in range(n // batch):
        rows = torch.from_numpy(batch_indices(0, 0, step, n, batch))
        start, start_cpu = time.perf_counter(), time.thread_time()
        opt.zero_grad(set_to_none=True)
        loss = model(**{k: v[rows] for k, v in data.items()}).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, CLIP)
        opt.step()
        times.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - start_cpu)
    step_s, step_cpu_s = statistics.median(times[1:]), statistics.mean(cpu[1:])
    print(json.dumps({"step_s": round(step_s, 4), "step_cpu_s": round(step_cpu_s, 4), "steps": len(times)}))


def run_eager(examples: Path, batch: int) -> dict:
    cmd = ["/usr/bin/time", "-v", sys.executable, __file__, "--eager-child", str(examples), "--batch", str(batch)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(done.stdout + done.stderr)
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "peak_rss_MiB": peak_rss_mib(done.stderr)}


def part_step(work: Path, rounds: int, steps: int) -> None:
    shapes = [(32, 64, None), (32, 64, 8), (32, 64, 4), (8, 128, None)]
    rows = []
    for batch, length, micro in shapes:
        out = work / f"export-{batch}x{length}-m{micro or batch}"  # shared with the memory part
        info = export(out, batch, length, micro)
        manifest = json.loads((out / "manifest.json").read_text())
        examples = work / f"random-{batch}x{length}.safetensors"
        if not examples.is_file():
            random_examples(examples, batch * steps, manifest)
        runner, eager = [], []
        for _ in range(rounds):  # alternating, so that both see the same machine
            runner.append(run_runner(out, examples, work, "--epochs", "1"))
            eager.append(run_eager(examples, batch))
        runner_s = statistics.median(r["step_s"] for r in runner)
        eager_s = statistics.median(r["step_s"] for r in eager)
        row = {
            "shape": f"{batch}x{length}",
            "micro_batch": micro or batch,
            "export": info,
            "runner_step_s": runner_s,
            "eager_step_s": eager_s,
            "runner_over_eager": round(runner_s / eager_s, 3),
            "runner_peak_rss_MiB": max(r["peak_rss_MiB"] for r in runner),
            "eager_peak_rss_MiB": max(r["peak_rss_MiB"] for r in eager),
            "runs": {"runner": runner, "eager": eager},
        }
        print(json.dumps({k: v for k, v in row.items() if k != "runs"}), flush=True)
        rows.append(row)
    write_result("step", {"rows": rows})


def glue_examples(out: Path, path: Path, task: str = "cola", limit: int | None = None) -> int:
    """The task's first `limit` training examples, written for the export `out` (cut at its length)."""
    from far.data.glue import GLUE_TASKS, load_glue
    from far.data.locate import locate_data_dir
    from far.device.examples import write_examples

    spec = GLUE_TASKS[task]
    train = load_glue(spec.name, locate_data_dir(None))["train"]
    if limit is not None:
        train = train.select(range(min(limit, len(train))))
    columns = [list(train[c]) for c in spec.text_columns]
    texts = columns[0] if len(columns) == 1 else list(zip(*columns, strict=True))
    write_examples(texts, None, out, path, labels=list(train["label"]), truncate=True)
    return len(train)


def part_memory(work: Path, steps: int) -> None:
    rows = []
    for micro in (32, 8, 4):
        out = work / f"export-32x64-m{micro}"  # shared with the step part
        info = export(out, 32, 64, micro)
        examples = work / f"cola-{micro}.safetensors"
        if not examples.is_file():
            glue_examples(out, examples)
        result = run_runner(out, examples, work, "--epochs", "1", "--max-steps", str(steps))
        row = {"micro_batch": micro, "export": info, **result}
        print(json.dumps(row), flush=True)
        rows.append(row)
    write_result("memory", {"batch": 32, "max_length": 64, "rows": rows})


def part_metric(
    work: Path,
    task: str,
    micro: int | None,
    max_train: int | None,
    epochs: float | None,
    xnnpack: str,
    host_dropout: bool = True,
    device_stage_only: bool = False,
) -> None:
    import torch

    from far.data.locate import locate_data_dir
    from far.recipes.runs import glue_run
    from far.recipes.settings import RunSettings
    from far.training.plan import plan_training

    host_dir = work / f"host-{task}"
    settings = RunSettings(
        model="minilm",
        method="far",
        max_length=64,
        seed=0,
        output_dir=str(host_dir),
        overwrite=True,
        max_train_samples=max_train,
        epochs=epochs,
        progress=False,
        priming_scores="change",
        precision="fp32",  # the device program computes in fp32; "auto" would pick bf16 on an avx512_bf16 CPU
        data_dir=str(locate_data_dir(None)),
        **FAR_CONFIG,
    )
    run = glue_run(settings, task)
    if not host_dropout:  # the host arm as the device program runs: no dropout
        for module in run.model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
    options = settings.train_options(run.hyperparameters)
    plan = plan_training(len(run.train_data), options)
    options = dataclasses.replace(options, checkpoint_every=plan.priming_steps, keep_checkpoints=None)
    if device_stage_only:  # the host arm of this --work on file: go on from its switch checkpoint
        record = {key: value for key, value in read_result(f"metric_{task}").items() if key != "device"}
        if record["host"]["trained"]["log_path"] != str(host_dir / "log.jsonl") or record["plan"]["total_steps"] != (
            plan.total_steps
        ):
            raise SystemExit(f"metric_{task}.json holds another host run than {host_dir}'s: run the whole part")
        record["device_stage_command"] = " ".join(sys.argv)  # the file keeps the host run's own command
    else:
        record = host_arm(run, options, plan, host_dir, host_dropout, task)
        if not host_dropout:
            write_result(f"metric_{task}_host_no_dropout", record)
            return
        # The host's result goes on file first: a device stage cut short (the slowest part) leaves it there.
        write_result(f"metric_{task}", {**record, "device": None})
    device_stage(run, record, plan, host_dir, work, task, micro, max_train, xnnpack)


def host_arm(run, options, plan, host_dir: Path, host_dropout: bool, task: str) -> dict:
    """far.finetune in this process, with a checkpoint at the end of priming; its record for the result file."""
    import far
    from far.models import resolve_model
    from far.saving.stock import stock_reader

    start = time.process_time()
    host_dir.mkdir(parents=True, exist_ok=True)
    result = far.finetune(
        run.model,
        run.train_data,
        base_weights=stock_reader(resolve_model("minilm"), run.model),
        options=options,
        collate_fn=run.collate_fn,
        loss_fn=run.loss_fn,
        eval_fn=None,
        output_dir=host_dir,
    )
    host_cpu_s = time.process_time() - start
    host_metrics = run.evaluator(run.model)
    plan_record = {"total_steps": plan.total_steps, "priming_steps": plan.priming_steps, "warmup": plan.warmup_steps}
    print(json.dumps({"host": host_metrics, "cpu_s": round(host_cpu_s, 1), "dropout": host_dropout}), flush=True)
    host_record = {
        "metrics": host_metrics,
        "cpu_s": round(host_cpu_s, 1),
        "dropout": host_dropout,
        "trained": result.to_dict(),
    }
    return {"task": task, "train_examples": len(run.train_data), "plan": plan_record, "host": host_record}


def device_stage(run, record: dict, plan, host_dir: Path, work: Path, task: str, micro, max_train, xnnpack) -> None:
    """The host run's switch checkpoint exported, trained on by far_train, and scored as a learners file."""
    import far
    from far.device.learners import to_learners
    from far.models import load_model_and_tokenizer
    from far.training.checkpoint import load_model_state, read_checkpoint

    # The run at the end of priming: FFNs split, learners chosen, priming's changes kept.
    switch = read_checkpoint(host_dir / "checkpoints" / f"step-{plan.priming_steps}")
    primed, tokenizer = load_model_and_tokenizer("minilm", "classification", num_labels=run.model.config.num_labels)
    load_model_state(primed, switch)
    out = work / f"device-{task}"
    schedule = {"warmup_steps": plan.warmup_steps, "total_steps": plan.total_steps, "offset": plan.priming_steps}
    info = export(out, 32, 64, micro, xnnpack, model=(primed, tokenizer), schedule=schedule)
    examples = work / f"{task}-train.safetensors"
    n = glue_examples(out, examples, task, max_train)
    remaining = plan.total_steps - plan.priming_steps
    epochs_needed = -(-remaining // (n // 32)) + 1
    device = run_runner(out, examples, work, "--epochs", str(epochs_needed), "--max-steps", str(remaining))
    stock, _ = load_model_and_tokenizer("minilm", "classification", num_labels=run.model.config.num_labels)
    learners = to_learners(out, work / "state.safetensors", stock, work / f"{task}-user.safetensors")
    far.load_learners(stock, learners)
    device_metrics = run.evaluator(stock)
    print(json.dumps({"device": device_metrics, **device}), flush=True)
    device_record = {"metrics": device_metrics, "precision": "fp32", "xnnpack": xnnpack, "export": info, **device}
    record = {**record, "train_examples": n, "device": device_record}
    write_result(f"metric_{task}", {**record, "learners_file_bytes": learners.stat().st_size})


def part_lm_export(work: Path, model: str) -> None:
    out = work / f"{model}-export"
    shutil.rmtree(out, ignore_errors=True)
    far = shutil.which("far") or str(Path(sys.executable).with_name("far"))
    cmd = ["/usr/bin/time", "-v", far, "export", "--executorch", str(out), "--model", model]
    env = {**os.environ, "FAR_THREADS": "1", "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    cpu = cpu_seconds(done.stderr)
    manifest = json.loads((out / "manifest.json").read_text())
    trained = sum(math.prod(spec["shape"]) for spec in manifest["trainable"])
    write_result(
        f"lm_export_{model}",
        {
            "export": " ".join(cmd[2:]),
            "wall_s": round(wall, 1),
            "cpu_s": round(cpu, 1),
            "peak_rss_mib": peak_rss_mib(done.stderr),
            "sizes_bytes": {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()},
            "planned_bytes": {role: p["planned_bytes"] for role, p in manifest["programs"].items()},
            "trained_values": trained,
            "layers": {"frozen": manifest["frozen_layers"], "all": manifest["num_layers"]},
            "shape": {k: manifest[k] for k in ("batch_size", "micro_batch_size", "max_length")},
            "printed": done.stdout,
        },
    )


def part_lm_memory(work: Path, out: Path, runner: Path, label: str) -> None:
    from far.data.texts import TextChunks
    from far.device.lm_text import CHUNKS, read_chunks, write_chunks
    from far.device.manifest import NEXT_TOKEN, read_manifest

    manifest = read_manifest(out, objective=NEXT_TOKEN)
    train, held_out, _ = read_chunks(out / CHUNKS, manifest)
    small = work / "small.safetensors"
    write_chunks(TextChunks(train[:16], held_out[:8]), small, manifest)
    state = work / "user.safetensors"
    for stale in (state, state.with_name(state.name + ".bottom")):
        stale.unlink(missing_ok=True)
    shutil.copy(out / "state.safetensors", state)
    cmd = ["/usr/bin/time", "-v", str(runner), str(out), "--examples", str(small), "--state", str(state)]
    cmd += ["--epochs", "1", "--checkpoint-every", "2", "--threads", "1"]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(done.stdout + done.stderr[-3000:])
    lines = done.stdout.splitlines()
    held = {line.split()[1]: float(line.rsplit("perplexity=", 1)[1]) for line in lines if line.startswith("held_out")}
    steps = [dict(w.split("=") for w in line.split()) for line in lines if line.startswith("step=")]
    values = sum(math.prod(spec["shape"]) for spec in manifest["trainable"])
    programs = manifest["programs"]
    step_holds = {
        "train_planned": programs["train"]["planned_bytes"],
        "optimizer_moments": 2 * 4 * values if manifest["optimizer"]["name"] == "adamw" else 4 * values,
        "gradient_sum": 4 * values if manifest["accumulate"] > 1 else 0,
        "train_pte_read_each_step": (out / programs["train"]["file"]).stat().st_size - 4 * values,
    }
    write_result(
        f"lm_memory_{label}",
        {
            "runner": " ".join(cmd[2:]),
            "export": str(out),
            "peak_rss_mib": peak_rss_mib(done.stderr),
            "cpu_s": round(cpu_seconds(done.stderr), 1),
            "wall_s": round(time.perf_counter() - start, 1),
            "step_s": [float(s["time_s"]) for s in steps],
            "losses": [float(s["loss"]) for s in steps],
            "held_out_perplexity": held,
            "planned_bytes": {role: p["planned_bytes"] for role, p in programs.items()},
            "bottom_xnnpack": programs["bottom"]["xnnpack"],
            "trained_values": values,
            "step_holds_bytes": step_holds,
            "step_holds_mib": round(sum(step_holds.values()) / 2**20, 1),
            "printed": done.stdout,
        },
    )


def lean_decoding(model: str, ids: list[int], new_tokens: int) -> dict:
    """The lean runtime's greedy decoding here, one thread: the prompt with its first token, then the rest."""
    import torch

    from far.llm.generate import GenerationConfig, generate
    from far.models import load_lean_lm

    torch.set_num_threads(1)
    lm = load_lean_lm(model)[0]
    start = time.perf_counter()
    generate(lm, ids, GenerationConfig(max_new_tokens=1))
    first = time.perf_counter() - start
    start = time.perf_counter()
    generate(lm, ids, GenerationConfig(max_new_tokens=new_tokens))
    decode = time.perf_counter() - start - first
    return {"prompt_and_first_token_s": round(first, 3), "tokens_per_s": round((new_tokens - 1) / decode, 2)}


def part_lm_generate(work: Path, model: str, prompt: str, new_tokens: int) -> None:
    from tokenizers import Tokenizer

    out = work / f"{model}-generate"
    shutil.rmtree(out, ignore_errors=True)
    far = shutil.which("far") or str(Path(sys.executable).with_name("far"))
    env = {**os.environ, "FAR_THREADS": "1", "OMP_NUM_THREADS": "1"}
    timed = lambda cmd: subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, env=env)  # noqa: E731
    export = [far, "export", "--executorch", str(out), "--model", model, "--generate"]
    start = time.perf_counter()
    done = timed(export)
    export_wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{' '.join(export)} failed:\n{done.stderr[-3000:]}")
    export_record = {"wall_s": round(export_wall, 1), "cpu_s": round(cpu_seconds(done.stderr), 1)}
    export_record["peak_rss_mib"] = peak_rss_mib(done.stderr)
    ids = Tokenizer.from_file(str(out / "tokenizer.json")).encode(prompt).ids
    generate = [str(RUNNER.with_name("far_generate")), str(out), "--state", str(out / "state.safetensors")]
    generate += ["--prompt-ids", ",".join(map(str, ids)), "--max-new-tokens", str(new_tokens), "--threads", "1"]
    device = timed(generate)
    if device.returncode:
        raise SystemExit(device.stdout + device.stderr[-3000:])
    written, text = re.match(r"ids=([\d,]+)\ntext:\n(.*)\n\Z", device.stdout, re.S).groups()
    timing = r"prompt (\d+) tokens in (\S+) s; (\d+) tokens written in (\S+) s \((\S+) tokens/s\)"
    speed = re.search(timing, device.stderr)
    lean = timed([far, "generate", "--model", model, "--prompt", prompt, "--max-new-tokens", str(new_tokens)])
    if lean.returncode:
        raise SystemExit(lean.stderr[-3000:])
    manifest = json.loads((out / "manifest.json").read_text())
    lean_speed = lean_decoding(model, ids, new_tokens)
    write_result(
        f"lm_generate_{model}",
        {
            "export": " ".join(export[1:]),
            "export_run": export_record,
            "sizes_bytes": {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()},
            "planned_bytes": {role: p["planned_bytes"] for role, p in manifest["programs"].items()},
            "cache_length": manifest["generate"]["cache_length"],
            "prompt": prompt,
            "prompt_ids": ids,
            "far_generate": {
                "command": " ".join(generate),
                "ids": [int(i) for i in written.split(",")],
                "text": text,
                "prompt_s": float(speed[2]),
                "decode_s": float(speed[4]),
                "tokens_per_s": float(speed[5]),
                "peak_rss_mib": peak_rss_mib(device.stderr),
                "cpu_s": round(cpu_seconds(device.stderr), 1),
            },
            "lean_far_generate": {
                "command": f"far generate --model {model} --prompt {prompt!r} --max-new-tokens {new_tokens}",
                "text": lean.stdout.removesuffix("\n"),
                "peak_rss_mib": peak_rss_mib(lean.stderr),
                "cpu_s": round(cpu_seconds(lean.stderr), 1),
                **lean_speed,
            },
            "same_text": text == lean.stdout.removesuffix("\n"),
        },
    )


def lean_step_child(out: Path, chunks: Path, steps: int) -> None:
    """Child process: the lean runtime's AdamW steps on an export's trained set and batches; one JSON line.

    The stock GGUF model laid out as the export says, with its state's values (`lm_to_learners`, then
    `reconfigure_from_learners`: the export's learners, frozen depth and trained tensors, in fp32); the frozen
    bottom's output of every chunk computed before the first step (the runner reads it from its cache); then
    far train's step (`far.llm.text_steps.TextSteps`: forward from the bottom's output, backward, AdamW) on
    the runner's batches (far.device's order), in the export's micro-batches.
    """
    import tempfile

    import torch

    from far.device.lm_export import reconfigure_from_learners
    from far.device.lm_learners import lm_to_learners
    from far.device.lm_text import read_chunks
    from far.device.manifest import NEXT_TOKEN, read_manifest
    from far.device.order import batch_indices
    from far.llm.prefix import PrefixCache
    from far.llm.text_steps import TextSteps
    from far.models import MODEL_ALIASES, load_lean_lm

    torch.set_num_threads(1)
    manifest = read_manifest(out, objective=NEXT_TOKEN)
    alias = next(a for a, known in MODEL_ALIASES.items() if known.gguf_file == manifest["base"]["gguf"])
    with tempfile.TemporaryDirectory() as tmp:
        learners = lm_to_learners(out, out / "state.safetensors", load_lean_lm(alias)[0], Path(tmp) / "l.safetensors")
        model, _ = load_lean_lm(alias)
        depth = reconfigure_from_learners(model, learners)
    train, _, _ = read_chunks(chunks, manifest)
    cache = PrefixCache(model)
    for row in train.split(1):  # every chunk's bottom output first, as the runner's cache holds them
        cache.hidden(row, torch.ones_like(row))
    opt = manifest["optimizer"]
    step = TextSteps(model, "adamw", opt["lr"], cache, weight_decay=opt["weight_decay"])
    batch, micro = manifest["batch_size"], manifest["micro_batch_size"]
    times, cpu, losses = [], [], []
    for s in range(steps):
        ids = train[torch.from_numpy(batch_indices(0, 0, s, len(train), batch))]
        start, start_cpu = time.perf_counter(), time.thread_time()
        losses.append(step([ids[i : i + micro] for i in range(0, batch, micro)]))
        times.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - start_cpu)
    print(
        json.dumps(
            {
                "depth": depth,
                "trained_values": sum(w.stored.numel() for w in model.trainable_weights()),
                "time_s": times,
                "cpu_s": cpu,
                "losses": losses,
            }
        )
    )


def part_lm_step(work: Path, out: Path, runner: Path, rounds: int, steps: int, label: str) -> None:
    from far.data.texts import TextChunks
    from far.device.lm_text import CHUNKS, read_chunks, write_chunks
    from far.device.manifest import NEXT_TOKEN, read_manifest

    manifest = read_manifest(out, objective=NEXT_TOKEN)
    batch, accumulate = manifest["batch_size"], manifest["accumulate"]
    train, held_out, _ = read_chunks(out / CHUNKS, manifest)
    if len(train) < batch * steps:
        raise SystemExit(f"{out / CHUNKS} holds {len(train)} training chunks; --steps {steps} needs {batch * steps}")
    chunks = work / "step-chunks.safetensors"
    write_chunks(TextChunks(train[: batch * steps], held_out[:1]), chunks, manifest)
    state = work / "step-state.safetensors"
    cmd = ["/usr/bin/time", "-v", str(runner), str(out), "--examples", str(chunks), "--state", str(state)]
    cmd += ["--epochs", "1", "--threads", "1"]
    lean_cmd = ["/usr/bin/time", "-v", sys.executable, __file__, "--lean-child", str(out), "--chunks", str(chunks)]
    lean_cmd += ["--steps", str(steps)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    # far_train twice, on far's step kernels and with FAR_KERNELS=wheel on the executorch wheel's (one build)
    sides = {"runner": {}, "runner_wheel_kernels": {"FAR_KERNELS": "wheel"}}
    runs: dict[str, list] = {"runner": [], "runner_wheel_kernels": [], "lean": []}
    for _ in range(rounds):  # alternating, so that all see the same machine
        for side, extra in sides.items():
            shutil.copy(out / "state.safetensors", state)  # the bottom cache beside it is reused: not timed either way
            done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **extra})
            if done.returncode:
                raise SystemExit(done.stdout + done.stderr[-3000:])
            printed = done.stdout.splitlines()
            lines = [dict(w.split("=") for w in ln.split()) for ln in printed if ln.startswith("step=")]
            runs[side].append(
                {
                    "time_s": [float(s["time_s"]) for s in lines],
                    "cpu_s": [float(s["cpu_s"]) for s in lines],
                    "losses": [float(s["loss"]) for s in lines],
                    "peak_rss_mib": peak_rss_mib(done.stderr),
                }
            )
        done = subprocess.run(lean_cmd, capture_output=True, text=True, env=env)
        if done.returncode:
            raise SystemExit(done.stdout + done.stderr[-3000:])
        lean = json.loads(done.stdout.strip().splitlines()[-1])
        runs["lean"].append({**lean, "peak_rss_mib": peak_rss_mib(done.stderr)})
        print(json.dumps({k: v[-1] for k, v in runs.items()}), flush=True)

    def per_micro_batch(side: str, key: str) -> float:  # the steps after each run's first, over the rounds
        return round(statistics.median(t for r in runs[side] for t in r[key][1:]) / accumulate, 3)

    first = {side: runs[side][0]["losses"][0] for side in runs}
    rows = {side: {"wall_s": per_micro_batch(side, "time_s"), "cpu_s": per_micro_batch(side, "cpu_s")} for side in runs}
    write_result(
        f"lm_step_{label}",
        {
            "runner": " ".join(cmd[2:]),
            "lean": " ".join(lean_cmd[2:]),
            "export": str(out),
            "shape": {k: manifest[k] for k in ("batch_size", "micro_batch_size", "accumulate", "max_length")},
            "layers": {"frozen": manifest["frozen_layers"], "all": manifest["num_layers"]},
            "trained_values": runs["lean"][0]["trained_values"],
            "rounds": rounds,
            "steps": steps,
            "per_micro_batch": rows,
            "runner_over_lean": {k: round(rows["runner"][k] / rows["lean"][k], 2) for k in ("wall_s", "cpu_s")},
            "runner_wheel_kernels_over_lean": {
                k: round(rows["runner_wheel_kernels"][k] / rows["lean"][k], 2) for k in ("wall_s", "cpu_s")
            },
            "first_loss": first,
            "first_loss_difference": abs(first["runner"] - first["lean"]),
            "last_loss_difference": abs(runs["runner"][0]["losses"][-1] - runs["lean"][0]["losses"][-1]),
            "runs": runs,
        },
    )


def live_at_peak(program) -> dict:
    """Planned bytes, and the tensors live where the most are, by the operator that wrote them."""
    specs = {}
    for node in program.exported_program().graph_module.graph.nodes:
        if node.op == "call_function" and getattr(node.target, "__name__", "") == "view":
            continue  # memory.view: its base's memory
        spec = node.meta.get("spec")
        for s in spec if isinstance(spec, (list, tuple)) else [spec]:
            if getattr(s, "mem_id", None) is not None and s.lifetime[0] is not None:
                specs[id(s)] = (node, s)
    end = max(s.lifetime[1] for _, s in specs.values())
    live = [0] * (end + 1)
    for _, s in specs.values():
        for i in range(s.lifetime[0], s.lifetime[1] + 1):
            live[i] += s.allocated_memory
    peak = max(range(end + 1), key=live.__getitem__)
    kinds: dict[str, list] = {}
    for node, s in specs.values():
        if s.lifetime[0] <= peak <= s.lifetime[1]:
            kind = node.op if node.op != "call_function" else str(node.target).split("::")[-1]
            kinds.setdefault(kind, [0, 0])
            kinds[kind][0] += 1
            kinds[kind][1] += s.allocated_memory
    return {
        "planned_mib": round(sum(program.executorch_program.execution_plan[0].non_const_buffer_sizes) / 2**20, 1),
        "live_at_peak_mib": round(live[peak] / 2**20, 1),
        "instructions": end + 1,
        "peak_at": peak,
        "live_by_kind_mib": {
            k: {"tensors": n, "mib": round(b / 2**20, 2)} for k, (n, b) in sorted(kinds.items(), key=lambda x: -x[1][1])
        },
    }


def part_lm_plan(layers: int) -> None:
    import torch

    from far.device.lm_export import plan_lm_export, reconfigure_for_export
    from far.device.lm_view import lm_views
    from far.device.lowering import quietly, training_program
    from far.models import load_lean_lm

    model, _ = load_lean_lm("smollm2-135m")
    model.layers = model.layers[:layers]
    types = model.config.layer_types[:layers]
    model.config = dataclasses.replace(model.config, num_layers=layers, layer_types=types)
    reconfigure_for_export(model, None)
    depth = plan_lm_export(model, 256)
    _, top = lm_views(model, depth)
    inputs = (torch.zeros(1, 256, model.config.hidden_size), torch.zeros(1, 256, dtype=torch.long))
    rows = {}
    for recompute in (False, True):
        start = time.process_time()
        with quietly():
            program, _ = training_program(top, inputs, recompute=recompute)
        rows["recompute" if recompute else "kept"] = {
            "lower_cpu_s": round(time.process_time() - start, 1),
            **live_at_peak(program),
        }
        print(json.dumps(rows), flush=True)
    trained = layers - depth
    write_result(
        f"lm_plan_{layers}_layers",
        {"layers": layers, "frozen": depth, "trained": trained, "tokens": 256, "programs": rows},
    )


def export_child(out: Path, xnnpack: str) -> None:
    """Child process: MiniLM with random learners exported at 32x64 in one pass at one XNNPACK level; one JSON line."""
    import torch

    torch.set_num_threads(1)
    print(json.dumps(export(out, 32, 64, xnnpack=xnnpack)))


def run_export(out: Path, xnnpack: str) -> dict:
    measured = out.with_name(out.name + "-export.json")  # a rerun reuses an export with its measurement
    if measured.is_file() and (out / "manifest.json").is_file():
        return json.loads(measured.read_text())
    shutil.rmtree(out, ignore_errors=True)
    cmd = ["/usr/bin/time", "-v", sys.executable, __file__, "--export-child", str(out), "--xnnpack", xnnpack]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(done.stdout + done.stderr[-3000:])
    manifest = json.loads((out / "manifest.json").read_text())
    info = {
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu_seconds(done.stderr), 1),
        "peak_rss_MiB": peak_rss_mib(done.stderr),
        "sizes_bytes": {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()},
        "planned_bytes": {role: p["planned_bytes"] for role, p in manifest["programs"].items()},
        "load_average": os.getloadavg()[0],
    }
    measured.write_text(json.dumps(info))
    return info


def part_lowering(work: Path, rounds: int, steps: int, levels: list[str]) -> None:
    from far.device.lowering import XNNPACK_LEVELS

    rows = []
    for level in levels or XNNPACK_LEVELS:
        out = work / f"lowering-{level}"
        info = run_export(out, level)
        manifest = json.loads((out / "manifest.json").read_text())
        examples = work / "random-32x64.safetensors"  # the same examples for every level
        if not examples.is_file():
            random_examples(examples, 32 * steps, manifest)
        runner, first, eager = [], [], []
        for _ in range(rounds):  # alternating, so that both see the same machine
            first.append(run_runner(out, examples, work, "--epochs", "1", "--max-steps", "1"))
            runner.append(run_runner(out, examples, work, "--epochs", "1"))
            eager.append(run_eager(examples, 32))
        # CPU seconds, which a shared machine's load moves less than wall seconds: far_train's steps after the
        # first are what a process of all the steps costs beyond one of the first step alone
        beyond = [(r["cpu_s"] - f["cpu_s"]) / (steps - 1) for r, f in zip(runner, first, strict=True)]
        runner_cpu = statistics.median(beyond)
        eager_cpu = statistics.median(r["step_cpu_s"] for r in eager)
        row = {
            "xnnpack": level,
            "export": info,
            "runner_step_cpu_s": round(runner_cpu, 3),
            "eager_step_cpu_s": eager_cpu,
            "runner_over_eager": round(runner_cpu / eager_cpu, 3),
            "runner_step_s": statistics.median(r["step_s"] for r in runner),
            "eager_step_s": statistics.median(r["step_s"] for r in eager),
            "runner_peak_rss_MiB": max(r["peak_rss_MiB"] for r in runner),
            "load_average": os.getloadavg()[0],
            "kernels": "wheel" if os.environ.get("FAR_KERNELS") == "wheel" else "far",  # what far_train ran on
            "runs": {"runner": runner, "first_step": first, "eager": eager},
        }
        print(json.dumps({k: v for k, v in row.items() if k != "runs"}), flush=True)
        rows.append(row)
    name = "lowering_" + "_".join(levels) if levels else "lowering"
    write_result(name, {"batch": 32, "max_length": 64, "steps": steps, "rows": rows})


def part_bound() -> None:
    import torch
    from step_memory import saved_for_backward_bytes

    model, _ = reconfigured_minilm()
    model.set_attn_implementation("eager")
    model.eval()  # no dropout, as exported
    trained_layers = range(FAR_CONFIG["freeze_layers"], model.config.num_hidden_layers)
    in_trained = tuple(f"bert.encoder.layer.{i}." for i in trained_layers)
    named = list(model.named_parameters())
    trainable = sum(p.numel() * p.element_size() for _, p in named if p.requires_grad)
    frozen = sum(p.numel() * p.element_size() for n, p in named if not p.requires_grad and n.startswith(in_trained))
    rows = []
    for batch in (32, 8, 4):
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(1000, model.config.vocab_size, (batch, 64), generator=g)
        ids[:, 0] = 101
        inputs = {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "token_type_ids": torch.zeros_like(ids),
            "labels": torch.randint(0, 2, (batch,), generator=g),
        }
        saved = saved_for_backward_bytes(model, lambda inputs=inputs: model(**inputs).loss)
        model.zero_grad(set_to_none=True)
        rows.append({"batch": batch, "saved_for_backward_bytes": saved})
        print(json.dumps(rows[-1]), flush=True)
    record = {
        "max_length": 64,
        "attention": "eager",
        "trainable_bytes": trainable,
        "trained_layers_frozen_bytes": frozen,
        "rows": rows,
    }
    write_result("bound", record)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--part",
        choices=(
            "step",
            "memory",
            "metric",
            "lm-export",
            "lm-memory",
            "lm-step",
            "lm-plan",
            "lm-generate",
            "lowering",
            "bound",
        ),
    )
    parser.add_argument("--prompt", default="The best thing about mornings is", help="lm-generate: the prompt")
    parser.add_argument("--model", default="smollm2-135m", help="lm-export: the GGUF causal LM")
    parser.add_argument("--work", type=Path, default=Path("/tmp/far_device_train"))
    parser.add_argument("--export-dir", type=Path, help="lm-memory: a causal LM's export folder with its texts")
    parser.add_argument("--runner", type=Path, default=RUNNER, help="lm-memory, lm-step: the far_train binary")
    parser.add_argument("--label", default="smollm2-135m", help="lm-memory, lm-step: the result file's label")
    parser.add_argument("--layers", type=int, default=4, help="lm-plan: SmolLM2's first N layers")
    parser.add_argument("--levels", help="lowering: the XNNPACK levels, comma-separated (default: all)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--task", choices=("cola", "sst2"), default="cola")
    parser.add_argument("--micro-batch", type=int, help="metric: the programs' micro-batch (default 32)")
    parser.add_argument("--max-train-samples", type=int, help="metric: the first N training examples")
    parser.add_argument("--epochs", type=float, help="metric: the host run's epochs (default: far glue's)")
    parser.add_argument("--xnnpack", default="all", help="metric: the training program's XNNPACK level")
    parser.add_argument("--export-child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument(
        "--host-without-dropout",
        action="store_true",
        help="metric: only the host run, with dropout off as in the device program",
    )
    parser.add_argument(
        "--device-stage-only",
        action="store_true",
        help="metric: the device stage alone, from the host run that this --work and the result file hold",
    )
    parser.add_argument("--eager-child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--lean-child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--chunks", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=32, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.eager_child:
        eager_child(args.eager_child, args.batch)
        return
    if args.lean_child:
        lean_step_child(args.lean_child, args.chunks, args.steps)
        return
    if args.export_child:
        export_child(args.export_child, args.xnnpack)
        return
    if args.part is None:
        parser.error("--part is required")
    if args.part == "lm-export":
        args.work.mkdir(parents=True, exist_ok=True)
        part_lm_export(args.work, args.model)
        return
    if args.part == "lm-generate":
        args.work.mkdir(parents=True, exist_ok=True)
        part_lm_generate(args.work, args.model, args.prompt, 32)
        return
    if args.part == "lm-memory":
        if args.export_dir is None:
            parser.error("--part lm-memory needs --export-dir OUT (far export --executorch OUT --train-file DIR)")
        args.work.mkdir(parents=True, exist_ok=True)
        part_lm_memory(args.work, args.export_dir, args.runner, args.label)
        return
    if args.part == "lm-step":
        if args.export_dir is None:
            parser.error("--part lm-step needs --export-dir OUT (far export --executorch OUT --train-file DIR)")
        args.work.mkdir(parents=True, exist_ok=True)
        part_lm_step(args.work, args.export_dir, args.runner, args.rounds, args.steps, args.label)
        return
    if args.part == "lm-plan":
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch

        torch.set_num_threads(1)
        part_lm_plan(args.layers)
        return
    if args.part == "bound":
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch

        torch.set_num_threads(1)
        part_bound()
        return
    if not RUNNER.is_file():
        raise SystemExit(f"no runner at {RUNNER}: bash runtime/executorch/build.sh")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(1)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.part == "step":
        part_step(args.work, args.rounds, args.steps)
    elif args.part == "memory":
        part_memory(args.work, args.steps)
    elif args.part == "lowering":
        part_lowering(args.work, args.rounds, args.steps, args.levels.split(",") if args.levels else [])
    else:
        part_metric(
            args.work,
            args.task,
            args.micro_batch,
            args.max_train_samples,
            args.epochs,
            args.xnnpack,
            host_dropout=not args.host_without_dropout,
            device_stage_only=args.device_stage_only,
        )


if __name__ == "__main__":
    main()
