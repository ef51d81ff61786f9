"""Where the notebooks find data and the experiments' committed results, and what the runs' settings were.

Costly numbers are never computed for a notebook: they come from the experiments/ scripts' result
files, and a missing file is an error that names the command that writes it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from far.evaluation.scores import GLUE_METRICS

QUICK_ENV = "FAR_NOTEBOOK_QUICK"  # "1": the notebooks shrink steps and samples (CI)
RESULTS_ENV = "FAR_RESULTS_DIR"  # another results folder (default: <repo>/experiments/results)
DATA_ENV = "FAR_DATA_DIR"

_RETENTIONS = ["0.1", "0.2", "0.4", "0.6", "0.8", "1.0"]  # the sweep (SST-2: 1 epoch on 3,000 sentences per point)
# Result file (relative to the results folder) -> the command, run from the repository root, that writes it.
# Each script writes under its own folder, experiments/results/<script>/.
RESULT_SOURCES: dict[str, str] = {
    "replicate_far/replication.json": "python experiments/replicate_far.py",
    "replicate_far/sweep/replication.json": (
        # full first: the summary's deltas to full need it
        "python experiments/replicate_far.py --tasks sst2 --methods full "
        + " ".join(f"far-r{r}" for r in _RETENTIONS)
        + " --output experiments/results/replicate_far/sweep --extra --max-train-samples 3000"
    ),
    "bench_step/bench_sweep.json": (
        "python experiments/bench_step.py --configs full "
        + " ".join(f"far-{r}" for r in _RETENTIONS)
        + " --shapes 32x64 --precisions fp32 --steps 10 --warmup 2 --output experiments/results/bench_step/bench_sweep"
    ),
    "bench_step/bench_step.json": "python experiments/bench_step.py",
    "bench_step/bench_step_target.json": (
        "python experiments/bench_step.py --configs full far-0.4 random-0.4 --shapes 32x64 --steps 40 --warmup 2 "
        "--output experiments/results/bench_step/bench_step_target"
    ),
    "bench_step/bench_step_cola_shape.json": (
        "python experiments/bench_step.py --shapes 32x24 --configs full far-0.4 random-0.4 freeze-ffn "
        "far-0.4+frozen-emb far-0.2 far-0.2+frozen-emb --steps 10 --warmup 2 "
        "--output experiments/results/bench_step/bench_step_cola_shape"
    ),
    "bench_step/bench_step_distilbert.json": (
        "python experiments/bench_step.py --models distilbert --shapes 32x64 32x128 --steps 10 --warmup 1 "
        "--output experiments/results/bench_step/bench_step_distilbert"
    ),
    # One seed per task; the CoLA rows that finished (the summary skips runs that did not).
    "replicate_far/depth/depth.json": (
        "python experiments/replicate_far.py --tasks sst2 cola --seeds 0 --methods full full+frozen-emb "
        "full+frozen-bottom-3 far-0.2+frozen-emb far-0.2+frozen-emb+keep-primed far-0.2+depth-auto "
        "far-0.2+frozen-emb+bottom-3 --output experiments/results/replicate_far/depth --name depth --summarize-only"
    ),
    # One thread per run; CoLA's seeds 1 and 2 of most rows come from the grids --earlier-runs names (metric only).
    "replicate_far/one_thread/one_thread.json": (
        "python experiments/replicate_far.py --tasks cola sst2 stsb --seeds 0 1 2 --methods full "
        "full+frozen-emb full+frozen-bottom-2 full+frozen-bottom-2+cache full+frozen-bottom-3+cache far "
        "far-0.2+frozen-emb far-0.2+frozen-emb+bottom-2 far-0.2+frozen-emb+bottom-2+cache "
        "far-0.2+depth-auto+cache lora lora-lr2e-3 --output experiments/results/replicate_far/one_thread "
        "--name one_thread --summarize-only --earlier-runs experiments/results/replicate_far/portable "
        "experiments/results/replicate_far/practitioner experiments/results/replicate_far/depth "
        "experiments/results/replicate_far/replication_heads_lora experiments/results/replicate_far"
    ),
    # One thread per run, batches grouped by length (each run's command: docs/results.md, "The automatic
    # configuration side by side"); the summary reads the runs the grid's folder holds.
    "replicate_far/grouped/grouped.json": (
        "python experiments/replicate_far.py --tasks cola sst2 stsb squad --seeds 0 1 2 --methods full "
        "far-auto+depth-auto+cache far-auto+depth-1+cache far-auto+depth-auto+cache+priming-0.05 "
        "full+frozen-bottom-3+cache lora lora-lr2e-3 --output experiments/results/replicate_far/grouped "
        "--name grouped --summarize-only"
    ),
    "bench_memory/memory_minilm.json": "python experiments/bench_memory.py",
    "bench_memory/llm_memory.json": "python experiments/bench_memory.py --model smollm2-135m",
    "llm_sst2/llm_sst2.json": "python experiments/llm_sst2.py --steps 80 --lr 3e-4",
    # after `python experiments/llm_mezo_divergence.py --directions 8 --replay-steps 12 --threads 1`
    "llm_fewshot/llm_fewshot.json": (
        "python experiments/llm_fewshot.py --phase zero grid final summary --k 16; "
        "python experiments/llm_fewshot.py --phase grid final summary --k 512; "
        "python experiments/llm_fewshot.py --phase grid final summary --k 16 --arms mezo_far_emb --lrs 4e-05 1e-4 2e-4"
    ),
    # after `python experiments/llm_mezo_divergence.py --model gemma3-270m --directions 8 --replay-steps 12
    # --threads 1 --output experiments/results/llm_mezo_divergence/llm_mezo_divergence_gemma3.json`
    "llm_fewshot/llm_fewshot_gemma3.json": (
        "python experiments/llm_fewshot.py --model gemma3-270m --phase zero grid final summary --k 16 "
        "--lrs-from experiments/results/llm_mezo_divergence/llm_mezo_divergence_gemma3.json "
        "--cases-dir experiments/results/llm_fewshot/cases_gemma3 "
        "--output experiments/results/llm_fewshot/llm_fewshot_gemma3.json"
    ),
    # the seed-0 grid of every arm, then the leading arms' long runs at the same CPU-seconds
    "llm_fewshot_time/summary.json": (
        "python experiments/llm_fewshot_time.py --phase grid --k 16; "
        "python experiments/llm_fewshot_time.py --phase curves summary --k 16 --arms mezo far_top10 --seeds 0 1 2 "
        "--seconds 900 --eval-seconds 150 --steps 3000; the same two phases with --model gemma3-270m (grid --lrs 3e-7 "
        "1e-6 3e-6 1e-5 3e-5) and with --k 512 (seed 0; see docs/llm.md)"
    ),
    "own_texts_runs/summary.json": (
        "python experiments/own_texts_corpus.py; python experiments/own_texts_runs.py /tmp/python_docs.jsonl"
    ),
}
MODEL_NAMES = {"minilm": "all-MiniLM-L6-v2", "smollm2-135m": "SmolLM2-135M", "gemma3-270m": "Gemma-3-270M"}


class MissingResultError(FileNotFoundError):
    """A committed result file a notebook reads is missing; the message names the script that writes it."""


def quick_mode() -> bool:
    """True when $FAR_NOTEBOOK_QUICK asks for the shrunk run (CI): "1", "true", "yes" or "on"."""
    return os.environ.get(QUICK_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def repo_root(start: str | os.PathLike | None = None) -> Path:
    """The repository root: the first folder from `start` (default: the working directory) upwards that
    holds pyproject.toml, far/ and experiments/; else the checkout this module was imported from.

    Raises:
        FileNotFoundError: neither is a far checkout (an installed far has no experiments/).
    """
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents, Path(__file__).resolve().parents[2]):
        if all((folder / p).exists() for p in ("pyproject.toml", "far", "experiments")):
            return folder
    raise FileNotFoundError(
        f"no far repository found from {here} upwards; run the notebooks from the notebooks/ folder of a far checkout"
    )


def _path_from_env(name: str, default: str) -> Path:
    # A relative path (in the variable or the default) is relative to the repository root: the
    # notebooks run with cwd notebooks/.
    path = Path(os.environ.get(name) or default).expanduser()
    return path if path.is_absolute() else (repo_root() / path).resolve()


def data_dir() -> Path:
    """GLUE/SQuAD data: $FAR_DATA_DIR (relative to the repo root), default `<repo>/../shared/data`.

    Raises:
        FileNotFoundError: the folder does not exist.
    """
    path = _path_from_env(DATA_ENV, "../shared/data")
    if not path.is_dir():
        raise FileNotFoundError(
            f"data folder {path} does not exist; set ${DATA_ENV} to the folder holding glue/<Task>/ and squad/"
        )
    return path


def results_dir() -> Path:
    """The experiments' results: $FAR_RESULTS_DIR (relative to the repo root), default `<repo>/experiments/results`."""
    return _path_from_env(RESULTS_ENV, "experiments/results")


