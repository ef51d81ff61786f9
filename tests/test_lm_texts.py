"""A user's texts for a causal LM: reading (folders, .txt/.md/.jsonl), bad input, packing and the held-out split."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import BPE

from far.data.texts import Document, load_text_chunks, pack, read_texts, split_and_pack, tokenize
from far.llm.tokenizer import LeanTokenizer

EOS = 1


def char_tokenizer() -> LeanTokenizer:
    """One token per printable ASCII character, <unk> 0 and </s> 1: 97 tokens, the tiny test models' vocabulary."""
    vocab = {"<unk>": 0, "</s>": EOS, **{chr(c): c - 30 for c in range(32, 127)}}
    return LeanTokenizer(Tokenizer(BPE(vocab, [], unk_token="<unk>")), pad_token_id=EOS, eos_token_id=EOS)


def test_a_folder_is_read_recursively_in_sorted_order_and_other_files_are_skipped(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "two.md").write_text("# two")
    (tmp_path / "a.txt").write_text("one")
    (tmp_path / "c.jsonl").write_text(json.dumps({"text": "three"}) + "\n\n" + json.dumps({"text": "four"}) + "\n")
    (tmp_path / "skip.csv").write_text("not,a,text")
    documents = read_texts(tmp_path)
    assert [d.text for d in documents] == ["one", "# two", "three", "four"]
    assert documents[3].source == f"{tmp_path / 'c.jsonl'}:3"
    assert [d.text for d in read_texts(tmp_path / "a.txt")] == ["one"]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.txt", b"  \n", "is empty"),
        ("binary.txt", b"abc\x00\x01\x02", "NUL byte at offset 3"),
        (
            "latin1.txt",
            "caf\u00e9 au lait".encode("latin-1"),
            "not UTF-8 (byte 0xe9 at offset 3); convert it with iconv",
        ),
        ("rows.jsonl", b'{"text": "fine"}\n{"body": "no text"}\n', 'rows.jsonl:2 has no string "text" field'),
        ("rows.jsonl", b'{"text": "fine"}\nnot json\n', "rows.jsonl:2 is not a JSON object"),
        ("notes.docx", b"PK\x03\x04", "is not a .txt, .md or .jsonl file"),
    ],
)
def test_bad_files_are_refused_naming_the_file_and_what_is_wrong(tmp_path, name, content, message):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ValueError) as error:
        read_texts(tmp_path / name)
    assert message in str(error.value) and name in str(error.value)


def test_a_bad_file_in_a_folder_is_named_and_a_missing_path_or_empty_folder_refused(tmp_path):
    (tmp_path / "good.txt").write_text("fine")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "bad.md").write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match=r"bad\.md is not UTF-8"):
        read_texts(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_texts(tmp_path / "nope")
    (tmp_path / "none").mkdir()
    with pytest.raises(ValueError, match="holds no .txt, .md or .jsonl file"):
        read_texts(tmp_path / "none")


def test_documents_are_tokenised_with_eos_after_each_and_packed_into_full_chunks():
    tokenizer = char_tokenizer()
    lists = tokenize(read_texts_of(["ab", "cde"]), tokenizer)
    assert lists == [[ord("a") - 30, ord("b") - 30, EOS], [ord("c") - 30, ord("d") - 30, ord("e") - 30, EOS]]
    chunks = pack(lists, 3)
    assert chunks.tolist() == [[67, 68, EOS], [69, 70, 71]]  # 7 tokens: two chunks of 3, the last token dropped
    with pytest.raises(ValueError, match="hold 7 tokens, fewer than one chunk of --max-length 8"):
        pack(lists, 8)


def read_texts_of(texts: list[str]) -> list[Document]:
    return [Document(f"doc{i}", t) for i, t in enumerate(texts)]


def test_whole_documents_are_held_out_by_seed_and_never_trained_on():
    lists = [[10 + i] * 20 for i in range(20)]  # 20 documents of 20 tokens, each its own token
    train, held, how = split_and_pack(lists, 10, holdout=0.1, seed=3)
    assert how == "documents"
    assert set(train.unique().tolist()).isdisjoint(held.unique().tolist())
    assert len(held) == 4 and len(train) == 36  # 2 of 20 documents
    again = split_and_pack(lists, 10, holdout=0.1, seed=3)
    assert torch.equal(again[1], held)
    assert not torch.equal(split_and_pack(lists, 10, holdout=0.1, seed=4)[1], held)


def test_one_document_is_split_by_chunks_and_too_little_text_is_refused():
    train, held, how = split_and_pack([list(range(100))], 10, holdout=0.1, seed=0)
    assert how == "chunks" and len(train) == 9 and len(held) == 1
    assert sorted(train.flatten().tolist() + held.flatten().tolist()) == list(range(100))
    with pytest.raises(ValueError, match="make 1 chunk of --max-length 10 tokens; holding a part out needs 2"):
        split_and_pack([list(range(15))], 10)


def test_load_text_chunks_with_and_without_a_validation_file(tmp_path):
    tokenizer = char_tokenizer()
    (tmp_path / "train").mkdir()
    for i in range(10):
        (tmp_path / "train" / f"{i}.txt").write_text(f"note {i}: " + "the quick brown fox " * 3)
    (tmp_path / "dev.txt").write_text("jumps over the lazy dog " * 4)
    held = load_text_chunks(tmp_path / "train", tokenizer, 16, seed=0)
    assert held.info["held_out"] == "documents" and held.info["documents"] == 10
    assert held.train.shape[1] == held.validation.shape[1] == 16
    given = load_text_chunks(tmp_path / "train", tokenizer, 16, validation_path=tmp_path / "dev.txt")
    assert given.info["held_out"] is None and len(given.validation) == 97 // 16
    with pytest.raises(ValueError, match=r"the validation texts \(.*dev.txt\) hold 97 tokens, fewer than one chunk"):
        load_text_chunks(tmp_path / "train", tokenizer, 128, validation_path=tmp_path / "dev.txt")
