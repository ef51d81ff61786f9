"""Helpers of the notebooks in notebooks/: where data and committed results are, and the figures drawn from them.

matplotlib is a dev extra: it is imported when a figure is drawn, not with this package. Costly
numbers are never computed here: they come from the experiments/ scripts' result files, and a
missing file is an error that names the command that writes it.

    >>> from far import plotting
    >>> summary = plotting.load_result("replicate_far/replication.json")["summary"]
    >>> setting = plotting.run_setting(plotting.result_path("replicate_far"), "cola")
    >>> fig = plotting.plot_methods(summary["cola"], "cola", setting)
"""

from far.plotting.comparisons import plot_methods, plot_pareto, plot_retention_sweep, plot_step_benchmark
from far.plotting.execution import run_notebook
from far.plotting.fewshot import plot_fewshot, plot_fewshot_time, plot_own_texts
from far.plotting.figures import (
    delta_share,
    plot_concentration,
    plot_eval_history,
    plot_loss_curves,
    plot_memory,
    plot_node_deltas,
    running_mean,
)
from far.plotting.results import (
    DATA_ENV,
    QUICK_ENV,
    RESULT_SOURCES,
    RESULTS_ENV,
    MissingResultError,
    data_dir,
    load_result,
    metric_name,
    metric_scale,
    quick_mode,
    read_run_log,
    repo_root,
    result_path,
    results_dir,
    run_setting,
    versus_full,
)

__all__ = [
    "DATA_ENV",
    "QUICK_ENV",
    "RESULTS_ENV",
    "RESULT_SOURCES",
    "MissingResultError",
    "data_dir",
    "delta_share",
    "load_result",
    "metric_name",
    "metric_scale",
    "plot_concentration",
    "plot_eval_history",
    "plot_fewshot",
    "plot_fewshot_time",
    "plot_loss_curves",
    "plot_memory",
    "plot_methods",
    "plot_node_deltas",
    "plot_own_texts",
    "plot_pareto",
    "plot_retention_sweep",
    "plot_step_benchmark",
    "quick_mode",
    "read_run_log",
    "repo_root",
    "result_path",
    "results_dir",
    "run_setting",
    "run_notebook",
    "running_mean",
    "versus_full",
]
