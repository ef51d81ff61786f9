"""Saving and sharing: FAR checkpoints, learner-only files, and merging back to a plain model.

>>> far.save_learners(model, "user-42.safetensors")   # only what FAR training changed
>>> far.load_learners(base, "user-42.safetensors")    # onto the base it was trained from
>>> far.load_learners(base, "user-7.safetensors")     # swaps user 42 out: base + user 7
>>> far.unload_learners(base)                          # the stock base again
>>> far.save_pretrained(model, "ckpt")                 # full checkpoint, FAR layout kept
>>> model = far.from_pretrained("ckpt")
>>> far.restore(model).save_pretrained("plain")        # ordinary Hugging Face checkpoint
"""

from __future__ import annotations

from far.lazy import lazy_face

# On first use (PEP 562): `pretrained` imports transformers' model code (~140 MB resident), which a
# checkpoint or a learners file does not need; training under a memory budget must not pay for it.
lazy_face(
    __name__,
    {
        "far.saving.active": ("active_learners", "unload_learners"),
        "far.saving.learners_file": ("LearnersFileError", "learners_model_config", "load_learners", "save_learners"),
        "far.saving.pretrained": ("from_pretrained", "save_pretrained"),
    },
)
