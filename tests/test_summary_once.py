"""`far.summary(model)` shows its table once: printed, and the returned value's repr (what a REPL shows) one line."""

from __future__ import annotations

import code
import contextlib
import io

from conftest import tiny_model

import far


def test_a_repl_shows_the_table_once():
    model = far.reconfigure(tiny_model("bert"), far.FARConfig(0.25, "random"))
    console = code.InteractiveInterpreter({"far": far, "model": model})
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        console.runsource("far.summary(model)")  # an expression statement: the REPL displays its value too
    shown = out.getvalue()
    assert shown.count("trainable params:") == 1, shown
    for layer in (0, 1):  # each split FFN is listed once, not again in the displayed value
        assert shown.count(f"bert.encoder.layer.{layer}.output.dense") == 1, shown


def test_the_repr_is_one_line_and_the_str_the_table():
    result = far.summary(tiny_model("bert"), verbose=False)
    assert "\n" not in repr(result) and repr(result).startswith("<far.Summary: ")
    assert str(result).startswith("trainable params: ")
