"""far.device: a FAR run as an ExecuTorch training program, trained outside torch eager, and back to far.

    plan.py       what the export reads from a reconfigured model, checked first (architectures it knows)
    view.py       the export view: the lean encoder's BERT modules, eager attention, each FFN split in two
    program.py    a model -> its views (the frozen bottom and the trained top) and their inputs
    lowering.py   views -> ExecuTorch programs (joint forward-backward graph, edge passes, XNNPACK)
    manifest.py   the export folder's layout and manifest
    export.py     `export_executorch`: the whole folder, atomically
    examples.py   `write_examples`: texts tokenised and padded for the programs
    order.py      the seeded batch order every runtime reproduces
    optim.py      the device's optimizers: torch.optim's AdamW and SGD on named tensors, clipping, schedule
    state.py      the training state file (trainable tensors, optimizer state, position), checked on reading
    runtime.py    the programs through ExecuTorch's Python bindings
    train.py      `train`: `ProgramRunner`, the training engine's runner for the programs (micro-batches, the update)
    learners.py   `to_learners`: a state as an ordinary learners file for the stock model
    lm_view.py    a lean causal LM's export view: its own modules, made traceable, and the sliced next-token loss
    lm_export.py  `export_causal_lm`: a lean causal LM's FAR layout (primed, or a user's learners file) as a folder
                  that trains on text
    lm_programs.py  a causal LM export's programs through the Python bindings (bottom, then a step)
    lm_text.py    a user's texts as packed chunks in one file (text.safetensors), for every runtime
    lm_learners.py  `lm_to_learners`: a causal LM export's state as the lean learners file of its stock GGUF
    lm_generate.py  generate.pte (`--generate`): greedy decoding over a KV cache the program keeps, the trained
                  tensors read from a state (runtime/executorch's far_generate runs it)

>>> far.device.export_executorch(model, tokenizer, "OUT", batch_size=32, max_length=64, optimizer="adamw", lr=1e-4)
>>> far.device.write_examples("train.csv", tokenizer, "OUT", "OUT/train.safetensors")
>>> far.device.train("OUT", "OUT/train.safetensors", epochs=3)
>>> far.device.to_learners("OUT", "OUT/state.safetensors", stock_model, "user.safetensors")
>>> far.device.export_causal_lm(lean_model, tokenizer, "LM", batch_size=4, max_length=256, lr=3e-4, texts=texts)
>>> far.device.train("LM", "LM/text.safetensors", epochs=1)              # or runtime/executorch's far_train
>>> far.device.lm_to_learners("LM", "LM/state.safetensors", stock_lean_model, "notes.safetensors")

The command line: `far export --model NAME --executorch LM [--learners FILE]`, then `far export --from-executorch LM
--state STATE --learners-only FILE`.

Exporting and training need executorch (the `device` extra: .venv-device, which .ci/setup makes, or
`pip install 'far[device]'`); nothing here imports it until used.
"""

from __future__ import annotations

from far.lazy import lazy_face

lazy_face(
    __name__,
    {
        "far.device.manifest": ("DeviceFileError", "read_manifest"),
        "far.device.export": ("ExportResult", "export_executorch"),
        "far.device.examples": ("write_examples",),
        "far.device.train": ("TrainResult", "train"),
        "far.device.learners": ("to_learners",),
        "far.device.lm_export": ("export_causal_lm", "reconfigure_for_export", "reconfigure_from_learners"),
        "far.device.lm_learners": ("lm_to_learners",),
    },
)
