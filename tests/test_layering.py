"""The package imports only downward: the layer table below is the architecture, and the test holds it.

Read from the source (AST), nothing is imported. Third-party imports are free; an import of a
`far` module counts wherever it stands, and inside a function it fails outright: deferring an
import hides a cycle instead of removing it.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "far"

# Lowest first. A module may import its own layer and the layers before it, never one after it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("far.storage", "far.config", "far.hardware", "far.lazy", "far.seeds")),
    ("split layers", ("far.split_ops", "far.layers")),
    ("FFN discovery", ("far.architectures", "far.freezing", "far.summary")),
    # cost models read a model's shapes and split layers; experiments use them
    ("analysis", ("far.analysis",)),
    ("priming and selection", ("far.priming", "far.selection")),
    # FAR's core: the surgery's checked input and what a reconfigured model records (read-only), then the
    # verbs that rewrite the model; `far.surgery` itself is a lazy face that imports nothing
    ("surgery's input and record", ("far.surgery", "far.surgery.inputs", "far.surgery.state", "far.surgery.portable")),
    ("surgery", ("far.surgery.reconfigure",)),
    ("saving", ("far.saving",)),
    # `far` itself is the public API: core, saving and training. far.llm is the lean causal-LM runtime,
    # far.encoder the lean BERT runtime.
    ("training", ("far.training", "far.llm", "far.encoder", "far")),
    ("data", ("far.data",)),
    ("evaluation", ("far.evaluation",)),
    ("models and methods", ("far.methods", "far.models")),
    # ExecuTorch export and training of a reconfigured model: reads far's core, saving and data files
    ("device runtime", ("far.device",)),
    ("recipes", ("far.recipes", "far.plotting")),
    ("command line", ("far.cli",)),
]


def layer_of(module: str) -> int:
    """Index in LAYERS of the longest prefix that names `module` (a module or one of its parents)."""
    best, rank = -1, None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), index
    if rank is None:
        raise AssertionError(f"{module} is in no layer; add it to LAYERS in tests/test_layering.py")
    return rank


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def far_imports(tree: ast.AST) -> list[tuple[str, int, bool]]:
    """(imported far module, line, inside a function) for every import of a far module in `tree`."""
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, in_function) for a in child.names if a.name.split(".")[0] == "far")
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and (child.module or "").split(".")[0] == "far":
                for alias in child.names:  # `from far.evaluation import metrics` imports a module
                    sub = f"{child.module}.{alias.name}"
                    is_module = (ROOT / Path(*sub.split(".")) / "__init__.py").is_file() or (
                        ROOT / Path(*sub.split("."))
                    ).with_suffix(".py").is_file()
                    found.append((sub if is_module else child.module, child.lineno, in_function))
            visit(child, inner)

    visit(tree, False)
    return found


SOURCES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_import_only_their_own_layer_and_below(path):
    name = module_name(path)
    own = layer_of(name)
    for target, line, in_function in far_imports(ast.parse(path.read_text(), str(path))):
        where = f"{path.relative_to(ROOT)}:{line}"
        assert not in_function, f"{where} imports {target} inside a function; import it at the top (no hidden cycle)"
        rank = layer_of(target)
        assert rank <= own, (
            f"{where}: {name} ({LAYERS[own][0]}) imports {target}, of the higher layer {LAYERS[rank][0]!r}; "
            "move the shared code down, or the importing code up"
        )


def test_the_check_catches_an_upward_import(tmp_path):
    tree = ast.parse("from far.recipes import glue_run\n\ndef f():\n    import far.cli.main\n")
    assert [(t, layer_of(t) > layer_of("far.training"), inside) for t, _, inside in far_imports(tree)] == [
        ("far.recipes", True, False),
        ("far.cli.main", True, True),
    ]


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_notebooks_use_the_public_api_and_the_rooms_above_it_only(path):
    allowed = ("far", "far.data", "far.evaluation", "far.models", "far.methods", "far.recipes", "far.plotting")
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
        for target, _, _ in far_imports(ast.parse("\n".join(lines))):
            above = any(target.startswith(room + ".") for room in allowed[1:])
            assert target in allowed or above, f"{path.name} imports {target}"
