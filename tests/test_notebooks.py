"""The notebooks: committed with the outputs of a full run, and executable in quick mode (what CI runs).

Each quick run executes an in-memory copy of a committed notebook in a fresh kernel of this
interpreter, with notebooks/ as its working directory, and fails on any cell's error; the
committed file is checked to be untouched afterwards.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from far import plotting

pytestmark = pytest.mark.slow  # whole processes, real models or notebooks

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
NAMES = ("01_quickstart.ipynb", "02_far_vs_random.ipynb", "03_mezo_memory.ipynb")
PLOT = "plot"  # cell tag: the cell draws at least one figure
RERUN = "run `python experiments/run_notebooks.py` (after the experiments that write its results)"


def code_cells(nb: nbformat.NotebookNode) -> list:
    return [c for c in nb.cells if c.cell_type == "code"]


def has_image(cell) -> bool:
    return any("image/png" in o.get("data", {}) for o in cell.get("outputs", []))


def stdout(nb: nbformat.NotebookNode) -> str:
    return "".join(o.get("text", "") for c in code_cells(nb) for o in c.get("outputs", []) if o.get("name") == "stdout")


def plots_without_image(nb: nbformat.NotebookNode) -> list[int]:
    return [i for i, c in enumerate(nb.cells) if PLOT in c.metadata.get("tags", []) and not has_image(c)]


@pytest.fixture
def shared_data() -> Path:
    """The GLUE data the live notebooks train on ($FAR_DATA_DIR, else ../shared/data beside the repo)."""
    try:
        return plotting.data_dir()
    except FileNotFoundError as e:
        pytest.skip(str(e))


def test_the_notebooks_are_these_three():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_committed_notebook_holds_a_full_run(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    cells = code_cells(nb)
    assert any(PLOT in c.metadata.get("tags", []) for c in cells), f"{name} tags no cell as a plot"
    counts = [c.execution_count for c in cells]
    assert None not in counts, f"{name} has code cells without outputs; {RERUN}"
    assert counts == list(range(1, len(cells) + 1)), f"{name} was not run top to bottom in one kernel; {RERUN}"
    errors = [i for i, c in enumerate(cells) if any(o.output_type == "error" for o in c.outputs)]
    assert not errors, f"{name}: code cells {errors} hold errors; {RERUN}"
    assert not plots_without_image(nb), f"{name}: plot cells {plots_without_image(nb)} hold no figure; {RERUN}"
    assert "quick mode: False" in stdout(nb), f"{name} holds the outputs of a quick run; {RERUN}"


def test_python3_kernel_is_this_interpreter():
    nb = plotting.run_notebook(new_notebook(cells=[new_code_cell("import sys\nprint(sys.prefix)")]), timeout=120)
    assert stdout(nb).strip() == sys.prefix


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_in_quick_mode(name, monkeypatch, shared_data):
    monkeypatch.setenv(plotting.QUICK_ENV, "1")  # the kernel inherits this environment
    monkeypatch.setenv(plotting.DATA_ENV, str(shared_data))
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    committed = (NOTEBOOKS / name).read_bytes()
    # raises CellExecutionError on any error
    nb = plotting.run_notebook(nbformat.reads(committed.decode("utf-8"), as_version=4), timeout=600)
    assert (NOTEBOOKS / name).read_bytes() == committed, "executing must not modify the committed notebook"
    assert "quick mode: True" in stdout(nb)
    assert not plots_without_image(nb), f"{name}: plot cells {plots_without_image(nb)} drew no figure"
