"""Running a notebook top to bottom, the way CI and `experiments/run_notebooks.py` both do."""

from __future__ import annotations

from far.plotting.results import repo_root


def run_notebook(nb, timeout: int):
    """Execute every cell of `nb` (an nbformat v4 notebook, changed in place and returned) in a fresh python3 kernel,
    with the repository's notebooks/ as working directory; raises nbclient's CellExecutionError on a cell's error.

    nbclient is a dev extra, so it is imported here, not with `far.plotting`.
    """
    from nbclient import NotebookClient

    # "python3" runs this interpreter: jupyter_client replaces the spec's "python" with sys.executable.
    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout=timeout,
        record_timing=False,
        resources={"metadata": {"path": str(repo_root() / "notebooks")}},
    )
    return client.execute()
