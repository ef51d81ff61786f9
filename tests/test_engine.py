"""The training engine: the order of a step's parts, the cadence, the log kept across a resume."""

from __future__ import annotations

import json

import pytest

from far.training.engine import Cadence, Start, train


class Recorder:
    """A runner that takes no real step: it records what the engine asks of it, in order."""

    def __init__(self, start: Start, switch_at: int | None = None, expected: float | None = None) -> None:
        self.start, self.switch_at, self.expected, self.calls = start, switch_at, expected, []

    def begin(self) -> Start:
        self.calls.append("begin")
        return self.start

    def rehearse(self, first: int) -> float | None:
        self.calls.append(f"rehearse {first}")
        return self.expected

    def step(self, step: int) -> dict:
        self.calls.append(f"step {step}")
        return {"step": step + 1, "loss": 1.0 / (step + 1)}

    def switch(self, done: int, record: dict) -> None:
        if done == self.switch_at:
            self.calls.append(f"switch {done}")
            record["trainable_parameters"] = 7

    def evaluate(self, done: int) -> dict[str, float]:
        self.calls.append(f"evaluate {done}")
        return {"score": float(done)}

    def measures(self) -> dict[str, float]:
        return {"elapsed": 0.0}

    def save(self, done: int) -> None:
        self.calls.append(f"save {done}")


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_step_is_taken_switched_scored_logged_and_saved_in_that_order(tmp_path):
    runner, seen = Recorder(Start(0, opening={"step": 0, "eval": {"score": 0.0}}), switch_at=2), []
    cadence = Cadence(4, eval_every=2, log_every=3, checkpoint_every=2)
    train(runner, cadence, tmp_path / "log.jsonl", progress=False, on_step=lambda r: seen.append(r["step"]))
    assert runner.calls == [
        "begin",
        "rehearse 0",
        "step 0",
        "step 1", "switch 2", "evaluate 2", "save 2",
        "step 2",
        "step 3", "evaluate 4", "save 4",
    ]  # fmt: skip
    # Logged: the opening line, step 2 (the switch's record and a score), 3 (log_every) and the last.
    assert [line["step"] for line in lines(tmp_path / "log.jsonl")] == [0, 2, 3, 4]
    assert lines(tmp_path / "log.jsonl")[1] == {
        "step": 2, "loss": 0.5, "trainable_parameters": 7, "eval": {"score": 2.0}, "elapsed": 0.0
    }  # fmt: skip
    assert seen == [1, 2, 3, 4]


@pytest.mark.parametrize(
    "cadence, scored, saved",
    [
        (Cadence(6), [6], []),
        (Cadence(6, evaluate=False, checkpoint_every=4), [], [4, 6]),
        (Cadence(6, epoch_steps=3, eval_every=4, checkpoint_every=2, checkpoint_last=False), [3, 4, 6], [2, 4]),
        (Cadence(6, eval_every=0, checkpoint_every=0), [6], []),
    ],
)
def test_the_cadence_says_when_to_score_and_to_save(cadence, scored, saved):
    assert [done for done in range(1, 7) if cadence.evaluates(done)] == scored
    assert [done for done in range(1, 7) if cadence.checkpoints(done)] == saved


def test_a_resumed_run_keeps_its_log_up_to_the_checkpoint_and_writes_no_opening_line(tmp_path):
    log = tmp_path / "log.jsonl"
    train(Recorder(Start(0, opening={"step": 0})), Cadence(5), log, progress=False)
    assert [line["step"] for line in lines(log)] == [0, 1, 2, 3, 4, 5]
    runner = Recorder(Start(3, resumed=True, opening={"step": 0}))
    train(runner, Cadence(5), log, progress=False)
    assert runner.calls[:3] == ["begin", "rehearse 3", "step 3"]
    assert [line["step"] for line in lines(log)] == [0, 1, 2, 3, 4, 5]


def test_a_cadence_out_of_range_is_refused():
    with pytest.raises(ValueError, match="log_every >= 1"):
        Cadence(4, log_every=0)


def test_the_run_says_its_steps_and_their_estimate_before_the_first_and_again_after_the_switch(caplog):
    caplog.set_level("INFO", logger="far.training.engine")
    runner = Recorder(Start(0), switch_at=2, expected=150.0)
    train(runner, Cadence(5), None, progress=False)
    said = [r.getMessage() for r in caplog.records if r.name == "far.training.engine"]
    assert runner.calls[:3] == ["begin", "rehearse 0", "step 0"]  # the estimate is made before the first step
    assert (
        said[0] == "5 steps to take: about 2.5 min (a piece of the first step timed; evaluation and checkpoints aside)"
    )
    assert said[1].startswith("step 3 took ") and "for the 2 steps left" in said[1]  # FAR's steps, after the switch
    assert said[2].startswith("the 5 steps took ") and said[2].endswith("(estimated before the first: 2.5 min)")
    assert len(said) == 3


def test_a_runner_that_cannot_rehearse_has_its_first_step_timed_instead(caplog):
    caplog.set_level("INFO", logger="far.training.engine")
    train(Recorder(Start(0), switch_at=2), Cadence(5), None, progress=False)
    said = [r.getMessage() for r in caplog.records if r.name == "far.training.engine"]
    assert said[0] == "5 steps to take; an estimate follows the first"
    assert said[1].startswith("step 1 took ") and said[1].endswith(
        "for the 4 steps left (evaluation and checkpoints aside)"
    )
    assert said[2].startswith("step 3 took ") and "for the 2 steps left" in said[2]
    assert len(said) == 3
    caplog.clear()
    train(Recorder(Start(3, resumed=True)), Cadence(5), None, progress=False)
    assert [r.getMessage() for r in caplog.records][
        0
    ] == "2 steps to take, from step 4 of 5; an estimate follows the first"


def test_a_finished_run_is_not_rehearsed():
    runner = Recorder(Start(5, resumed=True), expected=1.0)
    train(runner, Cadence(5), None, progress=False)
    assert runner.calls == ["begin"]
