"""An LSTM and a GRU built from Linear cells, so that DP-SGD's per-sample rules apply.

`torch.nn.LSTM` runs one fused kernel over the sequence: no hook sees a time step's
input and output gradient, so a per-sample engine can only differentiate it per sample
(vmap: ~30 s per 16 Shakespeare windows on 2 CPU cores). `DPLSTM` computes the same
function (Hochreiter & Schmidhuber 1997, with a forget gate; the gate order i, f, g, o
of torch) from two Linear layers per layer, as Opacus' DPLSTM does:

    gates_t = W_ih x_t + b + W_hh h_{t-1}       (4H values: i, f, g, o)
    c_t = σ(f) ⊙ c_{t-1} + σ(i) ⊙ tanh(g),  h_t = σ(o) ⊙ tanh(c_t)

The input projection ``ih`` runs once over the whole sequence (B, T, in); ``hh`` (no
bias: torch's two biases b_ih + b_hh are one parameter here) runs once per time step, and
the book-keeping engine merges its T calls into one Linear record of T positions
(`raydpfl.privacy.per_sample.repeated`): exact, and clipped by the ghost norm or the
materialised product, whichever is cheaper. h_0 = c_0 = 0; batch-first; no dropout
between layers (it would make the per-sample gradient depend on a mask drawn per call).
`load_lstm_` copies an nn.LSTM's weights in (tests check the two agree).

`DPGRU` is the same for a GRU (Cho et al. 2014; torch's gate order r, z, n):

    r = σ(W_ir x + b_ir + W_hr h + b_hr),  z = σ(W_iz x + b_iz + W_hz h + b_hz)
    n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn)),  h' = (1 − z) ⊙ n + z ⊙ h

Here ``hh`` keeps its bias (b_hn sits inside r ⊙ (·), so it is not redundant) and runs at
every step, the first included (h_0 = 0 still passes b_h through it), so its parameters
are exactly nn.GRU's (`load_gru_`).
"""

from __future__ import annotations

import torch
from torch import nn


class _LSTMLayer(nn.Module):
    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.ih = nn.Linear(input_size, 4 * hidden_size)
        self.hh = nn.Linear(hidden_size, 4 * hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, length, _ = x.shape
        gates_x = self.ih(x)  # (B, T, 4H), one call for the whole sequence
        h = c = x.new_zeros(b, self.hidden_size)
        states = []
        for t in range(length):
            # h_0 = 0: the first step needs no hidden-to-hidden product
            gates = gates_x[:, t] if t == 0 else gates_x[:, t] + self.hh(h)
            i, f, g, o = gates.chunk(4, dim=1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            states.append(h)
        if not states:
            return x.new_zeros(b, 0, self.hidden_size)
        return torch.stack(states, dim=1)


class DPLSTM(nn.Module):
    """A batch-first LSTM of `num_layers` layers from Linear cells (module docstring):
    (B, T, input_size) → every hidden state (B, T, hidden_size) of the last layer."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1) -> None:
        super().__init__()
        if input_size < 1 or hidden_size < 1 or num_layers < 1:
            raise ValueError(
                "DPLSTM needs input_size, hidden_size and num_layers >= 1, got "
                f"{input_size}, {hidden_size}, {num_layers}"
            )
        sizes = [input_size] + [hidden_size] * (num_layers - 1)
        self.layers = nn.ModuleList(_LSTMLayer(s, hidden_size) for s in sizes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x

    @torch.no_grad()
    def load_lstm_(self, lstm: nn.LSTM) -> DPLSTM:
        """Copies a batch-first, unidirectional nn.LSTM's weights in (b = b_ih + b_hh)."""
        if lstm.num_layers != len(self.layers) or lstm.bidirectional or lstm.proj_size:
            raise ValueError("load_lstm_: the nn.LSTM must match in layers, one direction")
        for k, layer in enumerate(self.layers):
            layer.ih.weight.copy_(getattr(lstm, f"weight_ih_l{k}"))
            layer.hh.weight.copy_(getattr(lstm, f"weight_hh_l{k}"))
            bias = getattr(lstm, f"bias_ih_l{k}", None)
            if bias is None:
                layer.ih.bias.zero_()
            else:
                layer.ih.bias.copy_(bias + getattr(lstm, f"bias_hh_l{k}"))
        return self


class _GRULayer(nn.Module):
    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.ih = nn.Linear(input_size, 3 * hidden_size)
        self.hh = nn.Linear(hidden_size, 3 * hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, length, _ = x.shape
        gates_x = self.ih(x)  # (B, T, 3H), one call for the whole sequence
        h = x.new_zeros(b, self.hidden_size)
        states = []
        for t in range(length):
            x_r, x_z, x_n = gates_x[:, t].chunk(3, dim=1)
            h_r, h_z, h_n = self.hh(h).chunk(3, dim=1)
            r = torch.sigmoid(x_r + h_r)
            z = torch.sigmoid(x_z + h_z)
            n = torch.tanh(x_n + r * h_n)
            h = (1 - z) * n + z * h
            states.append(h)
        if not states:
            return x.new_zeros(b, 0, self.hidden_size)
        return torch.stack(states, dim=1)


class DPGRU(nn.Module):
    """A batch-first GRU of `num_layers` layers from Linear cells (module docstring):
    (B, T, input_size) → every hidden state (B, T, hidden_size) of the last layer."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1) -> None:
        super().__init__()
        if input_size < 1 or hidden_size < 1 or num_layers < 1:
            raise ValueError(
                "DPGRU needs input_size, hidden_size and num_layers >= 1, got "
                f"{input_size}, {hidden_size}, {num_layers}"
            )
        sizes = [input_size] + [hidden_size] * (num_layers - 1)
        self.layers = nn.ModuleList(_GRULayer(s, hidden_size) for s in sizes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x

    @torch.no_grad()
    def load_gru_(self, gru: nn.GRU) -> DPGRU:
        """Copies a batch-first, unidirectional nn.GRU's weights (and biases) in."""
        if gru.num_layers != len(self.layers) or gru.bidirectional or not gru.bias:
            raise ValueError("load_gru_: the nn.GRU must match in layers, one direction, biases")
        for k, layer in enumerate(self.layers):
            layer.ih.weight.copy_(getattr(gru, f"weight_ih_l{k}"))
            layer.hh.weight.copy_(getattr(gru, f"weight_hh_l{k}"))
            layer.ih.bias.copy_(getattr(gru, f"bias_ih_l{k}"))
            layer.hh.bias.copy_(getattr(gru, f"bias_hh_l{k}"))
        return self
