"""SQuAD v1.1 / v2.0 as `datasets` splits (local JSON or the hub), the article split, and QA features.

Offline only SQuAD's dev file is at hand, so `load_squad` can split one file by article (the last
`holdout_articles` are evaluated), no article on both sides. Features follow run_qa.py: overlapping
question + context windows; training features carry answer positions ([CLS] when outside the
window), evaluation features `example_id` and an `offset_mapping` that is None outside the context.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import datasets

from far.data.locate import find_local
from far.data.mapping import map_batches

logger = logging.getLogger(__name__)

VERSIONS = {
    "1.1": ("train-v1.1.json", "dev-v1.1.json", "rajpurkar/squad"),
    "2.0": ("train-v2.0.json", "dev-v2.0.json", "rajpurkar/squad_v2"),
}
DEFAULT_HOLDOUT_ARTICLES = 10
EVAL_ONLY_COLUMNS = ("example_id", "offset_mapping")

FEATURES = datasets.Features(
    {
        "id": datasets.Value("string"),
        "title": datasets.Value("string"),
        "context": datasets.Value("string"),
        "question": datasets.Value("string"),
        "answers": {
            "text": datasets.List(datasets.Value("string")),
            "answer_start": datasets.List(datasets.Value("int32")),
        },
    }
)


def read_squad_json(path: str | os.PathLike) -> datasets.Dataset:
    """Flatten an official SQuAD JSON file into one row per question (the hub's columns, in file order)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"SQuAD file {path} does not exist")
    try:
        with open(path, encoding="utf-8") as f:
            articles = json.load(f)["data"]
        rows = {name: [] for name in FEATURES}
        for article in articles:
            for paragraph in article["paragraphs"]:
                context = paragraph["context"]
                for qa in paragraph["qas"]:
                    answers = [] if qa.get("is_impossible") else qa["answers"]
                    rows["id"].append(qa["id"])
                    rows["title"].append(article["title"])
                    rows["context"].append(context)
                    rows["question"].append(qa["question"])
                    rows["answers"].append(
                        {"text": [a["text"] for a in answers], "answer_start": [a["answer_start"] for a in answers]}
                    )
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not a JSON file: {e}") from None
    except (KeyError, TypeError) as e:
        raise ValueError(
            f"{path} is not in SQuAD's format ({{'data': [{{'title', 'paragraphs': [{{'context', "
            f"'qas': [{{'id', 'question', 'answers'}}]}}]}}]}}): missing or bad field {e}"
        ) from None
    if not rows["id"]:
        raise ValueError(f"{path} holds no questions")
    return datasets.Dataset.from_dict(rows, features=FEATURES)


def split_by_article(
    dataset: datasets.Dataset, holdout_articles: int = DEFAULT_HOLDOUT_ARTICLES
) -> datasets.DatasetDict:
    """Split questions by article: the last `holdout_articles` articles (file order) are "validation".

    Deterministic and independent of any training seed, so every run of a comparison sees the same split.
    """
    titles = list(dict.fromkeys(dataset["title"]))  # articles in file order
    if not isinstance(holdout_articles, int) or not 0 < holdout_articles < len(titles):
        raise ValueError(
            f"holdout_articles must be an integer from 1 to {len(titles) - 1} (the data has "
            f"{len(titles)} articles), got {holdout_articles!r}"
        )
    held = set(titles[-holdout_articles:])
    is_held = [t in held for t in dataset["title"]]
    return datasets.DatasetDict(
        {
            "train": dataset.select([i for i, h in enumerate(is_held) if not h]),
            "validation": dataset.select([i for i, h in enumerate(is_held) if h]),
        }
    )


def load_squad(
    version: str = "1.1",
    data_dir: str | os.PathLike | None = None,
    *,
    train_file: str | os.PathLike | None = None,
    eval_file: str | os.PathLike | None = None,
    holdout_articles: int | None = None,
) -> datasets.DatasetDict:
    """Load SQuAD "train" and "validation" splits.

    The evaluation file is `eval_file`, else `dev-v<version>.json` in `<data_dir>/squad/` or
    `<data_dir>/` (data_dir defaults to $FAR_DATA_DIR). With `train_file` the two files are the
    splits; without it the evaluation file is split by article (`holdout_articles`, default 10). With
    no local file at all, the hub's train/validation splits are used unless the hub is offline.

    Raises:
        FileNotFoundError: a named file, or the data dir, does not exist; or nothing local and offline.
        ValueError: a file not in SQuAD's format, or a bad `holdout_articles`.
    """
    if version not in VERSIONS:
        raise ValueError(f"unknown SQuAD version {version!r}; choose one of {', '.join(VERSIONS)}")
    if train_file is not None and holdout_articles is not None:
        raise ValueError("give either a training file or holdout_articles (splitting one file by article), not both")
    _, dev_name, hub_name = VERSIONS[version]
    if eval_file is None:
        eval_file = find_local(
            data_dir,
            "squad",
            dev_name,
            what=f"SQuAD v{version} file {dev_name}",
            hint=f"Point --data-dir or $FAR_DATA_DIR at a folder with squad/{dev_name}, name the file with "
            "--eval-file, or unset HF_DATASETS_OFFLINE to use the hub.",
        )
        if eval_file is None:
            return _load_from_hub(hub_name, train_file, holdout_articles)
    evaluation = read_squad_json(eval_file)
    if train_file is not None:
        return datasets.DatasetDict({"train": read_squad_json(train_file), "validation": evaluation})
    return split_by_article(evaluation, DEFAULT_HOLDOUT_ARTICLES if holdout_articles is None else holdout_articles)


def _load_from_hub(hub_name: str, train_file, holdout_articles: int | None) -> datasets.DatasetDict:
    loaded = datasets.load_dataset(hub_name)
    evaluation = loaded["validation"].cast(FEATURES)
    if holdout_articles is not None:
        return split_by_article(evaluation, holdout_articles)
    train = read_squad_json(train_file) if train_file is not None else loaded["train"].cast(FEATURES)
    return datasets.DatasetDict({"train": train, "validation": evaluation})


def _check_tokenizer(tokenizer, max_length: int, doc_stride: int) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"SQuAD features need a fast tokenizer (offset mappings); {type(tokenizer).__name__} is not")
    if not 0 <= doc_stride < max_length // 2:
        raise ValueError(f"doc_stride must be at least 0 and under half of max_length ({max_length}), got {doc_stride}")


