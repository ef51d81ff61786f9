"""The export folder's layout and its manifest: what every reader of the folder (Python or C++) relies on.

OUT/manifest.json       this file's `read_manifest` format (docs/device.md has every field)
OUT/train.pte           the training program: forward, backward, gradients and trainable tensors
OUT/bottom.pte          the frozen bottom, forward only (present when the manifest says "bottom")
OUT/generate.pte        a causal LM's greedy decoding step over a KV cache (present when the manifest says "generate")
OUT/tokenizer.json      the model's tokenizer (Hugging Face tokenizers format)
OUT/state.safetensors   the trainable tensors at step 0 (`far.device.state`)

A manifest's `objective` says what its programs train (`OBJECTIVES`): a sequence classifier's
labels ("classification", also a manifest without the field) or a causal LM's next tokens
("next_token", `far.device.lm_export`). Every reader names the objective it takes, and refuses
a folder of the other.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from safetensors import safe_open
from torch import Tensor

from far.storage.atomic import file_sha256 as sha256_file  # the name the export's readers use

FORMAT = "far.device"
FORMAT_VERSION = 2  # 2: micro-batches (micro_batch_size, accumulate) and the optimizer's own settings
MANIFEST, TRAIN, BOTTOM, TOKENIZER, STATE = (
    "manifest.json",
    "train.pte",
    "bottom.pte",
    "tokenizer.json",
    "state.safetensors",
)
GENERATE = "generate.pte"  # a causal LM's decoding step, written on request (far.device.lm_generate)
PROGRAM_FILES = {"train": TRAIN, "bottom": BOTTOM, "generate": GENERATE}


# What an export's programs train, and where such a folder comes from (for the refusal of the wrong one).
CLASSIFICATION, NEXT_TOKEN = "classification", "next_token"
OBJECTIVES = {
    CLASSIFICATION: "a sequence classifier's labels (far export --executorch OUT --checkpoint DIR)",
    NEXT_TOKEN: "a causal LM's next tokens (far export --executorch OUT --model NAME)",
}


class DeviceFileError(ValueError):
    """A file of an export folder, or one made for it, that cannot be used: damaged, foreign or mismatched."""


def read_manifest(out_dir: str | os.PathLike, *, verify_programs: bool = True, objective: str = CLASSIFICATION) -> dict:
    """The manifest of an export folder, checked: format, version, objective, and the programs' sha256 if asked.

    Args:
        objective: What the reader trains (a key of `OBJECTIVES`): a folder of another is refused.

    Raises:
        DeviceFileError: not an export folder, an unknown version, another objective, or a program
            file that is not the one the manifest records (changed or damaged since the export).
    """
    out_dir = Path(out_dir)
    path = out_dir / MANIFEST
    if not path.is_file():
        raise DeviceFileError(
            f"{str(out_dir)!r} is not an ExecuTorch export folder (no {MANIFEST}); write one with "
            "far.device.export_executorch or far export --executorch"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise DeviceFileError(f"{str(path)!r} is not readable JSON ({error}); export the folder again") from error
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DeviceFileError(f"{str(path)!r} is not a far.device manifest (format {manifest.get('format')!r})")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise DeviceFileError(
            f"{str(path)!r} has format version {manifest.get('format_version')!r}; this far reads version "
            f"{FORMAT_VERSION}: export the folder again with this far"
        )
    found = manifest.get("objective", CLASSIFICATION)
    if found != objective:
        what = OBJECTIVES.get(found) if isinstance(found, str) else None
        raise DeviceFileError(
            f"{str(out_dir)!r} is an export that trains {what or repr(found)[:80]}; this reader takes one that "
            f"trains {OBJECTIVES[objective]}"
        )
    _check_fields(manifest, path)
    if verify_programs:
        for role, program in manifest["programs"].items():
            file = out_dir / program["file"]
            if not file.is_file():
                raise DeviceFileError(f"the export folder {str(out_dir)!r} lacks its {role} program {program['file']}")
            if sha256_file(file) != program["sha256"]:
                raise DeviceFileError(
                    f"{str(file)!r} is not the {role} program the manifest records (its sha256 differs: changed or "
                    "damaged since the export); export the folder again"
                )
    return manifest


def _check_fields(manifest: dict, path: Path) -> None:
    """The fields every reader of the folder relies on, of the right types; program files named inside the folder.

    A manifest may come from anywhere (a folder copied to a phone): a program named `../x.pte` or `/etc/...` must
    not be read, and a reader must meet a field it expects, not a KeyError deep inside a training step.
    """

    def bad(field: str, why: str) -> DeviceFileError:
        return DeviceFileError(f"{str(path)!r}: {field} {why}; export the folder again")

    def whole(value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 31

    programs = manifest.get("programs")
    if not isinstance(programs, dict) or "train" not in programs:
        raise bad("programs", "must name the training program")
    for role, program in programs.items():
        file, digest = (program.get("file"), program.get("sha256")) if isinstance(program, dict) else (None, None)
        if not isinstance(file, str) or not 0 < len(file) < 256 or file != Path(file).name or file in (".", ".."):
            raise bad(f"programs.{role}.file", f"must be a file name inside the folder, not {str(file)[:80]!r}")
        if not isinstance(digest, str) or len(digest) != 64:
            raise bad(f"programs.{role}.sha256", "must be a sha256 in hex")
    for field in ("batch_size", "max_length", "vocab_size"):
        if not whole(manifest.get(field)):
            raise bad(field, f"must be a positive whole number, not {str(manifest.get(field))[:80]!r}")
    optimizer = manifest.get("optimizer")
    if not isinstance(optimizer, dict) or not isinstance(optimizer.get("name"), str):
        raise bad("optimizer", "must name the optimizer")
    if manifest.get("objective", CLASSIFICATION) == NEXT_TOKEN:
        if "bottom" not in programs or not whole(manifest.get("frozen_layers")):
            raise bad("programs", "must name the bottom program of the frozen layers (frozen_layers > 0)")
        if not isinstance(manifest.get("lean_config"), dict):
            raise bad("lean_config", "must be the causal LM's config")
    else:
        task = manifest.get("task")
        if not isinstance(task, dict) or not whole(task.get("num_labels")) or not isinstance(task.get("kind"), str):
            raise bad("task", "must hold kind and num_labels")
        config = manifest.get("model_config", {})
        if not isinstance(config, dict) or not whole(config.get("type_vocab_size", 2)):
            raise bad("model_config", "must be the model's config, with a positive type_vocab_size")
    if not isinstance(manifest.get("base_fingerprint"), str):
        raise bad("base_fingerprint", "must be the base model's fingerprint")
    trainable = manifest.get("trainable")
    if not isinstance(trainable, list) or not all(
        isinstance(spec, dict)
        and isinstance(spec.get("name"), str)
        and isinstance(spec.get("dtype"), str)
        and isinstance(spec.get("shape"), list)
        and all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 31 for d in spec["shape"])
        for spec in trainable
    ):
        raise bad("trainable", "must list each tensor's name, shape and dtype")


def read_safetensors(path: Path, advice: str = "") -> tuple[dict[str, str], dict[str, Tensor]]:
    """(metadata, tensors) of a safetensors file (nothing is ever unpickled); a DeviceFileError if unreadable."""
    try:
        with safe_open(path, framework="pt") as f:
            return f.metadata() or {}, {key: f.get_tensor(key) for key in f.keys()}
    except Exception as error:  # SafetensorError and OSError alike
        raise DeviceFileError(
            f"{str(path)!r} is not a readable safetensors file (truncated or damaged?): {error}{advice}"
        ) from error


def program_sha256(manifest: dict) -> str:
    """The training program's sha256: what a state file is tied to."""
    return manifest["programs"]["train"]["sha256"]


def tensor_spec(name: str, shape, dtype: str) -> dict:
    return {"name": name, "shape": [int(d) for d in shape], "dtype": dtype}


def write_json_into(folder: Path, name: str, obj: dict) -> None:
    """`obj` as indented JSON in `folder` (a folder being written atomically as a whole)."""
    text = json.dumps(obj, indent=2, ensure_ascii=False, default=str)  # a config may hold a dtype
    (folder / name).write_text(text + "\n", encoding="utf-8")
