"""Saving and sharing: FAR checkpoints, learner-only files, and merging back to a plain model.

>>> far.save_learners(model, "user-42.safetensors")   # only what FAR training changed
>>> far.load_learners(base, "user-42.safetensors")    # onto the base it was trained from
>>> far.load_learners(base, "user-7.safetensors")     # swaps user 42 out: base + user 7
>>> far.unload_learners(base)                          # the stock base again
>>> far.save_pretrained(model, "ckpt")                 # full checkpoint, FAR layout kept
>>> model = far.from_pretrained("ckpt")
>>> far.restore(model).save_pretrained("plain")        # ordinary Hugging Face checkpoint
"""

from far.saving.active import active_learners, unload_learners
from far.saving.learners_file import LearnersFileError, learners_model_config, load_learners, save_learners
from far.saving.pretrained import from_pretrained, save_pretrained

__all__ = [
    "LearnersFileError",
    "active_learners",
    "from_pretrained",
    "learners_model_config",
    "load_learners",
    "save_learners",
    "save_pretrained",
    "unload_learners",
]