def _tokenize(examples: dict[str, list], tokenizer, max_length: int, doc_stride: int):
    # Question first, context second, unless the tokenizer pads on the left (then context first).
    pad_on_right = tokenizer.padding_side == "right"
    questions = [q.lstrip() for q in examples["question"]]  # some SQuAD questions start with spaces
    first, second = (questions, examples["context"]) if pad_on_right else (examples["context"], questions)
    encoded = tokenizer(
        first,
        second,
        truncation="only_second" if pad_on_right else "only_first",
        max_length=max_length,
        stride=doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
    )
    return encoded, (1 if pad_on_right else 0)


def prepare_train_features(
    examples: dict[str, list], tokenizer, max_length: int = 384, doc_stride: int = 128
) -> dict[str, list]:
    """Batched `Dataset.map` function: windows with `start_positions`/`end_positions` token labels.

    A window that does not contain the whole (first) answer, and an unanswerable question, point at
    the [CLS] token (index 0 when the tokenizer has none).
    """
    _check_tokenizer(tokenizer, max_length, doc_stride)
    encoded, context_id = _tokenize(examples, tokenizer, max_length, doc_stride)
    sample_map = encoded.pop("overflow_to_sample_mapping")
    offsets_per_feature = encoded.pop("offset_mapping")
    encoded["start_positions"], encoded["end_positions"] = [], []
    for i, offsets in enumerate(offsets_per_feature):
        input_ids = encoded["input_ids"][i]
        cls_index = input_ids.index(tokenizer.cls_token_id) if tokenizer.cls_token_id in input_ids else 0
        sequence_ids = encoded.sequence_ids(i)
        answers = examples["answers"][sample_map[i]]
        start = end = cls_index
        if answers["answer_start"]:
            start_char = answers["answer_start"][0]
            end_char = start_char + len(answers["text"][0])
            context = [k for k, s in enumerate(sequence_ids) if s == context_id]  # token span of the context
            first, last = context[0], context[-1]
            if offsets[first][0] <= start_char and offsets[last][1] >= end_char:
                # Walk in from both ends of the context to the tokens that hold the answer's characters.
                start = first
                while start <= last and offsets[start][0] <= start_char:
                    start += 1
                end = last
                while end >= first and offsets[end][1] >= end_char:
                    end -= 1
                start, end = start - 1, end + 1
        encoded["start_positions"].append(start)
        encoded["end_positions"].append(end)
    return encoded


def prepare_eval_features(
    examples: dict[str, list], tokenizer, max_length: int = 384, doc_stride: int = 128
) -> dict[str, list]:
    """Batched `Dataset.map` function: windows with `example_id` and context-only `offset_mapping`.

    `offset_mapping[i]` is the (start, end) character span of token i in the context, or None for
    question and special tokens, so post-processing can never return a span outside the context.
    """
    _check_tokenizer(tokenizer, max_length, doc_stride)
    encoded, context_id = _tokenize(examples, tokenizer, max_length, doc_stride)
    sample_map = encoded.pop("overflow_to_sample_mapping")
    encoded["example_id"] = []
    for i in range(len(encoded["input_ids"])):
        sequence_ids = encoded.sequence_ids(i)
        encoded["example_id"].append(examples["id"][sample_map[i]])
        encoded["offset_mapping"][i] = [
            tuple(o) if sequence_ids[k] == context_id else None for k, o in enumerate(encoded["offset_mapping"][i])
        ]
    return encoded


def _features(dataset: datasets.Dataset, prepare, tokenizer, max_length: int, doc_stride: int, desc: str):
    return map_batches(
        dataset,
        prepare,
        remove_columns=dataset.column_names,
        fn_kwargs=dict(tokenizer=tokenizer, max_length=max_length, doc_stride=doc_stride),
        desc=desc,
    )


def squad_train_dataset(
    dataset: datasets.Dataset, tokenizer, max_length: int = 384, doc_stride: int = 128
) -> datasets.Dataset:
    """Tokenise a split into training features (model inputs + start/end positions only)."""
    return _features(dataset, prepare_train_features, tokenizer, max_length, doc_stride, "SQuAD training features")


def squad_eval_dataset(
    dataset: datasets.Dataset, tokenizer, max_length: int = 384, doc_stride: int = 128
) -> datasets.Dataset:
    """Tokenise a split into evaluation features (model inputs + `example_id` + `offset_mapping`)."""
    return _features(dataset, prepare_eval_features, tokenizer, max_length, doc_stride, "SQuAD evaluation features")
