"""ParameterBinding: the same function as torch.func.functional_call, module restored."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from raydpfl.models import FedAvgCNN
from raydpfl.privacy.per_sample.param_binding import ParameterBinding


class Tied(nn.Module):
    """Two layers sharing one weight (two names, one tensor)."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(5, 5, bias=False)
        self.dec = nn.Linear(5, 5)
        self.dec.weight = self.enc.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dec(torch.tanh(self.enc(x)))


def _leaves(model: nn.Module, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        n: torch.randn(p.shape, generator=g).requires_grad_(True)
        for n, p in model.named_parameters()
    }


@pytest.mark.parametrize("batch", [1, 3, 17])
def test_outputs_and_gradients_equal_functional_call_bit_for_bit(batch):
    torch.manual_seed(0)
    model = FedAvgCNN((1, 28, 28), 10).requires_grad_(False)
    binding = ParameterBinding(model)
    leaves = _leaves(model, 1)
    x, y = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))

    ref = functional_call(model, leaves, (x,))
    ref_grads = torch.autograd.grad(F.cross_entropy(ref, y), list(leaves.values()))
    with binding.bound(leaves):
        out = model(x)
    grads = torch.autograd.grad(F.cross_entropy(out, y), list(leaves.values()))

    assert torch.equal(out, ref)
    assert all(torch.equal(a, b) for a, b in zip(grads, ref_grads, strict=True))


def test_the_module_gets_its_own_tensors_back_also_after_an_error():
    model = FedAvgCNN((1, 28, 28), 10)
    own = {n: p for n, p in model.named_parameters()}
    binding = ParameterBinding(model)

    with pytest.raises(RuntimeError, match="boom"), binding.bound(_leaves(model, 2)):
        assert model.conv1.weight is not own["conv1.weight"]
        raise RuntimeError("boom")

    assert all(p is own[n] for n, p in model.named_parameters())
    assert isinstance(model.fc.weight, nn.Parameter)


def test_a_tied_weight_is_bound_under_both_names_like_functional_call():
    torch.manual_seed(0)
    model = Tied()
    names = [n for n, _ in model.named_parameters()]
    assert names == ["enc.weight", "dec.bias"]  # the alias dec.weight is deduplicated
    leaves = _leaves(model, 3)
    x = torch.randn(4, 5)

    with ParameterBinding(model).bound(leaves):
        assert model.dec.weight is leaves["enc.weight"]
        out = model(x)

    assert torch.equal(out, functional_call(model, leaves, (x,)))


def test_a_missing_name_keeps_the_modules_tensor_and_an_unknown_one_is_refused():
    model = FedAvgCNN((1, 28, 28), 10)
    binding = ParameterBinding(model)
    leaves = _leaves(model, 4)
    partial = {n: t for n, t in leaves.items() if n != "fc.bias"}
    x = torch.randn(2, 1, 28, 28)

    own_bias = model.fc.bias
    with binding.bound(partial):
        assert model.fc.bias is own_bias and model.fc.weight is partial["fc.weight"]
        out = model(x)
    assert torch.equal(out, functional_call(model, partial, (x,)))

    with (
        pytest.raises(KeyError, match=r"input_transform\.scale"),
        binding.bound({**leaves, "input_transform.scale": torch.ones(1)}),
    ):
        pass
