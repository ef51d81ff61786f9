"""GGUF files as ordinary Hugging Face folders: dequantised once, cached, memory-mapped after that.

The cache (`$FAR_CACHE`, else `$XDG_CACHE_HOME/far`, else `~/.cache/far`) is keyed by the file's sha256.
Dequantising peaks at about twice the fp32 model, so by default it runs in a child process and the
caller's own peak RSS never sees it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from far.storage.atomic import atomic_dir, file_sha256

CACHE_ENV = "FAR_CACHE"
SOURCE_FILE = "far_gguf.json"  # written into each cache folder: which GGUF it was built from


def default_cache_dir() -> Path:
    """`$FAR_CACHE`, else `$XDG_CACHE_HOME/far`, else `~/.cache/far`."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "far"


def gguf_cache_path(gguf_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where the dequantised copy of `gguf_path` lives: `<cache>/<file stem>-<sha256[:16]>` (keyed by content)."""
    gguf_path = Path(gguf_path)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return root / f"{gguf_path.stem}-{file_sha256(gguf_path)[:16]}"


def is_cache_complete(folder: Path) -> bool:
    # atomic_dir renames a folder into place only once it is whole, so the source record written
    # last is enough; the weights and config are checked too in case someone deleted files.
    return all((folder / name).is_file() for name in (SOURCE_FILE, "config.json", "model.safetensors"))


def _check_gguf_reader() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ModuleNotFoundError(
            "reading a GGUF file needs the package 'gguf'; install it with: pip install gguf", name="gguf"
        )


def build_gguf_cache(gguf_path: str | os.PathLike, target: str | os.PathLike) -> Path:
    """Dequantise `gguf_path` into an HF folder at `target` (model + tokenizer), atomically."""
    # transformers' model code is imported here only: the lean runtime reads caches without it.
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    _check_gguf_reader()
    gguf_path = Path(gguf_path).resolve()
    folder, name = str(gguf_path.parent), gguf_path.name
    # dequantize=True: plain nn.Linear weights even where a GGUF matmul kernel is installed, since FAR
    # splits Linear layers and MeZO perturbs dense weights.
    model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, quantization_config=GgufConfig(dequantize=True), dtype=torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config  # the copy is a plain dense checkpoint
    with atomic_dir(target) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        record = {"gguf": name, "sha256": file_sha256(gguf_path), "size": gguf_path.stat().st_size}
        (tmp / SOURCE_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return Path(target)


def ensure_gguf_cache(
    gguf_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None, *, isolate: bool = True
) -> Path:
    """The cached dequantised folder of `gguf_path`, built first if missing.

    Args:
        gguf_path: A `.gguf` file.
        cache_dir: Cache root; default `default_cache_dir()`.
        isolate: Build in a child process, so that dequantisation's memory peak stays out of this
            process (whose peak RSS a memory benchmark may be reading).

    Returns:
        The folder, loadable with `AutoModelForCausalLM.from_pretrained` and `AutoTokenizer`.
    """
    target = gguf_cache_path(gguf_path, cache_dir)
    if is_cache_complete(target):
        return target
    _check_gguf_reader()
    if not isolate:
        return build_gguf_cache(gguf_path, target)
    code = "import sys; from far.llm.gguf import build_gguf_cache; build_gguf_cache(sys.argv[1], sys.argv[2])"
    done = subprocess.run([sys.executable, "-c", code, str(gguf_path), str(target)], capture_output=True, text=True)
    if done.returncode != 0 or not is_cache_complete(target):
        raise RuntimeError(f"building the dequantised cache of {gguf_path} at {target} failed:\n{done.stderr[-3000:]}")
    return target
