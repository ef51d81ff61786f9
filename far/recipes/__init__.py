"""Recipes: whole training runs of a task (GLUE, SQuAD, the user's own files), their reports, and predictions.

A run is built from `RunSettings` (what the `far` command's flags fill in) by `glue_run`,
`squad_run` or `text_files_run`, then trained, evaluated and written out by `train_and_report`.

>>> from far.recipes import RunSettings, glue_run, train_and_report
>>> record = train_and_report(glue_run(RunSettings(method="far", max_steps=100), "stsb"))
>>> record = train_and_report(glue_run(RunSettings(method="lora", lora_r=8, lr=1e-3), "stsb"))  # PEFT's LoRA
>>> predict("runs/stsb-minilm-far/model", [("A man plays a guitar.", "Someone plays music.")])
"""

from __future__ import annotations

from far.lazy import lazy_face

# On first use (PEP 562), so that `far predict` does not import the training runs, nor they `datasets`
# before they need it.
lazy_face(
    __name__,
    {
        "far.recipes.predict": ("Predictor", "predict"),
        "far.recipes.report": ("TrainingRun", "train_and_report"),
        "far.recipes.runs": ("SquadSettings", "glue_run", "squad_run"),
        "far.recipes.files_run": ("text_files_run",),
        "far.recipes.settings": ("RunSettings",),
    },
)
