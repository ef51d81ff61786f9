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

from far.lazy import lazy_names

# Names are imported on first use (PEP 562): importing the read-only record (far.surgery.state)
# must not import the verbs, which sit a layer above it.
_LAZY = {
    "FARState": "far.surgery.state",
    "get_config": "far.surgery.state",
    "is_reconfigured": "far.surgery.state",
    "learners": "far.surgery.state",
    "learners_from_state_dict": "far.surgery.state",
    "freeze_ffns": "far.surgery.reconfigure",
    "reconfigure": "far.surgery.reconfigure",
    "reconfigure_with_learners": "far.surgery.reconfigure",
    "restore": "far.surgery.reconfigure",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_names(__name__, _LAZY)
