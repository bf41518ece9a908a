import pytest
import torch
from torch import nn

from raydpfl.models import MODELS, assert_dp_compatible, build_model, num_parameters


@pytest.mark.parametrize(("shape", "expected"), [((1, 28, 28), 582_026), ((3, 32, 32), 878_538)])
def test_fedavg_cnn_has_the_papers_parameter_count(shape, expected):
    model = build_model("fedavg_cnn", shape, 10)

    assert num_parameters(model) == expected
    assert model(torch.zeros(2, *shape)).shape == (2, 10)


@pytest.mark.parametrize("name", MODELS)
def test_every_model_is_dp_compatible_and_runs(name):
    shape = (1, 28, 28)

    model = build_model(name, shape, 10)

    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert model(torch.zeros(3, *shape)).shape == (3, 10)


def test_batchnorm_is_refused():
    with pytest.raises(ValueError, match="BatchNorm"):
        assert_dp_compatible(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)))


def test_unknown_model_and_too_small_input_are_rejected():
    with pytest.raises(ValueError, match="allowed: .*fedavg_cnn"):
        build_model("resnet", (1, 28, 28), 10)
    with pytest.raises(ValueError, match="at least 16x16"):
        build_model("fedavg_cnn", (1, 8, 8), 10)
