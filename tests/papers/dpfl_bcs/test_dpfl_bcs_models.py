"""The dpfl_bcs paper's models: exact parameter counts, GroupNorm, forward shapes (§11.4)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from raydpfl.config import config_from_dict
from raydpfl.models import build_model, num_parameters


@pytest.mark.parametrize(
    ("name", "shape", "classes", "count"),
    [
        ("bcs_linear", (10,), 1, 11),
        ("bcs_linreg", (10,), 1, 11),  # Lending Club's linear regression (diabetes: 10 features)
        ("bcs_mnist_cnn", (1, 28, 28), 10, 4_266),
        ("bcs_lenet5", (1, 28, 28), 10, 61_706),
        ("bcs_femnist_cnn", (1, 28, 28), 62, 67_026),
        ("bcs_resnet20", (3, 32, 32), 10, 272_474),
    ],
)
def test_parameter_counts_match_the_paper(name, shape, classes, count):
    model = build_model(name, shape, classes)
    assert num_parameters(model) == count
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    out = model(torch.zeros(2, *shape))
    assert out.shape == (2, classes)


def test_norm_layers_are_groupnorm():
    resnet = build_model("bcs_resnet20", (3, 32, 32), 10)
    norms = [m for m in resnet.modules() if isinstance(m, nn.GroupNorm)]
    assert len(norms) == 1 + 9 * 2 + 2  # stem, two per block, two option-B shortcuts


def test_models_are_config_names_and_reject_options():
    config_from_dict({"experiment": {"model": {"name": "bcs_lenet5"}}})
    with pytest.raises(ValueError, match="options"):
        build_model("bcs_lenet5", (1, 28, 28), 10, hidden=3)


def test_linreg_is_a_one_output_regression_model():
    with pytest.raises(ValueError, match="regression"):
        build_model("bcs_linreg", (10,), 3)
    model = build_model("bcs_linreg", (10,), 1)
    assert [n for n, _ in model.named_parameters()] == ["linear.weight", "linear.bias"]
