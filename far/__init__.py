"""FAR: Freeze And Reconfigure — fine-tune only the FFN nodes that matter.

>>> import far
>>> primer = far.Primer(model)          # 1. snapshot the FFNs, then train ~10% of the steps
>>> far.reconfigure(model, retention=0.4)  # 2-3. select learners, split every FFN
>>> far.summary(model)                  # what is trainable now
>>> far.restore(model)                  # an ordinary Hugging Face model again
"""

from far.architectures import (
    BUILTIN_ATTENTION_SPECS,
    BUILTIN_SPECS,
    FFN,
    AttentionSpec,
    FFNSpec,
    NodeGroup,
    find_attention,
    find_ffns,
)
from far.config import FARConfig
from far.layers import SplitLinear
from far.priming import Primer
from far.saving import from_pretrained, load_learners, save_learners, save_pretrained
from far.selection import select_learners
from far.summary import Summary, summary
from far.surgery import (
    FARState,
    freeze_ffns,
    get_config,
    is_reconfigured,
    learners,
    learners_from_state_dict,
    reconfigure,
    reconfigure_with_learners,
    restore,
)
from far.training import FARCallback, FinetuneResult, MeZO, finetune

__version__ = "0.1.0"

__all__ = [
    "AttentionSpec",
    "BUILTIN_ATTENTION_SPECS",
    "BUILTIN_SPECS",
    "FARCallback",
    "FARConfig",
    "FFN",
    "FFNSpec",
    "FinetuneResult",
    "NodeGroup",
    "MeZO",
    "FARState",
    "Primer",
    "SplitLinear",
    "Summary",
    "find_attention",
    "find_ffns",
    "finetune",
    "from_pretrained",
    "freeze_ffns",
    "get_config",
    "is_reconfigured",
    "learners",
    "learners_from_state_dict",
    "load_learners",
    "reconfigure",
    "reconfigure_with_learners",
    "restore",
    "save_learners",
    "save_pretrained",
    "select_learners",
    "summary",
]
