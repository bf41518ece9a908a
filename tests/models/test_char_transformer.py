"""The character models for LEAF's Shakespeare: shapes, causality, the per-sample engine
they get (book-keeping: Embedding, LayerNorm and Linear rules), per-sample clipping that
holds for them, and DP-SGD runs end to end on Shakespeare files in LEAF's format, split
by role (natural clients)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from raydpfl.data.readers import SHAKESPEARE_LETTERS
from raydpfl.models import build_model
from raydpfl.privacy.per_sample import bookkeeping
from raydpfl.privacy.per_sample.dpsgd import PerSampleGradients, clip_weights
from raydpfl.privacy.per_sample.engines import make_engine

TEXT = (
    "To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer "
    "the slings and arrows of outrageous fortune, or to take arms against a sea of troubles "
)


def test_logits_per_window_and_no_look_ahead():
    model = build_model("char_transformer", (12,), 80, width=16, heads=2, layers=1)
    tokens = torch.randint(0, 80, (3, 12))
    out = model(tokens)
    assert out.shape == (3, 80)
    # causal: the last position's state ignores nothing before it, but changing an
    # earlier position changes it, while the first position's state ignores later ones
    changed = tokens.clone()
    changed[:, 0] = (changed[:, 0] + 1) % 80
    assert not torch.allclose(model(changed), out)
    with torch.no_grad():
        x = model.embed(tokens) + model.position(torch.arange(12))
        first = model.blocks[0](x)[:, 0]
        later = tokens.clone()
        later[:, 5:] = (later[:, 5:] + 7) % 80
        y = model.embed(later) + model.position(torch.arange(12))
        torch.testing.assert_close(model.blocks[0](y)[:, 0], first)


def test_auto_engine_is_bookkeeping_and_each_samples_gradient_is_its_own():
    model = build_model("char_transformer", (10,), 80, width=16, heads=2, layers=1)
    assert bookkeeping.first_unsupported(model) is None
    assert isinstance(make_engine(model, "auto"), bookkeeping.BookkeepingClipping)
    engine = PerSampleGradients(model)
    x = torch.randint(0, 80, (6, 10))
    y = torch.randint(0, 80, (6,))
    params = {n: p.detach() for n, p in model.named_parameters()}
    grads = engine.grads(params, x, y)
    # sample 0's gradient with five other samples equals its gradient alone, and equals
    # autograd on that sample: nothing in the model mixes examples
    alone = engine.grads(params, x[:1], y[:1])
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x[:1]), y[:1]).backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name][0], alone[name][0], rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(grads[name][0], p.grad, rtol=1e-4, atol=1e-6)
    # clipping bounds every sample's contribution: each sample's clipped-sum share <= C
    norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in grads.values()))
    assert torch.all(norms > 1e-3)
    clip = float(norms.min()) / 2
    for i in range(6):
        one, _ = engine.clipped_sum(
            params, x[i : i + 1], y[i : i + 1], lambda n: clip_weights(n, clip)
        )
        size = torch.sqrt(sum(t.pow(2).sum() for t in one.values()))
        assert size <= clip * (1 + 1e-5)


def _write_shakespeare(root: Path) -> None:
    text = TEXT * 3
    roles = {"HAMLET": 0, "OPHELIA": 40, "POLONIUS": 80}
    for split, count in (("train", 12), ("test", 3)):
        users = {}
        for role, offset in roles.items():
            x = [text[offset + i : offset + i + 80] for i in range(count)]
            y = [text[offset + i + 80] for i in range(count)]
            users[role] = {"x": x, "y": y}
        doc = {
            "users": list(users),
            "num_samples": [len(u["y"]) for u in users.values()],
            "user_data": users,
        }
        (root / "shakespeare" / split).mkdir(parents=True)
        (root / "shakespeare" / split / "all.json").write_text(json.dumps(doc))
    assert all(c in SHAKESPEARE_LETTERS for c in text)


@pytest.mark.parametrize(
    "model",
    [
        {"name": "char_transformer", "options": {"width": 16, "layers": 1}},
        {"name": "char_lstm", "options": {"embed": 8, "hidden": 16, "layers": 1}},
    ],
)
def test_dp_sgd_trains_the_char_model_on_shakespeare_by_role(tmp_path, model):
    import raydpfl

    _write_shakespeare(tmp_path)
    result = raydpfl.run_simulation(
        {
            "experiment": {
                "data": {
                    "dataset": "shakespeare",
                    "root": str(tmp_path),
                    "num_clients": 3,
                    "partition": {"kind": "natural"},
                    "client_test_fraction": 0.25,
                },
                "model": model,
                "algorithm": {
                    "name": "dp_fedavg",
                    "rounds": 2,
                    "clients_per_round": 3,
                    "local_steps": 2,
                    "lr": 0.5,
                },
                "privacy": {
                    "epsilon": 50.0,
                    "delta": 1e-3,
                    "clip_norm": 1.0,
                    "noise_multiplier": 1.0,
                    "sampling_rate": 0.5,
                },
            },
            "runtime": {"backend": "local", "seed": 0, "progress": False},
        }
    )
    s = result.summary
    assert s["rounds_completed"] == 2
    assert 0 < s["epsilon_max"] <= 50.0
    assert np.isfinite(s["final_test_accuracy"])
    assert result.history.num_rows == 2


def test_char_lstm_is_leafs_shakespeare_lstm_and_trains_on_the_bookkeeping_engine():
    model = build_model("char_lstm", (80,), 80)
    # LEAF's reference: Embedding(80, 8), 2 LSTM layers of 256, Linear(256, 80); torch's
    # two LSTM biases are one here (4·256 fewer values per layer)
    lstm = torch.nn.LSTM(8, 256, num_layers=2)
    assert sum(p.numel() for p in model.parameters()) == (
        80 * 8 + sum(p.numel() for p in lstm.parameters()) - 2 * 4 * 256 + 256 * 80 + 80
    )
    assert isinstance(make_engine(model, "auto"), bookkeeping.BookkeepingClipping)
    assert model(torch.randint(0, 80, (3, 80))).shape == (3, 80)
