"""A head made anew for another number of labels is not read back from the model's file as its stock value."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from far.saving.stock import stock_reader


def test_a_head_of_another_shape_is_not_the_stock_value(tmp_path):
    tiny_model("bert", num_labels=2).save_pretrained(tmp_path)  # the file's head: 2 labels
    regression = tiny_model("bert", num_labels=1)  # the model's head: 1 output (a regression task)
    read = stock_reader(tmp_path, regression)
    with pytest.raises(KeyError):
        read("classifier.weight")
    name = "bert.encoder.layer.0.output.dense.weight"
    assert torch.equal(read(name), regression.get_parameter(name))  # the same seed: the body is the file's
