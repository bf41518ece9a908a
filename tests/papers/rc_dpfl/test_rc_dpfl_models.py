"""The RC-DPFL paper's models: parameter counts (§6.18) and DP compatibility."""

import pytest
import torch
from torch import nn

from raydpfl.models import build_model, num_parameters


def test_paper_cnn_has_28938_parameters_and_no_activation_on_the_logits():
    model = build_model("rc_cnn", (1, 28, 28), 10)
    assert num_parameters(model) == 28_938  # 416 + 12,832 + 15,690 (Table 1)
    assert isinstance(model.classifier, nn.Linear)
    logits = model(torch.randn(3, 1, 28, 28))
    assert logits.shape == (3, 10) and (logits < 0).any()


def test_groupnorm_resnet18_has_the_paper_count_and_no_batchnorm():
    model = build_model("rc_resnet18", (3, 32, 32), 10)
    assert num_parameters(model) == 11_181_642
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert all(m.num_groups == 2 for m in model.modules() if isinstance(m, nn.GroupNorm))
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_models_reject_unknown_options_and_bad_shapes():
    with pytest.raises(ValueError, match="no options"):
        build_model("rc_cnn", (1, 28, 28), 10, hidden=3)
    with pytest.raises(ValueError, match="C, H, W"):
        build_model("rc_cnn", (784,), 10)
