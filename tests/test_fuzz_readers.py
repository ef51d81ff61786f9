"""Files from strangers: mutated learners files, GGUF files, cached tokenizers (tokenizer.json and
far_tokenizer.json) and examples files (CSV, TSV, JSON, JSONL) are refused with far's own error and change nothing.

Each reader gets a few hundred mutations of a valid file, drawn from a fixed seed: truncations, flipped bits,
absurd header lengths, and header fields (shapes, offsets, dtypes, counts) set to values a hostile file would
hold; JSON nested past any stack, keys given twice, numbers no machine type holds, lines of megabytes. What a
reader may do: load a file that is still valid, or raise its documented error. What it may not:
any other exception (an IndexError, a RuntimeError from torch, a MemoryError), a change to the model, or a hang.
The slow tier runs 1,000 mutations of each.
"""

from __future__ import annotations

import json
import math
import os
import random
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import tiny_model, write_rows
from test_llm_lean import tiny_hf, write_gguf
from tokenizers import Tokenizer
from tokenizers.models import BPE

import far
import far.llm.tokenizer as tokenizer_module
from far.data.files import load_text_files
from far.data.table import DataFileError
from far.llm.gguf import CACHE_ENV, gguf_cache_path
from far.llm.gguf_file import GGUFFileError, load_lean_model
from far.llm.tokenizer import (
    SPECIAL_FILE,
    TOKENIZER_FILE,
    TokenizerCacheError,
    load_gguf_tokenizer,
    read_tokenizer_cache,
)
from far.saving.learners_file import LearnersFileError


def safetensors_mutations(raw: bytes, seed: int, count: int) -> list[bytes]:
    """Mutations of a safetensors file: its 8-byte header length, its JSON header's fields, its bytes."""
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    names = [name for name in header if name != "__metadata__"]
    rng = random.Random(seed)
    out = []
    for i in range(count):
        kind = i % 7
        data = bytearray(raw)
        if kind == 0:  # truncated anywhere
            out.append(bytes(data[: rng.randrange(len(data))]))
            continue
        if kind == 1:  # a few flipped bits
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            out.append(bytes(data))
            continue
        if kind == 2:  # a header length that lies
            data[:8] = struct.pack("<Q", rng.choice([0, 1, length - 1, length + 1, len(raw), 2**60, 2**64 - 1]))
            out.append(bytes(data))
            continue
        fields = json.loads(json.dumps(header))
        name = rng.choice(names)
        if kind == 3:
            fields[name]["shape"] = [rng.choice([0, 1, 2**31, 2**40, 2**62])] + fields[name]["shape"][1:]
        elif kind == 4:
            fields[name]["data_offsets"] = [rng.choice([0, 8, 2**40]), rng.choice([0, 4, 2**41])]
        elif kind == 5:
            fields[name]["dtype"] = rng.choice(["F64", "I8", "BOOL", "U64", "F16", "X"])
        else:  # the metadata's own fields: a config, a format or a digest a hostile file would claim
            meta = fields.setdefault("__metadata__", {})
            key = rng.choice(sorted(meta) or ["format"])
            meta[key] = rng.choice(["", "{", "[]", "null", "1e999", "x" * 1000, json.dumps({"retention": 2.0})])
        text = json.dumps(fields).encode()
        text += b" " * (-len(text) % 8)
        out.append(struct.pack("<Q", len(text)) + text + raw[8 + length :])
    return out


