"""Packages whose public names are imported on first use (PEP 562), so a process pays only for what it uses.

The lean LLM path must stay clear of `datasets` and transformers' model code (more resident memory than
the model's weights: docs/design.md, "Resident memory"), which an eager package `__init__` would pull in.

    >>> lazy_face(__name__, {"far.training.finetune": ("finetune",), "far.training.mezo": ("MeZO",)})

`lazy_face` sets the package's `__all__`, `__getattr__` and `__dir__`: a face states its table and nothing else.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Iterable, Mapping


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


def lazy_face(package: str, table: Mapping[str, Iterable[str]]) -> None:
    """Make `package` import each name of `table[module]` from `module` when the name is first used.

    Args:
        package: the package's `__name__` (its `__init__` calls this).
        table: a module (a submodule, or another far package) -> the public names the package takes from it.

    Sets the package's `__all__` (every name, sorted), and its `__getattr__` and `__dir__` (PEP 562).
    """
    source_of = {name: source for source, names in table.items() for name in names}
    module = sys.modules[package]
    module.__class__ = _LazyPackage
    module._lazy_table = source_of

    def __getattr__(name: str) -> object:
        source = source_of.get(name)
        if source is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source), name)
        setattr(module, name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(module)) | set(source_of))

    module.__all__ = sorted(source_of)
    module.__getattr__ = __getattr__
    module.__dir__ = __dir__
