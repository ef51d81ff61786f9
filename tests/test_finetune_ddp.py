"""`far.finetune` under torchrun (2 CPU processes, gloo): the weights of one process taking the same global batches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import TINY, torchrun, write_rows
from ddp_finetune_worker import NO_DROPOUT, VARIANTS, run
from ddp_parallel_worker import disagree_and_fail
from safetensors.torch import load_file
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

from far.cli.main import main
from far.training.batches import BatchStream
from far.training.distributed import Parallel

# Whole processes (torchrun's, or two spawned here): slow.
distributed = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="this torch build has no torch.distributed"
)
WORKER = Path(__file__).with_name("ddp_finetune_worker.py")
TOLERANCE = 1e-5


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()  # the same layout: the processes chose the same learners and depth
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].numel())


def checkpoint_tensors(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "checkpoints" / f"step-{step}" / "model.safetensors"))


@pytest.mark.slow
@distributed
def test_two_processes_train_as_one_and_resume_across_process_counts(tmp_path):
    one = run(tmp_path / "one", None).state_dict()
    torchrun(WORKER, str(tmp_path / "ddp"), str(tmp_path / "one" / "checkpoints" / "step-3"), cwd=tmp_path)
    fresh, resumed = (torch.load(tmp_path / "ddp" / name / "final.pt") for name in ("fresh", "resumed"))
    assert max_difference(one, fresh) <= TOLERANCE
    assert max_difference(one, resumed) <= TOLERANCE  # a one-process checkpoint, resumed under 2 processes
    for name, changes in VARIANTS.items():
        alone = run(tmp_path / f"one-{name}", None, **changes).state_dict()
        assert max_difference(alone, torch.load(tmp_path / "ddp" / name / "final.pt")) <= TOLERANCE, name

    # The frozen nodes did not move after the switch (step 2) under DDP: as at the checkpoint of step 3.
    ddp_run = tmp_path / "ddp" / "fresh"
    at_3, at_6 = checkpoint_tensors(ddp_run, 3), checkpoint_tensors(ddp_run, 6)
    frozen = [k for k in at_3 if k.endswith(("frozen_weight", "frozen_bias")) or "embeddings" in k]
    assert frozen and all(torch.equal(at_3[k], at_6[k]) for k in frozen)
    # ... and a checkpoint of 2 processes goes on in one, to the same weights.
    again = run(tmp_path / "again", None, resume_from=ddp_run / "checkpoints" / "step-3").state_dict()
    assert max_difference(one, again) <= TOLERANCE

    # The first process wrote the log and the result, as one process does.
    lines = [json.loads(line) for line in (ddp_run / "log.jsonl").read_text().splitlines()]
    reference = [json.loads(line) for line in (tmp_path / "one" / "log.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [line["step"] for line in reference]
    assert all(abs(a["loss"] - b["loss"]) < 1e-4 for a, b in zip(lines, reference, strict=True))
    assert abs(lines[-1]["eval"]["loss"] - reference[-1]["eval"]["loss"]) < 1e-4
    assert (
        json.loads((ddp_run / "result.json").read_text()).keys()
        == json.loads((tmp_path / "one" / "result.json").read_text()).keys()
    )


def test_each_process_takes_its_share_of_every_batch():
    stream = BatchStream(list(range(10)), 4, list, seed=0)  # batches of 4, 4 and 2 examples
    shares = [next(stream.batches(0, Parallel(rank, 3).share)) for rank in range(3)]
    whole = next(stream.batches(0))[0]
    assert [piece.examples for share in shares for piece in share] == [1, 1, 2]
    assert sum((share[0].batch for share in shares), []) == whole.batch
    assert all(share[0].whole == 4 for share in shares)
    # A batch smaller than the processes: the first gets a piece of 0 examples, which weighs nothing.
    last = [next(stream.batches(2, Parallel(rank, 3).share)) for rank in range(3)]
    assert [share[0].examples for share in last] == [0, 1, 1] and all(share[0].whole == 2 for share in last)


def test_one_process_is_the_plain_operation():
    parallel = Parallel()
    model = torch.nn.Linear(2, 2)
    assert not parallel.active and parallel.wrap(model) is model and parallel.sum(1.5) == 1.5
    assert parallel.on_main(lambda x: x + 1, 1) == 2 and parallel.seed(7) == 7
    with pytest.raises(ValueError, match="rank 2 is not one of the 2 processes"):
        Parallel(2, 2)


@pytest.fixture(scope="module")
def no_dropout_model_dir(tmp_path_factory, minilm_path):
    """A tiny seeded BERT without dropout, with MiniLM's tokenizer, as a Hugging Face folder."""
    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    config = BertConfig(**{**TINY, "vocab_size": tokenizer.vocab_size}, max_position_embeddings=64, **NO_DROPOUT)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-bert-no-dropout")
    BertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.slow
@distributed
@pytest.mark.parametrize("distributed_as", ["ddp", "fsdp"])
def test_far_train_under_torchrun_writes_what_one_process_writes(tmp_path, no_dropout_model_dir, distributed_as):
    words = "good great fine bad awful dull".split()
    rows = [{"text": f"{words[i % 6]} {words[i * 5 % 6]} film", "label": ["pos", "neg"][i % 6 >= 3]} for i in range(24)]
    train, dev = write_rows(tmp_path / "train.csv", rows), write_rows(tmp_path / "dev.csv", rows[:8])
    arguments = ["train", "--train-file", str(train), "--validation-file", str(dev), "--no-progress"]
    arguments += ["--model", str(no_dropout_model_dir), "--max-steps", "4", "--batch-size", "8", "--lr", "1e-2"]
    arguments += ["--max-length", "16"]
    arguments += ["--checkpoint-every", "2"]
    assert main([*arguments, "--output-dir", str(tmp_path / "one")]) == 0
    two = ["--output-dir", str(tmp_path / "two"), "--distributed", distributed_as]
    torchrun("-m", "far.cli.main", *arguments, *two, cwd=tmp_path)

    one, two = (json.loads((tmp_path / name / "metrics.json").read_text()) for name in ("one", "two"))
    assert one.keys() == two.keys() and one["files"].keys() == two["files"].keys()
    assert one["steps"] == two["steps"] == 4 and one["learner_shares"] == two["learner_shares"]
    assert all(abs(one["metrics"][k] - two["metrics"][k]) < 1e-4 for k in one["metrics"])
    weights = [load_file(str(tmp_path / name / "model" / "model.safetensors")) for name in ("one", "two")]
    assert max_difference(*weights) <= TOLERANCE
    assert len(list((tmp_path / "two" / "checkpoints").glob("step-*"))) == 2  # written once, by the first process


@pytest.mark.slow
@distributed
def test_processes_that_disagree_stop_and_an_error_of_the_first_reaches_the_others(tmp_path):
    torch.multiprocessing.spawn(disagree_and_fail, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2)
    for rank in (0, 1):
        scores, failed = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert "the priming scores differ between the processes (largest gap 3" in scores
        assert "every process must start from the same model and options" in scores
    assert json.loads((tmp_path / "rank-0.json").read_text())[1] == "ValueError: no room on the disk"
    assert json.loads((tmp_path / "rank-1.json").read_text())[1] == (
        "PeerError: the first process failed: ValueError: no room on the disk"
    )
