"""SQuAD v1.1 and v2.0 scores on plain lists of dicts, following the official evaluation scripts.

Answers are compared after normalisation (lower case, no punctuation, no articles a/an/the, single
spaces); each question scores the maximum over its reference answers. In v2.0 a question with no
reference answer is answered correctly only by the empty string. `far.evaluation.metrics.Squad` and
`SquadV2` wrap these as `evaluate` modules.

    >>> squad_scores([{"id": "q", "prediction_text": "the Broncos"}],
    ...              [{"id": "q", "answers": {"text": ["Denver Broncos"], "answer_start": [0]}}])
    {'exact_match': 0.0, 'f1': 66.66...}
"""

from __future__ import annotations

import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower case, drop punctuation, drop the articles a/an/the, collapse whitespace (official SQuAD order)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(truth))


def token_f1(prediction: str, truth: str) -> float:
    """Bag-of-tokens F1 of two answers; two empty answers agree (v2.0), one empty answer scores 0."""
    pred_tokens, true_tokens = normalize_answer(prediction).split(), normalize_answer(truth).split()
    if not pred_tokens or not true_tokens:
        return float(pred_tokens == true_tokens)
    same = sum((Counter(pred_tokens) & Counter(true_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(true_tokens)
    return 2 * precision * recall / (precision + recall)


def _by_id(predictions, references) -> tuple[dict, list]:
    ids = [r["id"] for r in references]
    if len(set(ids)) != len(ids):
        raise ValueError("references have duplicate question ids")
    if not references:
        raise ValueError("cannot compute SQuAD scores on zero questions")
    return {p["id"]: p for p in predictions}, ids


def squad_scores(predictions, references) -> dict[str, float]:
    """SQuAD v1.1: `{"exact_match": %, "f1": %}`; a question without a prediction scores 0."""
    by_id, ids = _by_id(predictions, references)
    em = f1 = 0.0
    for reference in references:
        if reference["id"] not in by_id:
            continue
        prediction = by_id[reference["id"]]["prediction_text"]
        truths = reference["answers"]["text"]
        em += max(exact_match(prediction, t) for t in truths)
        # v1.1's script scores an empty prediction 0 even against an empty answer.
        f1 += max(token_f1(prediction, t) for t in truths) if normalize_answer(prediction) else 0.0
    return {"exact_match": 100.0 * em / len(ids), "f1": 100.0 * f1 / len(ids)}


def squad_v2_scores(predictions, references, no_answer_threshold: float = 1.0) -> dict[str, float]:
    """SQuAD v2.0, as the official script (see `far.evaluation.metrics.SquadV2` for the keys)."""
    by_id, ids = _by_id(predictions, references)
    has_answer, texts, na_probs = {}, {}, {}
    raw = {"exact": {}, "f1": {}}  # before the no-answer threshold: what the best-threshold scan needs
    exact, f1 = {}, {}
    for reference in references:
        qid = reference["id"]
        truths = [t for t in reference["answers"]["text"] if normalize_answer(t)] or [""]
        has_answer[qid] = truths != [""]
        if qid not in by_id:
            continue
        texts[qid] = by_id[qid]["prediction_text"]
        na_probs[qid] = float(by_id[qid]["no_answer_probability"])
        raw["exact"][qid] = max(exact_match(texts[qid], t) for t in truths)
        raw["f1"][qid] = max(token_f1(texts[qid], t) for t in truths)
        predicted_no_answer = na_probs[qid] > no_answer_threshold
        exact[qid] = float(not has_answer[qid]) if predicted_no_answer else raw["exact"][qid]
        f1[qid] = float(not has_answer[qid]) if predicted_no_answer else raw["f1"][qid]

    results = {
        "exact": 100.0 * sum(exact.values()) / len(ids),
        "f1": 100.0 * sum(f1.values()) / len(ids),
        "total": len(ids),
    }
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        subset = [q for q in ids if has_answer[q] == wanted]
        if subset:
            results[f"{prefix}_exact"] = 100.0 * sum(exact.get(q, 0.0) for q in subset) / len(subset)
            results[f"{prefix}_f1"] = 100.0 * sum(f1.get(q, 0.0) for q in subset) / len(subset)
            results[f"{prefix}_total"] = len(subset)
    for name, scores in raw.items():
        best, threshold = _best_threshold(texts, scores, na_probs, has_answer, len(ids))
        results[f"best_{name}"], results[f"best_{name}_thresh"] = best, threshold
    return results


def _best_threshold(texts, scores, na_probs, has_answer, total) -> tuple[float, float]:
    """The no-answer threshold that maximises the score, scanning questions by rising probability (official)."""
    score = best = sum(1 for answerable in has_answer.values() if not answerable)  # everything abstained
    threshold = 0.0
    for qid in sorted(na_probs, key=na_probs.get):
        if has_answer[qid]:
            score += scores[qid]
        elif texts[qid]:
            score -= 1
        if score > best:
            best, threshold = score, na_probs[qid]
    return 100.0 * best / total, threshold
