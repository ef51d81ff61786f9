"""SQuAD post-processing: per-window start/end logits -> the best answer text per question.

For each window the `n_best` highest start and end logits are paired; a pair is a candidate when
both tokens lie in the context (their offsets are not None), end >= start, and the span is at most
`max_answer_length` tokens. The question's answer is its best-scoring candidate over all windows.
For SQuAD v2.0 the "no answer" score (start + end logit of token 0, [CLS], lowest over windows) is
compared with the best span: the answer is "" when null - best > `null_score_diff_threshold`.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from far.storage.atomic import write_json


@dataclass
class QAPredictions:
    """Post-processed answers: `texts` {question id: answer}, `null_odds` {id: null score - best span score}."""

    texts: dict[str, str]
    null_odds: dict[str, float]

    def for_metric(self, version_2: bool = False) -> list[dict]:
        """Predictions in the form the SQuAD `evaluate` modules take (no-answer already decided: probability 0)."""
        if version_2:
            return [{"id": k, "prediction_text": v, "no_answer_probability": 0.0} for k, v in self.texts.items()]
        return [{"id": k, "prediction_text": v} for k, v in self.texts.items()]


def postprocess_qa_predictions(
    examples: Sequence[Mapping] | object,
    features: Sequence[Mapping] | object,
    start_logits: Sequence[np.ndarray],
    end_logits: Sequence[np.ndarray],
    *,
    n_best: int = 20,
    max_answer_length: int = 30,
    version_2: bool = False,
    null_score_diff_threshold: float = 0.0,
) -> QAPredictions:
    """Pick each question's answer span from its windows' logits.

    Args:
        examples: the questions (rows with "id" and "context"), e.g. a `datasets.Dataset`.
        features: the evaluation windows (rows with "example_id" and "offset_mapping"), as
            `far.data.squad.prepare_eval_features` makes them.
        start_logits, end_logits: one 1-D array per window (its own length: windows are not padded).
        n_best: how many top start and end positions to pair per window.
        max_answer_length: longest answer, in tokens.
        version_2: allow "no answer" (SQuAD v2.0).
        null_score_diff_threshold: v2.0 only; answer "" when null score - best span score exceeds it.

    Returns:
        `QAPredictions` with an answer for every example ("" when no valid span exists).
    """
    if len(start_logits) != len(features) or len(end_logits) != len(features):
        raise ValueError(
            f"need one start and one end logit array per feature: {len(features)} features, "
            f"{len(start_logits)} start and {len(end_logits)} end arrays"
        )
    if n_best < 1 or max_answer_length < 1:
        raise ValueError(f"n_best and max_answer_length must be positive, got {n_best} and {max_answer_length}")
    if hasattr(features, "column_names"):  # a datasets.Dataset: read each column once, not row by row
        example_ids, all_offsets = features["example_id"], features["offset_mapping"]
    else:
        example_ids, all_offsets = [f["example_id"] for f in features], [f["offset_mapping"] for f in features]
    windows = defaultdict(list)
    for i, example_id in enumerate(example_ids):
        windows[example_id].append(i)

    texts, null_odds = {}, {}
    for example in examples:
        qid, context = example["id"], example["context"]
        best_score, best_text, null_score = -np.inf, "", np.inf
        for i in windows.get(qid, ()):
            offsets = all_offsets[i]
            starts, ends = np.asarray(start_logits[i], dtype=np.float64), np.asarray(end_logits[i], dtype=np.float64)
            if len(starts) != len(offsets) or len(ends) != len(offsets):
                raise ValueError(f"feature {i}: {len(offsets)} tokens but {len(starts)} start / {len(ends)} end logits")
            null_score = min(null_score, starts[0] + ends[0])
            span = _best_span(starts, ends, offsets, n_best, max_answer_length)
            if span is not None and span[0] > best_score:
                best_score, (s, e) = span[0], span[1:]
                best_text = context[offsets[s][0] : offsets[e][1]]
        null_odds[qid] = float(null_score - best_score) if np.isfinite(best_score) else float("inf")
        texts[qid] = "" if version_2 and null_odds[qid] > null_score_diff_threshold else best_text
    return QAPredictions(texts, null_odds)


def _best_span(
    starts: np.ndarray, ends: np.ndarray, offsets: Sequence, n_best: int, max_length: int
) -> tuple[float, int, int] | None:
    """(score, start, end) of the best valid span among the top-`n_best` starts x top-`n_best` ends."""
    in_context = np.array([o is not None for o in offsets])
    top_starts = np.argsort(-starts, kind="stable")[:n_best]  # (k,)
    top_ends = np.argsort(-ends, kind="stable")[:n_best]  # (k,)
    s, e = np.meshgrid(top_starts, top_ends, indexing="ij")  # (k, k) every pairing
    valid = in_context[s] & in_context[e] & (e >= s) & (e - s + 1 <= max_length)
    if not valid.any():
        return None
    scores = np.where(valid, starts[s] + ends[e], -np.inf)
    k = int(np.argmax(scores))  # ties: the first in (start rank, end rank) order, as run_qa's sort
    return float(scores.flat[k]), int(s.flat[k]), int(e.flat[k])


def write_predictions(
    predictions: QAPredictions, path: str | os.PathLike, null_odds_path: str | os.PathLike | None = None
) -> None:
    """Write `{question_id: answer_text}` JSON (the official format), atomically; optionally the null odds too
    (infinite odds, where no span is valid, as null)."""
    write_json(path, predictions.texts)
    if null_odds_path is not None:
        write_json(null_odds_path, predictions.null_odds)
