"""Memory hints for memory-bound runs: they change residency, never values."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from conftest import tiny_causal_lm
from transformers import AutoModelForCausalLM

from far.training.memory import page_out, page_out_after_forward, release_freed_memory, to_private_memory

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise/mallopt hints are Linux/glibc only")


def rss_file_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssFile:"))


@pytest.fixture
def mapped(tmp_path):
    """A 16 MB float32 tensor privately memory-mapped from a file, fully read once."""
    path = tmp_path / "weights.bin"
    values = torch.arange(4 << 20, dtype=torch.float32)
    values.numpy().tofile(path)
    tensor = torch.from_file(str(path), shared=False, size=values.numel(), dtype=torch.float32)
    assert torch.equal(tensor, values)  # reads every page
    return tensor, values


@linux
def test_page_out_drops_read_file_pages_and_keeps_the_values(mapped):
    tensor, values = mapped
    before = rss_file_bytes()
    assert page_out(tensor) >= 16e6 - 8192  # whole pages only
    assert rss_file_bytes() < before - 8e6
    assert torch.equal(tensor, values)  # read back from the file
    assert page_out(torch.zeros(10)) == 0  # less than a whole page


# A second process that maps the file and reads every page, then waits for its stdin to close.
READER = (
    "import mmap, sys; f = open(sys.argv[1], 'rb'); m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ); "
    "sum(m[i] for i in range(0, len(m), 4096)); print('ready', flush=True); sys.stdin.read()"
)


@linux
def test_page_out_drops_pages_another_process_shares_and_never_reverts_writes(mapped, tmp_path):
    tensor, values = mapped
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(tmp_path / "weights.bin")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert reader.stdout.readline().strip() == "ready"  # the pages are shared now: not reclaimable
        tensor[:1024] = -1.0  # written pages become this mapping's own (anonymous) copies
        before = rss_file_bytes()
        page_out(tensor)
        assert rss_file_bytes() < before - 8e6  # unmapped here, though the reader keeps them
        expected = values.clone()
        expected[:1024] = -1.0
        assert torch.equal(tensor, expected)
    finally:
        reader.stdin.close()
        reader.wait()


@linux
def test_page_out_after_forward_keeps_outputs_and_can_be_removed(mapped):
    tensor, values = mapped
    embedding = torch.nn.Embedding(values.numel() // 64, 64)
    embedding.weight = torch.nn.Parameter(tensor.view(-1, 64), requires_grad=False)
    ids = torch.tensor([[0, 5, 60_000]])
    handle = page_out_after_forward(embedding)
    before = rss_file_bytes()
    out = embedding(ids)
    assert torch.equal(out, values.view(-1, 64)[ids])
    assert rss_file_bytes() < before - 8e6  # the pages read by the fixture are gone after the forward
    handle.remove()
    assert not embedding._forward_hooks


@linux
def test_release_freed_memory_takes():
    assert release_freed_memory() is True


def test_to_private_memory_copies_in_place_and_keeps_ties(tmp_path):
    tiny_causal_lm("llama", num_hidden_layers=1).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)  # memory-mapped safetensors
    names = ["model.layers.0.mlp.up_proj.weight", "model.embed_tokens.weight"]
    params = [model.get_parameter(n) for n in names]
    old = [(p.data_ptr(), p.detach().clone()) for p in params]
    to_private_memory(model, names)
    for name, p, (ptr, value) in zip(names, params, old, strict=True):
        assert model.get_parameter(name) is p and p.data_ptr() != ptr and torch.equal(p, value)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ptr = params[0].data_ptr()
    with pytest.raises(AttributeError):
        to_private_memory(model, ["model.layers.0.mlp.up_proj.weight", "no.such.weight"])
    assert params[0].data_ptr() == ptr  # all names are checked before anything moves