def byte_mutations(raw: bytes, seed: int, count: int) -> list[bytes]:
    """Mutations of a binary file with no header of its own to aim at: truncations, flipped bits, large numbers."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        data = bytearray(raw)
        if i % 3 == 0:
            out.append(bytes(data[: rng.randrange(len(data))]))
            continue
        for _ in range(rng.randint(1, 6)):
            at = rng.randrange(min(len(data), 4096) if i % 3 == 1 else len(data))  # headers and counts live up front
            if i % 2:
                data[at] ^= 1 << rng.randrange(8)
            else:
                data[at : at + 8] = rng.choice([b"\xff" * 8, struct.pack("<Q", 2**40), struct.pack("<Q", 2**62)])
        out.append(bytes(data[: len(raw)]))
    return out


COUNTS = pytest.mark.parametrize("count", [300, pytest.param(1000, marks=pytest.mark.slow)])


def fuzz(files: list[bytes], folder: Path, read: Callable[[Path], object], allowed: tuple[type, ...]) -> dict:
    """Every file read once: {"read": n, "refused": n}; anything but `allowed` fails the test with the case."""
    outcome = {"read": 0, "refused": 0}
    for i, data in enumerate(files):
        path = folder / f"case-{i}"
        path.write_bytes(data)
        started = time.perf_counter()
        try:
            read(path)
            outcome["read"] += 1
        except allowed as error:
            assert str(error), f"case {i}: an empty message"
            outcome["refused"] += 1
        except Exception as error:  # noqa: BLE001 - what the test exists to catch
            pytest.fail(f"case {i} ({len(data)} bytes): {type(error).__name__}: {str(error)[:300]}")
        assert time.perf_counter() - started < 5, f"case {i} took too long"
        path.unlink()
    return outcome


@COUNTS
def test_mutated_learners_files_are_refused_and_the_model_is_unchanged(tmp_path, count):
    model = far.reconfigure(tiny_model("bert"), 0.4, selection="random", seed=3)
    for p in model.parameters():
        if p.requires_grad:
            p.data.add_(0.01)
    raw = far.save_learners(model, tmp_path / "alice.safetensors").read_bytes()
    base = tiny_model("bert")
    before = {k: v.clone() for k, v in base.state_dict().items()}

    def read(path: Path) -> None:
        far.load_learners(base, path)
        far.unload_learners(base)

    outcome = fuzz(safetensors_mutations(raw, seed=count, count=count), tmp_path, read, (LearnersFileError,))
    assert outcome["refused"] >= count * 0.9, outcome  # the content digest catches nearly every change
    assert base.state_dict().keys() == before.keys()
    assert all(torch.equal(v, before[k]) for k, v in base.state_dict().items())


@COUNTS
def test_mutated_gguf_files_are_refused_with_a_message(tmp_path, count):
    path = tmp_path / "tiny.gguf"
    write_gguf(tiny_hf("llama"), path)
    raw = path.read_bytes()
    outcome = fuzz(byte_mutations(raw, seed=count, count=count), tmp_path, load_lean_model, (GGUFFileError, OSError))
    assert outcome["refused"] > 0, outcome


def json_mutations(value: object, seed: int, count: int) -> list[bytes]:
    """Mutations of a JSON document: a field removed, or set to another type, an absurd number or a long string."""
    rng = random.Random(seed)
    paths = []

    def walk(node: object, path: tuple) -> None:
        paths.append(path)
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in items:
            walk(child, (*path, key))

    walk(value, ())
    out = []
    for i in range(count):
        doc = json.loads(json.dumps(value))
        path = rng.choice(paths[1:])
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        if i % 4 == 0 and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = rng.choice([None, -1, 2**62, 1e308, "", "x" * 10_000, [], {}, [2**40] * 3, True])
        text = json.dumps(doc)
        out.append((text[: rng.randrange(len(text))] if i % 9 == 8 else text).encode())
    return out


def hostile_json(doc: object, seed: int, count: int) -> list[bytes]:
    """JSON a hostile file would hold: nesting past any stack, repeated keys, absurd numbers, long strings, binary."""
    rng = random.Random(seed)
    text = json.dumps(doc)
    out = []
    for i in range(count):
        kind = i % 6
        if kind == 0:  # nested far deeper than any parser's stack
            depth = rng.choice([1_000, 100_000])
            out.append(text.replace("{", "{" + '"x": ' + "[" * depth + "]" * depth + ", ", 1).encode())
        elif kind == 1:  # every object's first key repeated with another value
            out.append(
                text.replace(
                    "{", '{"' + rng.choice(["label", "text", "model", "version", "type"]) + '": 7, ', 1
                ).encode()
            )
        elif kind == 2:  # numbers no machine type holds
            number = rng.choice(["1e999", "-1e999", "NaN", "Infinity", "1" + "0" * 5000, "-0", "18446744073709551616"])
            out.append(text.replace(": ", ": " + number + ", " + '"n": ', 1).encode())
        elif kind == 3:  # one absurdly long line
            out.append(text.replace('"', '"' + "x" * rng.choice([200_000, 2_000_000]), 1).encode())
        elif kind == 4:  # binary bytes anywhere
            data = bytearray(text.encode())
            at = rng.randrange(len(data))
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 32)))
            out.append(bytes(data))
        else:  # the document cut anywhere
            out.append(text.encode()[: rng.randrange(len(text))])
    return out


def _cached_tokenizer(folder: Path) -> tuple[bytes, bytes]:
    """(tokenizer.json, far_tokenizer.json) of a small byte-level BPE tokenizer, as `build_tokenizer_cache` writes."""
    vocab = {"<unk>": 0, "</s>": 1, **{chr(c): c - 30 for c in range(32, 127)}, "th": 97, "the": 98}
    tokenizer = Tokenizer(BPE(vocab, [("t", "h"), ("th", "e")], unk_token="<unk>"))
    tokenizer.add_special_tokens(["</s>"])
    tokenizer.save(str(folder / TOKENIZER_FILE))
    special = json.dumps({"pad_token_id": 1, "eos_token_id": 1, "gguf": "tiny.gguf"}).encode()
    return (folder / TOKENIZER_FILE).read_bytes(), special


@COUNTS
def test_mutated_cached_tokenizers_are_refused_before_any_id_leaves_the_vocabulary(tmp_path, count):
    cache = tmp_path / "cache"
    cache.mkdir()
    tokenizer_json, special = _cached_tokenizer(cache)
    doc = json.loads(tokenizer_json)
    n = count // 5
    targeted = [  # what a hostile cache would hold: ids past the vocabulary, padding to 2**40 tokens
        tokenizer_json.replace(b'"the":98', b'"the":2147483648'),
        tokenizer_json.replace(b'"id":1,', b'"id":4294967294,'),  # tokenizers numbers added tokens itself
        json.dumps(
            {
                **doc,
                "padding": {
                    "strategy": {"Fixed": 2**40},
                    "direction": "Right",
                    "pad_to_multiple_of": None,
                    "pad_id": 0,
                    "pad_type_id": 0,
                    "pad_token": "<unk>",
                },
            }
        ).encode(),
    ]
    cases = {
        TOKENIZER_FILE: targeted
        + json_mutations(doc, seed=count, count=2 * n)
        + hostile_json(doc, seed=count, count=n)
        + byte_mutations(tokenizer_json, seed=count, count=n),
        SPECIAL_FILE: json_mutations(json.loads(special), seed=count + 1, count=n // 2)
        + hostile_json(json.loads(special), seed=count + 1, count=count - 4 * n - n // 2 - len(targeted)),
    }

    def read(path: Path) -> None:
        tokenizer = read_tokenizer_cache(cache)
        ids = tokenizer("the cat sat on the mat")["input_ids"] + [tokenizer.pad_token_id, tokenizer.eos_token_id or 0]
        size = tokenizer.tokenizer.get_vocab_size(with_added_tokens=True)
        assert all(0 <= i < size for i in ids), f"ids {ids} past a vocabulary of {size}"
        tokenizer.decode(ids)

    outcome = {"read": 0, "refused": 0}
    for name, files in cases.items():
        (cache / TOKENIZER_FILE).write_bytes(tokenizer_json)
        (cache / SPECIAL_FILE).write_bytes(special)

        def place(path: Path, name=name) -> None:
            (cache / name).write_bytes(path.read_bytes())
            read(path)

        for key, value in fuzz(files, tmp_path, place, (TokenizerCacheError,)).items():
            outcome[key] += value
    assert sum(outcome.values()) == count and outcome["refused"] > 0, outcome


@pytest.mark.parametrize(
    ("file", "change", "message"),
    [
        # tokenizers panics in Rust (pyo3's PanicException, no Exception) on a subword prefix longer than a token
        (TOKENIZER_FILE, lambda d: d["model"].update(continuing_subword_prefix="x" * 10_000), "unreadable"),
        (TOKENIZER_FILE, lambda d: d["model"]["vocab"].update(the=2**31), "past its own vocabulary"),
        (SPECIAL_FILE, lambda d: d.update(pad_token_id=500), "past its own vocabulary"),
        (SPECIAL_FILE, lambda d: d.update(eos_token_id=True), "whole numbers"),
    ],
    ids=["rust-panic", "vocab-id", "pad-id", "eos-bool"],
)
def test_a_damaged_cached_tokenizer_is_refused(tmp_path, file, change, message):
    tokenizer_json, special = _cached_tokenizer(tmp_path)
    doc = json.loads(tokenizer_json if file == TOKENIZER_FILE else special)
    change(doc)
    (tmp_path / SPECIAL_FILE).write_bytes(special)
    (tmp_path / file).write_text(json.dumps(doc))
    with pytest.raises(TokenizerCacheError, match=message):
        read_tokenizer_cache(tmp_path)


def test_a_cached_special_file_nested_past_the_stack_is_refused(tmp_path):
    _cached_tokenizer(tmp_path)
    (tmp_path / SPECIAL_FILE).write_text('{"pad_token_id": 1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(TokenizerCacheError, match="unreadable"):  # json.loads: RecursionError
        read_tokenizer_cache(tmp_path)


def test_a_damaged_cached_tokenizer_is_converted_again_from_the_gguf_file(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF, as far as the cache's key is concerned")
    folder = Path(f"{gguf_cache_path(gguf)}-tokenizer")
    folder.mkdir(parents=True)
    tokenizer_json, special = _cached_tokenizer(folder)
    (folder / SPECIAL_FILE).write_bytes(special)
    (folder / TOKENIZER_FILE).write_bytes(tokenizer_json[: len(tokenizer_json) // 2])  # cut by a crash or a stranger
    converted = []

    def convert(path, target: Path) -> None:  # what the child process's conversion writes
        converted.append(path)
        _cached_tokenizer(target)
        (target / SPECIAL_FILE).write_bytes(special)

    monkeypatch.setattr(tokenizer_module, "_convert", convert)
    tokenizer = load_gguf_tokenizer(gguf)
    assert converted == [gguf] and "converting the tokenizer of" in caplog.text
    assert tokenizer("the")["input_ids"] == [98]
    assert load_gguf_tokenizer(gguf)("the")["input_ids"] == [98] and converted == [gguf]  # intact: read, not redone


EXAMPLES = [{"text": f"review {i}: the film was {('dull', 'fine', 'great')[i % 3]}", "label": ("neg", "pos")[i % 2]}
            for i in range(12)]  # fmt: skip


def table_mutations(raw: bytes, suffix: str, seed: int, count: int) -> list[bytes]:
    """Mutations of an examples file: its bytes, and what a hostile file would hold in its format."""
    rng = random.Random(seed)
    lines = raw.decode().splitlines(keepends=True)
    out = byte_mutations(raw, seed, count // 3)
    if suffix in (".json", ".jsonl"):
        # nesting, repeated keys, absurd numbers, long lines, fields removed or retyped: the whole list, or in
        # JSON Lines one line among valid ones
        if suffix == ".json":
            return (
                out
                + hostile_json(EXAMPLES[:3], seed, count // 3)
                + json_mutations(EXAMPLES[:4], seed, count - len(out) - count // 3)
            )
        cases = hostile_json(EXAMPLES[0], seed, count // 3) + json_mutations(
            EXAMPLES[0], seed, count - len(out) - count // 3
        )
        return out + ["".join(lines[:4]).encode().replace(b"}\n", b"}\n" + case + b"\n", 1) for case in cases]
    while len(out) < count:  # CSV/TSV: a line replaced by something absurd
        data = list(lines)
        at = rng.randrange(len(data))
        kind = len(out) % 5
        if kind == 0:
            data[at] = "x" * rng.choice([200_000, 2_000_000]) + "\n"  # one line past the csv module's field limit
        elif kind == 1:
            data[at] = '"' + "unclosed" * 1000 + "\n"
        elif kind == 2:
            data[at] = "\x00\x01\x7f" * 10 + "\n"
        elif kind == 3:  # a regression file (every label a number), one label a number no float holds
            sep = "," if suffix == ".csv" else "\t"
            data[1:] = [line.rsplit(sep, 1)[0] + f"{sep}{i * 0.5}\n" for i, line in enumerate(data[1:])]
            at = rng.randrange(1, len(data))
            number = rng.choice(["1e999", "NaN", "-inf", "Infinity", "1" + "0" * 5000, "0x10", "1_0"])
            data[at] = data[at].rsplit(sep, 1)[0] + f"{sep}{number}\n"
        else:
            data[at] = data[at].rstrip("\n") + ("," if suffix == ".csv" else "\t") * rng.randint(1, 100) + "\n"
        out.append("".join(data).encode())
    return out


@COUNTS
def test_mutated_examples_files_are_refused_with_a_data_file_error(tmp_path, count):
    outcome = {"read": 0, "refused": 0}
    formats = (".csv", ".tsv", ".json", ".jsonl")
    for n, suffix in enumerate(formats):
        valid = write_rows(tmp_path / f"valid{suffix}", EXAMPLES)
        target = tmp_path / f"train{suffix}"

        def read(path: Path, target=target) -> None:
            target.unlink(missing_ok=True)
            os.link(path, target)  # the reader goes by the file's suffix
            data = load_text_files(target, target)
            if data.labels.kind == "regression":
                assert all(math.isfinite(v) for v in data.train["label"]), "a label that is no number"

        cases = table_mutations(valid.read_bytes(), suffix, seed=count + n, count=count // 4 + (n < count % 4))
        for key, value in fuzz(cases, tmp_path, read, (DataFileError,)).items():
            outcome[key] += value
    assert sum(outcome.values()) == count and outcome["refused"] > count // 2, outcome


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        # json.loads raised RecursionError, no DataFileError
        ("deep.jsonl", '{"text": ' + "[" * 100_000 + "]" * 100_000 + ', "label": "pos"}\n', "nests arrays"),
        # json kept the last of two values without a word
        (
            "twice.jsonl",
            '{"text": "a", "label": "pos", "label": "neg"}\n{"text": "b", "label": "neg"}\n',
            "more than once",
        ),
        # NaN and Infinity are no JSON, which Python's json takes
        ("nan.json", '[{"text": "a", "label": NaN}, {"text": "b", "label": 1.5}]', "no JSON number"),
        # an integer of more digits than Python converts raised a bare ValueError
        ("digits.jsonl", '{"text": "a", "label": 1' + "0" * 5000 + '}\n{"text": "b", "label": 2}\n', "digits"),
        # a regression label that parses as a float but is no finite number trained on NaN
        ("inf.csv", "text,label\na,1e999\nb,0.5\n", "no finite number"),
        ("nan.tsv", "text\tlabel\na\t0.5\nb\tnan\n", "no finite number"),
    ],
    ids=["deep", "repeated-key", "nan-literal", "digits", "inf-label", "nan-label"],
)
def test_an_examples_file_a_stranger_wrote_is_refused_with_a_data_file_error(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(DataFileError, match=message):
        load_text_files(path, path)


@pytest.mark.slow
def test_a_converted_tokenizer_passes_its_checks_and_a_damaged_one_is_converted_again(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    gguf = tmp_path / "tiny.gguf"
    write_gguf(tiny_hf("llama"), gguf, [chr(c) for c in range(33, 127)] + ["Ġ", "Ċ", "<|endoftext|>"])
    ids = load_gguf_tokenizer(gguf)("Hello world")["input_ids"]  # transformers' conversion, in a child process
    folder = Path(f"{gguf_cache_path(gguf)}-tokenizer")
    (folder / TOKENIZER_FILE).write_bytes((folder / TOKENIZER_FILE).read_bytes()[:100])
    assert load_gguf_tokenizer(gguf)("Hello world")["input_ids"] == ids
    assert read_tokenizer_cache(folder)("Hello world")["input_ids"] == ids
