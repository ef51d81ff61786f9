"""Packages whose public names are imported on first use (PEP 562), so a process pays only for what it uses.

The lean LLM path (`far glue --model smollm2-135m`) must stay clear of `datasets` and
transformers' model code (more resident memory between them than the model's weights:
docs/design.md, "Resident memory"); a package `__init__` that imported every submodule eagerly would pull them in with
the first `import far`.

    >>> _LAZY = {"finetune": "far.training.finetune"}
    >>> __getattr__, __dir__ = lazy_names(__name__, _LAZY)
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable, Mapping


class _LazyPackage(types.ModuleType):
    """A package module whose public name wins over a submodule of the same name.

    Importing `far.recipes.predict` makes the import system set the package attribute `predict` to that
    submodule, hiding the function of the same name that the lazy table names. This sets the function
    instead whenever the submodule gets imported, so that `far.recipes.predict` is the function, as an
    eager `from far.recipes.predict import predict` in the `__init__` would make it.
    """

    _lazy_table: Mapping[str, str] = {}

    def __setattr__(self, name: str, value: object) -> None:
        if isinstance(value, types.ModuleType) and self._lazy_table.get(name) == value.__name__:
            value = getattr(value, name, value)
        super().__setattr__(name, value)


def lazy_names(package: str, table: Mapping[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """`(__getattr__, __dir__)` for a package that imports `table[name]` (a module) when `name` is first used."""
    module = sys.modules[package]
    module.__class__ = _LazyPackage
    module._lazy_table = dict(table)

    def __getattr__(name: str) -> object:
        source = table.get(name)
        if source is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source), name)
        setattr(module, name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(module)) | set(table))

    return __getattr__, __dir__
