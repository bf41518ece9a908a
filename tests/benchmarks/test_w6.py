"""benchmarks/w6.py: its fixture is LEAF's Shakespeare format as raydpfl's reader reads it
(roles as clients, 80-character windows), and every DP path it times (raydpfl's engine,
vmap, Opacus hooks and ghost) computes the same clipped sum on the same batch (σ = 0),
the ground truth's: one backward pass per record."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from raydpfl.data.readers import load_shakespeare
from raydpfl.models import build_model
from raydpfl.privacy.per_sample.dpsgd import clip_weights
from tests.benchmarks.script_module import load_script

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    return load_script("w6", ROOT / "benchmarks" / "w6.py")


def test_the_fixture_is_leaf_shakespeare_by_role(tmp_path):
    w6 = _bench()
    data = load_shakespeare(w6.write_fixture(tmp_path, windows_per_role=50))
    assert data.x_train.shape == (150, 80) and data.num_classes == 80
    assert data.client_names == ("HAMLET", "OPHELIA", "POLONIUS")
    # the label is the character after the window: window i+1 ends with label i
    x, y = data.x_train[:50], data.y_train[:50]
    assert (x[1:, -1] == y[:-1]).all()
    batches = w6.poisson_batches(150, 16, 5)
    assert len(batches) == 5 and all(b.numel() > 0 for b in batches)


@pytest.mark.parametrize(
    "name, options",
    [
        ("char_transformer", {"width": 16, "heads": 2, "layers": 1}),
        ("char_lstm", {"embed": 4, "hidden": 12, "layers": 2}),
        ("char_transformer_lora", {"width": 16, "heads": 2, "layers": 1, "rank": 2}),
    ],
)
def test_every_timed_dp_path_computes_the_same_clipped_sum(name, options):
    w6 = _bench()
    g = torch.Generator().manual_seed(3)
    x, y = torch.randint(0, 80, (5, 80), generator=g), torch.randint(0, 80, (5,), generator=g)
    deltas = w6.clipped_sum_deltas(name, options, x, y, expected_batch=4.0)
    expected_paths = {"raydpfl", "vmap", "opacus_hooks"}
    expected_paths |= {"opacus_ghost"} if name != "char_lstm" else set()
    assert set(deltas) == expected_paths

    torch.manual_seed(0)  # the start `clipped_sum_deltas` builds
    model = build_model(name, (80,), 80, **options)
    truth = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    for i in range(5):
        model.zero_grad()
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters()))
        for n, p in model.named_parameters():
            truth[n] += clip_weights(norm, w6.CLIP) * p.grad
    for path, delta in deltas.items():
        assert delta.keys() == truth.keys(), path
        for n in truth:
            torch.testing.assert_close(delta[n], truth[n], rtol=1e-4, atol=2e-6, msg=path)
