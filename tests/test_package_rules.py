"""The package's size rules, held by the tests so that later work keeps them: at most 12 modules in the package root,
no module over 400 lines, no function body of 100 lines or more (its docstring aside)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "far"
MODULES = sorted(PACKAGE.rglob("*.py"))
ROOT_MODULES, MODULE_LINES, FUNCTION_LINES = 12, 400, 100


def body_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's lines from its first statement after the docstring to its end."""
    body = function.body
    first = body[0]
    if len(body) > 1 and isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        first = body[1]
    return function.end_lineno - first.lineno + 1


def long_functions(source: str, limit: int = FUNCTION_LINES) -> list[tuple[str, int]]:
    functions = (n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return [(f.name, body_lines(f)) for f in functions if body_lines(f) >= limit]


def test_the_package_root_holds_at_most_twelve_modules():
    root = [p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"]
    assert len(root) <= ROOT_MODULES, f"far/ holds {len(root)} modules: give the new one a room ({sorted(root)})"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_modules_stay_under_400_lines_and_functions_under_100(path):
    source = path.read_text()
    assert len(source.splitlines()) <= MODULE_LINES, f"{path.name}: split it by concern"
    assert long_functions(source) == [], "split the function into named steps"


def test_the_check_measures_a_body_without_its_docstring():
    statements = "\n".join(f"    x{i} = {i}" for i in range(99))
    short = f'def f():\n    """Doc\n\n    more doc.\n    """\n{statements}\n'
    assert long_functions(short) == []
    assert long_functions(short + "    x = 1\n") == [("f", 100)]