def result_path(name: str) -> Path:
    return results_dir() / name


def load_result(name: str, *, required: bool = True) -> dict | None:
    """Read a result file of the experiments, e.g. "replicate_far/replication.json".

    Args:
        name: Path relative to the results folder (keys of `RESULT_SOURCES` are the known ones).
        required: Raise when it is missing; else return None.

    Raises:
        MissingResultError: the file is missing (the message gives the command that writes it).
    """
    path = result_path(name)
    if not path.is_file():
        if not required:
            return None
        command = RESULT_SOURCES.get(name, "the experiments/ script that writes it")
        raise MissingResultError(
            f"{path} does not exist. It is written by `{command}` (run from the repository root); "
            "the notebooks plot committed results and never invent them"
        )
    return json.loads(path.read_text(encoding="utf-8"))


def read_run_log(path: str | os.PathLike) -> list[dict]:
    """The per-step records of `far.finetune`'s log.jsonl (step, phase, loss, lr, elapsed, ...)."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def metric_name(task: str) -> str:
    """The headline metric of a task, as replicate_far.py reports it."""
    if task == "squad":
        return "f1"
    if task not in GLUE_METRICS:
        raise ValueError(f"unknown task {task!r}; one of {', '.join(GLUE_METRICS)} or squad")
    return GLUE_METRICS[task][0]


def metric_scale(task: str) -> float:
    """Factor that puts a task's headline metric in points (0-100): GLUE's are fractions, SQuAD's F1 is in points."""
    metric_name(task)  # an unknown task is an error
    return 1.0 if task == "squad" else 100.0


