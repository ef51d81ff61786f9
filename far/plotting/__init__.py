"""Helpers of the notebooks in notebooks/: where data and committed results are, and the figures drawn from them.

matplotlib is a dev extra: it is imported when a figure is drawn, not with this package. Costly
numbers are never computed here: they come from the experiments/ scripts' result files, and a
missing file is an error that names the command that writes it.

    >>> from far import plotting
    >>> summary = plotting.load_result("replicate_far/replication.json")["summary"]
    >>> setting = plotting.run_setting(plotting.result_path("replicate_far"), "cola")
    >>> fig = plotting.plot_methods(summary["cola"], "cola", setting)
"""

from far.lazy import lazy_face

lazy_face(
    __name__,
    {
        "far.plotting.comparisons": ("plot_methods", "plot_pareto", "plot_retention_sweep", "plot_step_benchmark"),
        "far.plotting.execution": ("run_notebook",),
        "far.plotting.fewshot": ("plot_fewshot", "plot_fewshot_time", "plot_own_texts"),
        "far.plotting.figures": (
            "delta_share",
            "plot_concentration",
            "plot_eval_history",
            "plot_loss_curves",
            "plot_memory",
            "plot_node_deltas",
            "running_mean",
        ),
        "far.plotting.results": (
            "DATA_ENV",
            "QUICK_ENV",
            "RESULT_SOURCES",
            "RESULTS_ENV",
            "MissingResultError",
            "data_dir",
            "load_result",
            "metric_name",
            "metric_scale",
            "quick_mode",
            "read_run_log",
            "repo_root",
            "result_path",
            "results_dir",
            "run_setting",
            "versus_full",
        ),
    },
)
