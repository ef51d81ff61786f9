"""The main environment (.venv, without the device extra) keeps transformers' model code free of torchao.

executorch (the device extra) depends on torchao, and transformers imports torchao with its model code where it
is installed: four warnings on stderr (CUDA kernels that do not load on a CPU, an enum registration torch
deprecates), 0.4 CPU s and 12 MiB more wherever a model loads (docs/device.md#setup). .ci/setup therefore
installs the device extra into .venv-device only; this fails where anything else brings torchao into the main
environment.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import DEVICE_RUN, HAS_EXECUTORCH


@pytest.mark.slow  # a fresh process importing transformers' model code: 3-5 CPU s
@pytest.mark.skipif(HAS_EXECUTORCH, reason=f"the device extra brings torchao on purpose ({DEVICE_RUN} is its run)")
def test_transformers_model_code_imports_no_torchao_without_the_device_extra():
    code = "import sys\nfrom transformers.models.bert import modeling_bert\nprint('torchao' in sys.modules)\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"], "transformers imported torchao: is the device extra (or torchao) here?"
    assert done.stderr == "", done.stderr