def run_setting(folder: str | os.PathLike, task: str) -> str:
    """Model, batch, steps, length and precision of a task's runs in `<folder>/runs/`, for figure titles."""
    records = sorted(Path(folder, "runs").glob(f"{task}-*-s*/metrics.json"))
    if not records:
        raise MissingResultError(f"no runs of {task} in {Path(folder, 'runs')}: replicate_far.py writes them")
    preferred = [p for p in records if p.parent.name.startswith(f"{task}-full-")] or records
    record = json.loads(preferred[0].read_text(encoding="utf-8"))
    hp = record.get("hyperparameters", {})
    model = MODEL_NAMES.get(record.get("model"), record.get("model", "?"))
    precision = "bf16" if hp.get("bf16") else "fp32"
    return (
        f"{model}, {task}, batch {hp.get('batch_size', '?')}, {record.get('steps', '?')} steps, "
        f"max length {hp.get('max_length', '?')}, {precision}"
    )


def versus_full(summary: dict) -> list[str]:
    """One line per (task, method) of a replicate_far summary: metric and time against full fine-tuning's."""
    lines = []
    for task, methods in summary.items():
        points = metric_scale(task)
        for method, row in methods.items():
            if method == "full" or "metric_delta_vs_full" not in row:
                continue
            lines.append(
                f"{task:>6} {method:>20}: metric {points * row['metric_delta_vs_full']:+6.2f} points vs full, "
                f"time saved vs full {100 * row['time_saving_vs_full']:+5.1f}%, "
                f"{row['trainable_parameters']:,} parameters trained"
            )
    return lines
