"""FAR's core: checked inputs, the rewrite of every FFN into learner and frozen parts, and its record.

    inputs.py       priming scores and learner indices, checked before the model is touched
    state.py        what a reconfigured model records (read-only queries: learners, config, layout)
    reconfigure.py  the verbs: `reconfigure`, `reconfigure_with_learners`, `restore`, `freeze_ffns`
    portable.py     learner selection that fits the stock model (priming's changes to frozen rows undone)

>>> from far.surgery import reconfigure, restore
>>> reconfigure(model, retention=0.4)
>>> restore(model)
"""

from __future__ import annotations

from far.lazy import lazy_face

# Names are imported on first use (PEP 562): importing the read-only record (far.surgery.state)
# must not import the verbs, which sit a layer above it.
lazy_face(
    __name__,
    {
        "far.surgery.state": ("FARState", "get_config", "is_reconfigured", "learners", "learners_from_state_dict"),
        "far.surgery.reconfigure": ("freeze_ffns", "reconfigure", "reconfigure_with_learners", "restore"),
    },
)
