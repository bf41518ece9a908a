"""LoRA under DP (raydpfl/models/lora.py): only the adapters are parameters (the base is
buffers), the model starts as its base, the book-keeping engine's clipped sum equals a
ground-truth loop on it, the base comes from a local checkpoint read with
weights_only (bad files refused by name), and a DP-FedAvg run fine-tunes a base that was
pre-trained without DP on a held-out split, changing only the adapters."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import raydpfl.config.schema  # noqa: F401  (registers the text models)
from raydpfl.models import build_model
from raydpfl.models.lora import (
    LoRALinear,
    adapter_values,
    apply_lora,
    char_transformer_lora,
    file_sha256,
)
from raydpfl.models.text import CharTransformer
from raydpfl.privacy.per_sample.bookkeeping import BookkeepingClipping, supports
from raydpfl.privacy.per_sample.dpsgd import clip_weights
from raydpfl.privacy.per_sample.engines import make_engine
from raydpfl.privacy.per_sample.multi_client import MultiClientDPSGD
from tests.models.test_char_transformer import _write_shakespeare

OPTIONS = {"width": 16, "heads": 2, "layers": 1}


def _base(seed: int = 3) -> CharTransformer:
    torch.manual_seed(seed)
    return CharTransformer((10,), 80, **OPTIONS)


def test_only_adapters_are_parameters_and_the_model_starts_as_its_base(tmp_path):
    base = _base()
    path = tmp_path / "base.pt"
    torch.save(base.state_dict(), path)
    model = char_transformer_lora((10,), 80, checkpoint=str(path), rank=2, **OPTIONS)

    names = [n for n, _ in model.named_parameters()]
    assert names and all(".lora_a." in n or ".lora_b." in n for n in names)
    # r·(in + out) per adapted layer: qkv 16→48, proj 16→16, mlp_in 16→64, mlp_out 64→16
    assert adapter_values(model) == 2 * ((16 + 48) + (16 + 16) + (16 + 64) + (64 + 16))
    assert isinstance(model.blocks[0].qkv, LoRALinear)
    torch.testing.assert_close(model.blocks[0].qkv.weight, base.blocks[0].qkv.weight)
    assert "embed.weight" in dict(model.named_buffers())
    x = torch.randint(0, 80, (4, 10))
    with torch.no_grad():
        torch.testing.assert_close(model(x), base(x))  # lora_b = 0: the base itself
    assert isinstance(make_engine(model, "auto"), BookkeepingClipping)
    # the grouped multi-client engine replaces every Linear's forward with one reading
    # its parameters: a frozen Linear (the head here) sends the model to vmap there
    assert not supports(model) and MultiClientDPSGD(model, engine="auto").engine == "vmap"


def test_the_clipped_sum_over_the_adapters_equals_one_backward_pass_per_record():
    torch.manual_seed(0)
    model = apply_lora(_base(), rank=3, alpha=6.0, targets=("qkv", "mlp_out", "head"))
    with torch.no_grad():  # adapters away from their start, so every gradient is non-zero
        for p in model.parameters():
            p.normal_(0, 0.3)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    engine = BookkeepingClipping(model)
    for batch in (0, 1, 5):
        x, y = torch.randint(0, 80, (batch, 10)), torch.randint(0, 80, (batch,))
        truth = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
        norms = []
        for i in range(batch):
            model.zero_grad()
            F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
            norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters()))
            norms.append(norm)
            for n, p in model.named_parameters():
                truth[n] += clip_weights(norm, 0.5) * p.grad
        got, stats = engine.clipped_sum(params, x, y, lambda n: clip_weights(n, 0.5))
        assert stats.batch_size == batch and engine._fallback is None
        if batch:
            torch.testing.assert_close(engine.norms(params, x, y), torch.stack(norms))
        for n in truth:
            torch.testing.assert_close(got[n], truth[n], rtol=1e-4, atol=1e-6)


def test_a_bad_checkpoint_is_refused_naming_the_field(tmp_path):
    missing = tmp_path / "none.pt"
    with pytest.raises(ValueError, match="checkpoint: no checkpoint file"):
        char_transformer_lora((10,), 80, checkpoint=str(missing), **OPTIONS)
    good = tmp_path / "base.pt"
    torch.save(_base().state_dict(), good)
    with pytest.raises(ValueError, match="does not have the SHA-256"):
        char_transformer_lora(
            (10,), 80, checkpoint=str(good), checkpoint_sha256="0" * 64, **OPTIONS
        )
    model = char_transformer_lora(
        (10,), 80, checkpoint=str(good), checkpoint_sha256=file_sha256(good), **OPTIONS
    )
    assert adapter_values(model) > 0
    with pytest.raises(ValueError, match="does not fit the base model"):
        char_transformer_lora((10,), 80, checkpoint=str(good), width=32, heads=2, layers=1)
    pickled = tmp_path / "object.pt"  # an arbitrary pickled object: weights_only refuses it
    with open(pickled, "wb") as fh:
        pickle.dump({"weight": object()}, fh)
    with pytest.raises(ValueError, match="not a tensor state dict"):
        char_transformer_lora((10,), 80, checkpoint=str(pickled), **OPTIONS)
    with pytest.raises(ValueError, match=r"LoRA targets \['nope'\]"):
        apply_lora(_base(), targets=("nope",))


def _pretrain_on_public_split(tmp_path) -> tuple[str, dict[str, torch.Tensor]]:
    """A base trained without DP on the fixture's test split (held out from training)."""
    from raydpfl.data.readers import load_shakespeare

    data = load_shakespeare(tmp_path)
    x, y = torch.from_numpy(data.x_test), torch.from_numpy(data.y_test)
    torch.manual_seed(0)
    base = CharTransformer((80,), 80, width=16, heads=2, layers=1)
    opt = torch.optim.Adam(base.parameters(), lr=1e-2)
    for _ in range(30):
        opt.zero_grad()
        F.cross_entropy(base(x), y).backward()
        opt.step()
    path = tmp_path / "public_base.pt"
    torch.save(base.state_dict(), path)
    return str(path), {k: v.detach().clone() for k, v in base.state_dict().items()}


@pytest.mark.slow
def test_dp_fedavg_fine_tunes_only_the_adapters_of_a_pretrained_base(tmp_path):
    import raydpfl

    _write_shakespeare(tmp_path)
    checkpoint, base_state = _pretrain_on_public_split(tmp_path)
    options = {"checkpoint": checkpoint, "rank": 4, "width": 16, "heads": 2, "layers": 1}
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
                "model": {"name": "char_transformer_lora", "options": options},
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
    assert result.summary["rounds_completed"] == 2
    assert np.isfinite(result.summary["final_test_accuracy"])
    # the run's parameters (what is clipped, noised, uploaded) are the adapters alone
    names = set(result.params)
    assert names and all(".lora_a." in n or ".lora_b." in n for n in names)
    model = build_model("char_transformer_lora", (80,), 80, **options)
    assert names == {n for n, _ in model.named_parameters()}
    assert sum(t.numel() for t in result.params.values()) == adapter_values(model)
    assert any(float(result.params[n].abs().sum()) > 0 for n in names if ".lora_b." in n)
    # the base the run fine-tuned is the pre-trained one, frozen
    buffers = dict(model.named_buffers())
    for key in ("embed.weight", "head.weight", "norm.weight"):
        torch.testing.assert_close(buffers[key], base_state[key])
