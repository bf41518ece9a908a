"""What a worker hands back crosses to the server, whose tensors live on the CPU."""

import torch

from raydpfl.algorithms.base import ClientResult
from raydpfl.papers.dpfl_bcs.privatefl import PrivateFlResult
from raydpfl.simulation.worker import result_on_host


def test_every_tensor_a_result_carries_is_moved_to_the_host(monkeypatch):
    moved = []
    real_cpu = torch.Tensor.cpu

    def recording_cpu(self, *args, **kwargs):  # a GPU tensor's .cpu() returns a copy
        moved.append(tuple(self.shape))
        return real_cpu(self, *args, **kwargs).clone()

    monkeypatch.setattr(torch.Tensor, "cpu", recording_cpu)
    result = PrivateFlResult(
        client_id=3,
        update={"w": torch.ones(2, 2)},
        weight=5.0,
        num_examples=5,
        metrics={"loss": 0.5},
        local_state={"gamma": torch.ones(3), "beta": torch.zeros(4)},
    )

    out = result_on_host(result)

    assert sorted(moved) == [(2, 2), (3,), (4,)]  # the update and PRIVATEFL's local state
    assert isinstance(out, PrivateFlResult) and out.client_id == 3 and out.weight == 5.0
    assert out.metrics == {"loss": 0.5}
    assert out.local_state["gamma"] is not result.local_state["gamma"]
    assert torch.equal(out.update["w"], result.update["w"])


def test_a_result_without_tensors_outside_the_update_keeps_its_other_fields():
    result = ClientResult(client_id=1, update={}, weight=1.0, num_examples=1)

    assert result_on_host(result) is result
