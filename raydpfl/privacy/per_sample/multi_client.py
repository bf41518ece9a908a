"""DP-SGD for several clients at once: stacked parameters, padded Poisson batches, masks.

A worker that trains its clients one after another pays, per client and per step, for
a handful of small kernels and the Python around them. With small models (W3: 4,266
parameters, ~6 records per client) that overhead *is* the cost, and on a GPU one small
client cannot fill the device. The clients of a task group all start from the same
broadcast parameters and run the same τ steps, so they can be trained together: one
copy of the parameters per client, stacked along a leading client axis, and every step
computed for all of them at once (by either engine below).

Privacy and reproducibility contract (design.md §4): for every client the result is
the one `raydpfl.algorithms.dp_fedavg.dp_sgd_local_update` (normalizer ``expected``)
gives, up to float error from a different order of summation:

- each client's RNG stream is consumed exactly as the one-at-a-time loop consumes it:
  per step, first the Poisson draw ``rand(|D_i|) < q``, then (if σ > 0) one
  ``randn(shape)`` per parameter tensor in parameter order. Streams are separate
  generators, so the interleaving *between* clients does not matter, and the RNG state
  each client is left in is the same as after the sequential loop (both go through
  `dpsgd.uniform_draws` and `dpsgd.fill_gaussian_`, which draw from `os.urandom`
  instead for a secure-noise stream);
- per-sample gradients are clipped (flat, ``clip_weights``) before anything is summed;
  padded batch slots get weight exactly 0, so they contribute nothing (they replay one
  of the client's own records, never another client's, and are never counted in the
  statistics);
- noise N(0, σ²C²) is added to each client's own clipped sum, which is divided by that
  client's q·|D_i| (an empty Poisson batch is a noise-only step, as in the sequential
  path);
- clients never interact: chunking clients, or changing which clients share a group,
  changes nothing but float rounding;
- fixed shapes (``privacy.batch_shape: fixed``, `run`'s ``max_batch_size`` B): each
  client's Poisson sample is truncated to B on its own stream, right after its Poisson
  draw and before its noise (`dpsgd.truncate_sample`, as `LiveSubsampledGaussian.sample`
  does one client at a time), and every step, the first included, runs on (clients, B)
  padded batches, so the per-step shapes never change.

Two engines compute the clipped per-client sums (`MultiClientDPSGD(engine=...)`):

- ``vmap``: materialised per-sample gradients. At the first step every client still
  holds the broadcast parameters, so the gradients of all clients' samples come from
  one vmap over the concatenated real samples (no padding, parameters not copied);
  later steps use the padded layout and vmap over clients of vmap over samples.
- ``bookkeeping``: the book-keeping method of `raydpfl.privacy.per_sample.bookkeeping` run for all
  clients at once in the padded layout (`_GroupedBookkeeping`): grouped Linear / Conv2d
  / GroupNorm ops over the stacked parameters, norms from layer inputs and output
  gradients, no per-sample gradients formed for the large layers.

``auto`` takes vmap for small models (≤ `CPU_MAX_PARAMS`; W3's CNN: vmap 2.2x, grouped
book-keeping 1.7x the sequential speed, because first-step vmap needs no padding) and
book-keeping for larger ones where every layer has a rule. Memory is bounded by
`memory_budget_bytes`: per-sample gradients (vmap) or activations (book-keeping) are
formed in slices of samples that fit, and clients are processed in chunks whose
stacked state (parameters, start, gradient sum, noise) fits.

This module works on plain tensors (the privacy layer does not know about tasks or
results); `DPFedAvg.local_update_group` wraps it for the worker.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import grad, vmap

from raydpfl.privacy.per_sample.bookkeeping import SharedLayerError
from raydpfl.privacy.per_sample.dpsgd import (
    Params,
    clip_weights,
    fill_gaussian_,
    record_loss,
    truncate_sample,
    uniform_draws,
)

#: Default bound on the bytes of per-sample gradients formed at once (and on the
#: stacked per-client state of one chunk).
DEFAULT_MEMORY_BUDGET = 512 * 2**20

#: On CPU, vectorising pays only for small models: there the per-client overhead of the
#: sequential loop dominates, while for larger ones the per-sample gradients that vmap
#: materialises cost more than the book-keeping engine's norms, and the grouped
#: book-keeping's large batches fall out of cache. Measured (1 thread, loaded 2-core
#: box, benchmarks/vectorised_clients.py; vectorised / sequential book-keeping):
#: 4,266-parameter CNN 2.2x (vmap); LeNet-5 (61,706) 0.6-0.7x, MLP 784-200-10 (159k)
#: 0.24x, FedAvgCNN (582k) 0.16x (vmap) and 0.36x (grouped book-keeping; 0.5-1.4x with
#: 12-48 MiB budgets, i.e. hardly vectorised).
CPU_MAX_PARAMS = 20_000


def pays_off(model: nn.Module, device: torch.device | str) -> bool:
    """Whether training a group vectorised is expected to beat one client at a time:
    always on a GPU (one small client cannot fill it), on CPU for small models only.
    Never for a model with buffers: one that writes them in its forward (a running
    statistic) cannot be trained inside torch.func's transforms, and no zoo model has
    any; one client at a time trains it."""
    if any(True for _ in model.buffers()):
        return False
    if torch.device(device).type != "cpu":
        return True
    return sum(p.numel() for p in model.parameters()) <= CPU_MAX_PARAMS


def same_device(a: torch.device, b: torch.device) -> bool:
    """Whether `a` and `b` are one device: ``cuda`` (the current device, as a CUDA
    generator reports it) and ``cuda:0`` are, when 0 is current."""
    if a.type != b.type:
        return False
    if a.index is None or b.index is None:
        current = torch.cuda.current_device() if a.type == "cuda" else 0
        return (a.index if a.index is not None else current) == (
            b.index if b.index is not None else current
        )
    return a.index == b.index


@dataclass(frozen=True)
class MultiClientResult:
    """What a vectorised local update returns for its clients (in input order).

    Attributes:
        updates: {name: (C, *shape)}: row i is client i's update (local − start).
        batch_sizes: (C, τ) realised Poisson batch sizes (int64, CPU).
        clipped_fractions: (C, τ) fraction of each batch whose clip weight was < 1
            (0 for an empty batch), as `StepStats.clipped_fraction` (float64, CPU).
    """

    updates: Params
    batch_sizes: torch.Tensor
    clipped_fractions: torch.Tensor

    def update(self, i: int) -> Params:
        """Client i's update (views into the stacked tensors)."""
        return {name: t[i] for name, t in self.updates.items()}

    def metrics(self, i: int) -> dict[str, float]:
        """Client i's diagnostics, named and averaged as the sequential path does."""
        steps = self.batch_sizes.shape[1]
        if steps == 0:
            return {"mean_batch_size": 0.0, "clipped_fraction": 0.0}
        return {
            "mean_batch_size": float(self.batch_sizes[i].double().mean()),
            "clipped_fraction": float(self.clipped_fractions[i].mean()),
        }


class _StepSettings(NamedTuple):
    """`MultiClientDPSGD.run`'s step settings, as one chunk of clients receives them."""

    local_steps: int
    lr: float
    sampling_rate: float
    clip_norm: float
    noise_multiplier: float
    max_batch_size: int | None = None


class MultiClientDPSGD:
    """Vectorised DP-SGD local training of many clients of one resident model.

    Build one per model (`for_model` caches it); the model is used functionally, its own
    parameters are never read or written.

    Args:
        model: The worker's resident model (cross-entropy classifier, no BatchNorm).
        memory_budget_bytes: Bound on per-sample gradient bytes formed at once and on
            the stacked state of one client chunk.
        max_clients: Optional hard cap on clients per chunk (the budget may cap lower).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET,
        max_clients: int | None = None,
        engine: str = "auto",
    ) -> None:
        if engine not in ("auto", "bookkeeping", "vmap"):
            raise ValueError(f"engine must be auto, bookkeeping or vmap, got {engine!r}")
        if memory_budget_bytes <= 0:
            raise ValueError(f"memory_budget_bytes must be > 0, got {memory_budget_bytes}")
        if max_clients is not None and max_clients < 1:
            raise ValueError(f"max_clients must be >= 1, got {max_clients}")
        self.model = model
        self.memory_budget_bytes = memory_budget_bytes
        self.max_clients = max_clients
        self.buffers = {n: b.detach() for n, b in model.named_buffers()}
        per_sample = grad(record_loss(model, self.buffers))
        # Shared parameters (first step): one vmap over the samples of all clients.
        self._shared = vmap(per_sample, in_dims=(None, 0, 0))
        # Stacked parameters: vmap over clients of vmap over that client's padded batch.
        self._stacked = vmap(vmap(per_sample, in_dims=(None, 0, 0)), in_dims=(0, 0, 0))
        from raydpfl.privacy.per_sample import bookkeeping  # imports dpsgd, like this module

        small = sum(p.numel() for p in model.parameters()) <= CPU_MAX_PARAMS
        use_bk = engine == "bookkeeping" or (
            engine == "auto" and not small and bookkeeping.supports(model)
        )
        self._grouped = _GroupedBookkeeping(model) if use_bk else None
        self.engine = "bookkeeping" if use_bk else "vmap"

    # ---- public ------------------------------------------------------------------
    def run(
        self,
        params: Params,
        x: torch.Tensor,
        y: torch.Tensor,
        client_indices: Sequence[torch.Tensor],
        generators: Sequence[torch.Generator],
        *,
        local_steps: int,
        lr: float,
        sampling_rate: float,
        clip_norm: float,
        noise_multiplier: float,
        max_batch_size: int | None = None,
    ) -> MultiClientResult:
        """τ DP-SGD steps for every client from the shared `params` (not modified).

        Args:
            params: The broadcast starting parameters, shared by all clients.
            x, y: The worker's resident data pool.
            client_indices: Per client, its records' rows in the pool (|D_i| ≥ 1).
            generators: Per client, its RNG stream for this task (advanced in place,
                exactly as the sequential loop advances it).
            local_steps: τ.
            lr: SGD learning rate η.
            sampling_rate: Poisson rate q in [0, 1].
            clip_norm: C > 0.
            noise_multiplier: σ ≥ 0 (noise std σ·C on each client's clipped sum).
            max_batch_size: B for fixed shapes (``privacy.batch_shape: fixed``): each
                client's Poisson sample is truncated to B records by a uniformly random
                subset (`dpsgd.truncate_sample`, from its stream right after its Poisson
                draw, as the sequential `LiveSubsampledGaussian.sample` draws it), and
                every step runs on (clients, B) padded batches whose masked slots
                contribute exactly 0; the divisor stays q·|D_i|. None: plain Poisson,
                batches padded to each step's largest.
        """
        if len(client_indices) != len(generators):
            raise ValueError(f"{len(client_indices)} clients but {len(generators)} generators")
        if not 0.0 <= sampling_rate <= 1.0:
            raise ValueError(f"sampling_rate must be in [0, 1], got {sampling_rate}")
        if clip_norm <= 0:
            raise ValueError(f"clip_norm must be > 0, got {clip_norm}")
        if noise_multiplier < 0:
            raise ValueError(f"noise std must be >= 0, got {noise_multiplier * clip_norm}")
        if max_batch_size is not None and (
            isinstance(max_batch_size, bool)
            or not isinstance(max_batch_size, int)
            or max_batch_size < 1
        ):
            raise ValueError(f"max_batch_size must be an int >= 1 or None, got {max_batch_size!r}")
        for idx in client_indices:
            if sampling_rate * idx.numel() <= 0:
                raise ValueError(
                    f"expected_batch_size must be > 0, got {sampling_rate * idx.numel()}"
                )
        chunk = self.clients_per_chunk(params)
        parts = [
            self._run_chunk(
                params,
                x,
                y,
                client_indices[s : s + chunk],
                generators[s : s + chunk],
                _StepSettings(
                    local_steps, lr, sampling_rate, clip_norm, noise_multiplier, max_batch_size
                ),
            )
            for s in range(0, len(client_indices), chunk)
        ]
        if not parts:
            return MultiClientResult(
                updates={n: p.new_zeros((0, *p.shape)) for n, p in params.items()},
                batch_sizes=torch.zeros((0, local_steps), dtype=torch.int64),
                clipped_fractions=torch.zeros((0, local_steps), dtype=torch.float64),
            )
        if len(parts) == 1:
            return parts[0]
        return MultiClientResult(
            updates={n: torch.cat([p.updates[n] for p in parts]) for n in params},
            batch_sizes=torch.cat([p.batch_sizes for p in parts]),
            clipped_fractions=torch.cat([p.clipped_fractions for p in parts]),
        )

    def clients_per_chunk(self, params: Params) -> int:
        """How many clients are trained together: their stacked state (parameters,
        start, gradient sum, noise: 4 copies) must fit the memory budget."""
        per_client = 4 * sum(p.numel() * p.element_size() for p in params.values())
        chunk = max(1, self.memory_budget_bytes // max(per_client, 1))
        return chunk if self.max_clients is None else min(chunk, self.max_clients)

    # ---- one chunk of clients ----------------------------------------------------
    def _run_chunk(
        self,
        params: Params,
        x: torch.Tensor,
        y: torch.Tensor,
        client_indices: Sequence[torch.Tensor],
        generators: Sequence[torch.Generator],
        settings: _StepSettings,
    ) -> MultiClientResult:
        local_steps, lr, sampling_rate, clip_norm, noise_multiplier, cap = settings
        c = len(client_indices)
        ref = next(iter(params.values()))
        device, dtype = ref.device, ref.dtype
        sizes = [int(i.numel()) for i in client_indices]
        std = noise_multiplier * clip_norm
        # The sequential step's scales lr/(q·|D_i|), computed as it computes them (Python
        # floats), then cast to the parameters' dtype.
        scales = [lr / (sampling_rate * n) for n in sizes]
        step_scale = torch.tensor(scales, dtype=dtype, device=device)
        all_rows = torch.cat([i.to(device) for i in client_indices])
        owner = torch.repeat_interleave(
            torch.arange(c, device=device), torch.tensor(sizes, device=device)
        )
        first_row = torch.stack([i[0].to(device) for i in client_indices])
        start = {n: p.detach() for n, p in params.items()}
        stacked: Params | None = None  # per-client parameters, created after step 0
        batch_sizes = torch.zeros((c, local_steps), dtype=torch.int64)
        clipped = torch.zeros((c, local_steps), dtype=torch.float64)
        bytes_per_sample = sum(p.numel() * p.element_size() for p in params.values())
        # per-sample gradients plus their weighted copies: about 2 per-sample gradients
        slice_samples = max(1, self.memory_budget_bytes // (2 * bytes_per_sample))
        # book-keeping holds activations, not per-sample gradients: bound those instead
        x_slice = max(1, self.memory_budget_bytes // (64 * x[0].numel() * x.element_size()))
        for step in range(local_steps):
            # (a) every client's draws, in the sequential loop's order: mask, then noise.
            # `rand` of the concatenation equals the per-client draws (separate streams).
            uniforms = torch.cat(
                [uniform_draws(n, g) for n, g in zip(sizes, generators, strict=True)]
            ).to(device)
            chosen = (uniforms < sampling_rate).nonzero().flatten()
            if cap is not None:  # truncation draws follow each client's Poisson draw
                chosen = _truncate(chosen, owner, sizes, cap, generators)
            noise = self._draw_noise(start, generators, std)
            rows, seg = all_rows[chosen], owner[chosen]
            counts = torch.bincount(seg, minlength=c)
            # (b)+(c) the clipped per-sample gradient sum of every client; with a cap,
            # always in the fixed (clients, B) padded layout
            summed = None
            current = stacked or {n: p.unsqueeze(0).expand(c, *p.shape) for n, p in start.items()}
            if self._grouped is not None:
                try:
                    summed, num_clipped = self._grouped_step(
                        current, x, y, rows, seg, counts, first_row, clip_norm, x_slice, cap
                    )
                except SharedLayerError as e:  # this step's draws are made: recompute
                    self._use_vmap(e)
            if summed is None and stacked is None and cap is None:
                summed, num_clipped = self._shared_step(
                    start, x[rows], y[rows], seg, c, clip_norm, slice_samples
                )
            elif summed is None:
                summed, num_clipped = self._stacked_step(
                    current, x, y, rows, seg, counts, first_row, clip_norm, slice_samples, cap
                )
            counts_cpu, clipped_cpu = counts.cpu(), num_clipped.cpu()
            batch_sizes[:, step] = counts_cpu
            clipped[:, step] = torch.where(
                counts_cpu > 0, clipped_cpu.double() / counts_cpu.clamp(min=1).double(), 0.0
            )
            # each client's SGD step on its own noisy sum over its own q·|D_i|, as in
            # `dp_sgd_step_`: p ← p − (lr/B)·(z + s), z ~ N(0, σ²C²I)
            if stacked is None:
                stacked = {n: p.unsqueeze(0).repeat(c, *([1] * p.dim())) for n, p in start.items()}
            for name, s in summed.items():
                shape = (-1, *([1] * (s.dim() - 1)))
                noisy = s if noise is None else noise[name].add_(s)
                stacked[name].addcmul_(noisy, step_scale.view(shape), value=-1)
        if stacked is None:  # τ = 0
            updates = {
                n: torch.zeros((c, *p.shape), dtype=p.dtype, device=device)
                for n, p in start.items()
            }
        else:
            updates = {n: stacked[n] - start[n] for n in start}
        return MultiClientResult(updates, batch_sizes, clipped)

    def _use_vmap(self, error: Exception) -> None:
        """From now on this model's groups use the vmap engine (see `SharedLayerError`)."""
        warnings.warn(
            f"{type(self.model).__name__}: {error}; vectorised clients use torch.func "
            "per-sample gradients for this model",
            stacklevel=3,
        )
        self._grouped = None
        self.engine = "vmap"

    def _grouped_step(
        self,
        stacked: Params,
        x: torch.Tensor,
        y: torch.Tensor,
        rows: torch.Tensor,
        seg: torch.Tensor,
        counts: torch.Tensor,
        first_row: torch.Tensor,
        clip_norm: float,
        slice_samples: int,
        width: int | None = None,
    ) -> tuple[Params, torch.Tensor]:
        """Book-keeping over the padded batches of all clients (see `_GroupedBookkeeping`),
        padded to `width` (fixed shapes) or to the step's largest batch."""
        assert self._grouped is not None
        c = counts.shape[0]
        summed = {
            n: torch.zeros((c, *p.shape[1:]), dtype=p.dtype, device=p.device)
            for n, p in stacked.items()
        }
        num_clipped = torch.zeros(c, dtype=torch.int64, device=seg.device)
        padded, mask = _pad(rows, seg, counts, first_row, width)
        cols = max(1, slice_samples // max(c, 1))
        for s0 in range(0, padded.shape[1], cols):
            idx, m = padded[:, s0 : s0 + cols], mask[:, s0 : s0 + cols]
            part, clipped = self._grouped.clipped_sums(stacked, x[idx], y[idx], m, clip_norm)
            for name, t in part.items():
                summed[name].add_(t)
            num_clipped += clipped
        return summed, num_clipped

    @staticmethod
    def _draw_noise(
        params: Params, generators: Sequence[torch.Generator], std: float
    ) -> Params | None:
        """Per client, N(0, std²) per entry, one draw per tensor in parameter order (what
        `dp_sgd_step_` draws: `gaussian_like`); none at all when std is 0, as there."""
        if std == 0:
            return None
        c = len(generators)
        noise = {n: p.new_empty((c, *p.shape)) for n, p in params.items()}
        for i, g in enumerate(generators):
            for name, p in params.items():
                if same_device(g.device, p.device):
                    fill_gaussian_(noise[name][i], std, g)
                else:  # a generator on another device: draw there (its own stream), copy
                    draw = torch.empty(p.shape, dtype=p.dtype, device=g.device)
                    noise[name][i].copy_(fill_gaussian_(draw, std, g))
        return noise

    def _shared_step(
        self,
        params: Params,
        xs: torch.Tensor,
        ys: torch.Tensor,
        seg: torch.Tensor,
        c: int,
        clip_norm: float,
        slice_samples: int,
    ) -> tuple[Params, torch.Tensor]:
        """All clients at the broadcast parameters: per-sample gradients of the real
        samples (no padding), clipped, then summed into each sample's own client."""
        summed = {n: p.new_zeros((c, *p.shape)) for n, p in params.items()}
        num_clipped = torch.zeros(c, dtype=torch.int64, device=seg.device)
        for s0 in range(0, xs.shape[0], slice_samples):
            sl = slice(s0, s0 + slice_samples)
            grads = self._shared(params, xs[sl], ys[sl])
            weights = clip_weights(_flat_norms(grads, 1), clip_norm)
            num_clipped.index_add_(0, seg[sl], (weights < 1.0).long())
            for name, g in grads.items():
                w = weights.to(g.dtype).view(-1, *([1] * (g.dim() - 1)))
                summed[name].index_add_(0, seg[sl], g * w)
        return summed, num_clipped

    def _stacked_step(
        self,
        stacked: Params,
        x: torch.Tensor,
        y: torch.Tensor,
        rows: torch.Tensor,
        seg: torch.Tensor,
        counts: torch.Tensor,
        first_row: torch.Tensor,
        clip_norm: float,
        slice_samples: int,
        width: int | None = None,
    ) -> tuple[Params, torch.Tensor]:
        """Each client at its own parameters: batches padded to `width` (fixed shapes) or
        to the step's largest, with a mask; padded slots replay the client's first record
        with weight exactly 0."""
        c = counts.shape[0]
        summed = {n: torch.zeros_like(p) for n, p in stacked.items()}
        num_clipped = torch.zeros(c, dtype=torch.int64, device=seg.device)
        padded, mask = _pad(rows, seg, counts, first_row, width)
        width = padded.shape[1]
        # slice the padded batch so that c × slice per-sample gradients fit the budget
        cols = max(1, slice_samples // c)
        for s0 in range(0, width, cols):
            idx, m = padded[:, s0 : s0 + cols], mask[:, s0 : s0 + cols]
            grads = self._stacked(stacked, x[idx], y[idx])
            weights = clip_weights(_flat_norms(grads, 2), clip_norm)
            weights = torch.where(m, weights, torch.zeros_like(weights))
            num_clipped += ((weights < 1.0) & m).sum(1)
            for name, g in grads.items():
                b = g.shape[1]
                part = torch.bmm(weights.to(g.dtype).unsqueeze(1), g.reshape(c, b, -1))
                summed[name].add_(part.view_as(summed[name]))
        return summed, num_clipped


class _GroupedBookkeeping:
    """Book-keeping clipping for C clients at once, each at its own parameters.

    Samples are laid out client-major, ``C·B`` rows (B padded slots per client), so
    every parameter-free layer (ReLU, pooling, flatten) runs unchanged; each Linear,
    Conv2d and GroupNorm runs as one grouped op over the clients' stacked parameters
    (batched matmul, grouped convolution, per-client affine). The per-sample norms come
    from the layer inputs and output gradients by the single-client engine's own rules
    (`bookkeeping._norm_sq`, which only sees per-sample tensors), and each client's
    weighted gradient Σ_i a_i ∇θ ℓ_i is one grouped weight-gradient product. Padded
    slots have their loss multiplied by 0, so their output gradients, norms and
    contributions are exactly 0.

    The grouped ops are installed as instance ``forward`` attributes of the resident
    model's layers for the duration of one call (and removed after): the model must not
    be used from another thread meanwhile (a worker trains and evaluates in turn).
    """

    def __init__(self, model: nn.Module) -> None:
        from raydpfl.privacy.per_sample import bookkeeping

        if not bookkeeping.supports(model):
            raise ValueError(f"{type(model).__name__} has a layer without a book-keeping rule")
        self._bk = bookkeeping
        self.model = model
        self.buffers = {n: b.detach() for n, b in model.named_buffers()}
        self.layers = [
            (name, m) for name, m in model.named_modules() if isinstance(m, bookkeeping._SUPPORTED)
        ]

    def clipped_sums(
        self,
        stacked: Params,
        xs: torch.Tensor,
        ys: torch.Tensor,
        mask: torch.Tensor,
        clip_norm: float,
    ) -> tuple[Params, torch.Tensor]:
        """Per client Σ_i a_i g_i over its real samples; xs (C, B, ...), mask (C, B)."""
        c, b = mask.shape
        bk = self._bk
        leaves = {n: t.detach().requires_grad_(True) for n, t in stacked.items()}
        records: list = []
        patched = []
        for name, m in self.layers:
            # an instance attribute shadows the class's forward for this call only
            patched.append((m, m.__dict__.get("forward")))
            m.forward = self._grouped_forward(m, name, leaves, c, records)
        try:
            with torch.enable_grad():
                logits = self.model(xs.reshape(c * b, *xs.shape[2:]))
                losses = F.cross_entropy(logits, ys.reshape(-1), reduction="none")
                losses = losses * mask.reshape(-1).to(losses.dtype)
                grads = torch.autograd.grad(losses.sum(), [r.output for r in records])
        finally:
            for m, previous in patched:
                if previous is None:
                    del m.forward
                else:
                    m.forward = previous
        bk.check_no_shared_layers(records)  # before any sum: the caller falls back to vmap
        norms_sq = torch.zeros(c * b, dtype=xs.dtype, device=xs.device)
        for rec, g in zip(records, grads, strict=True):
            rec.grad = g.detach()
            rec.output = rec.output.detach()
            norms_sq += bk._norm_sq(rec)
        norms = norms_sq.sqrt().view(c, b)
        weights = torch.where(mask, clip_weights(norms, clip_norm), torch.zeros_like(norms))
        num_clipped = ((weights < 1.0) & mask).sum(1)
        summed: Params = {}
        for rec in records:
            summed.update(self._weighted(rec, weights))
        return {n: summed[n] for n in stacked}, num_clipped

    def _grouped_forward(self, m: nn.Module, name: str, params: Params, c: int, records: list):
        prefix = f"{name}." if name else ""
        weight = params[prefix + "weight"]
        bias = params.get(prefix + "bias")
        bk = self._bk

        def forward(x: torch.Tensor) -> torch.Tensor:
            n = x.shape[0]
            if isinstance(m, nn.Linear):
                flat = x.reshape(c, -1, x.shape[-1])
                out = torch.bmm(flat, weight.transpose(1, 2))
                if bias is not None:
                    out = out + bias.unsqueeze(1)
                out = out.reshape(*x.shape[:-1], weight.shape[1])
            elif isinstance(m, nn.Conv2d):
                grouped = x.view(c, n // c, *x.shape[1:]).transpose(0, 1).flatten(1, 2)
                out = F.conv2d(
                    grouped,
                    weight.flatten(0, 1),
                    None if bias is None else bias.flatten(),
                    stride=m.stride,
                    padding=m.padding,
                    dilation=m.dilation,
                    groups=c,
                )
                out = out.view(n // c, c, -1, *out.shape[2:]).transpose(0, 1)
                out = out.reshape(n, *out.shape[2:])
            else:  # GroupNorm
                normed = F.group_norm(x, m.num_groups, eps=m.eps)
                shape = (c, 1, -1) + (1,) * (x.dim() - 2)
                out = normed.view(c, n // c, *x.shape[1:]) * weight.view(shape) + bias.view(shape)
                out = out.reshape(x.shape)
            records.append(bk._Record(m, name, x.detach(), out))
            return out

        return forward

    def _weighted(self, rec, weights: torch.Tensor) -> Params:
        """Σ_{i ∈ client} a_i ∇θ ℓ_i for the layer's parameters, (C, *shape) each."""
        m, g, a = rec.module, rec.grad, rec.inputs
        c, b = weights.shape
        shape = (-1,) + (1,) * (g.dim() - 1)
        gw = g * weights.reshape(-1).to(g.dtype).view(shape)
        out: Params = {}
        if rec.per_sample is not None:  # kept (C·B, q, p) per-sample weight gradients
            ps = rec.per_sample.reshape(c, b, -1)
            w = weights.to(ps.dtype).unsqueeze(1)
            out["weight"] = self._bk._as_weight(rec, torch.bmm(w, ps), (c,))
            if m.bias is not None:  # kept (C·B, q) per-sample bias gradients
                out["bias"] = torch.bmm(w, rec.per_sample_bias.reshape(c, b, -1)).squeeze(1)
        elif isinstance(m, nn.GroupNorm):
            x_hat = F.group_norm(a, m.num_groups, eps=m.eps)
            dims = tuple(range(2, g.dim()))
            out["weight"] = (gw * x_hat).sum(dims).view(c, b, -1).sum(1)
            out["bias"] = gw.sum(dims).view(c, b, -1).sum(1)
        elif isinstance(m, nn.Conv2d):
            n = a.shape[0]
            inp = a.view(c, n // c, *a.shape[1:]).transpose(0, 1).flatten(1, 2)
            go = gw.view(c, n // c, *gw.shape[1:]).transpose(0, 1).flatten(1, 2)
            w = torch.nn.grad.conv2d_weight(
                inp,
                (c * m.weight.shape[0], *m.weight.shape[1:]),
                go,
                stride=m.stride,
                padding=m.padding,
                dilation=m.dilation,
                groups=c,
            )
            out["weight"] = w.view(c, *m.weight.shape)
            if m.bias is not None:
                out["bias"] = gw.sum((2, 3)).view(c, b, -1).sum(1)
        else:  # Linear
            a3, g3 = a.reshape(c, -1, a.shape[-1]), gw.reshape(c, -1, gw.shape[-1])
            out["weight"] = torch.bmm(g3.transpose(1, 2), a3)
            if m.bias is not None:
                out["bias"] = g3.sum(1)
        prefix = f"{rec.prefix}." if rec.prefix else ""
        return {prefix + k: v for k, v in out.items()}


def _truncate(
    chosen: torch.Tensor,
    owner: torch.Tensor,
    sizes: Sequence[int],
    cap: int,
    generators: Sequence[torch.Generator],
) -> torch.Tensor:
    """The Poisson-chosen positions (into the concatenated records) of every client,
    each client's truncated to `cap` by `dpsgd.truncate_sample` on its own stream (only a
    client over the cap draws), in client order."""
    seg = owner[chosen]
    counts = torch.bincount(seg, minlength=len(sizes)).tolist()
    if max(counts, default=0) <= cap:
        return chosen
    offsets = [0]
    for n in sizes:
        offsets.append(offsets[-1] + n)
    parts = []
    start = 0
    for i, (k, g) in enumerate(zip(counts, generators, strict=True)):
        mine = chosen[start : start + k]
        start += k
        if k > cap:  # the same draw as the sequential sample: positions in the client's own
            local = truncate_sample((mine - offsets[i]).to(g.device), cap, g)
            mine = local.to(chosen.device) + offsets[i]
        parts.append(mine)
    return torch.cat(parts)


def _pad(
    rows: torch.Tensor,
    seg: torch.Tensor,
    counts: torch.Tensor,
    first_row: torch.Tensor,
    width: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(C, W) pool rows of each client's batch padded to W (`width`, or the largest
    batch) with the client's own first record, and the mask of real slots."""
    c = counts.shape[0]
    if width is None:
        width = int(counts.max()) if c else 0
    offsets = torch.cumsum(counts, 0) - counts
    rank = torch.arange(rows.numel(), device=rows.device) - offsets[seg]
    padded = first_row.unsqueeze(1).repeat(1, width)
    padded[seg, rank] = rows
    mask = torch.zeros((c, width), dtype=torch.bool, device=rows.device)
    mask[seg, rank] = True
    return padded, mask


def _flat_norms(grads: Params, batch_dims: int) -> torch.Tensor:
    """‖g‖₂ over all parameters together (flat clipping), one per sample."""
    squares = [g.flatten(batch_dims).pow(2).sum(-1) for g in grads.values()]
    return torch.stack(squares, dim=0).sum(0).sqrt()


_ENGINES: weakref.WeakKeyDictionary[nn.Module, MultiClientDPSGD] = weakref.WeakKeyDictionary()


def for_model(model: nn.Module) -> MultiClientDPSGD:
    """The (cached) vectorised trainer of a resident model, with the default budget of
    its device (`default_budget`)."""
    engine = _ENGINES.get(model)
    if engine is None:
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        engine = MultiClientDPSGD(model, memory_budget_bytes=default_budget(device))
        _ENGINES[model] = engine
    return engine


def default_budget(device: torch.device | str) -> int:
    """`DEFAULT_MEMORY_BUDGET` on CPU; a quarter of the GPU's memory on CUDA, where wide
    slices are what keeps the device busy."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory // 4
    return DEFAULT_MEMORY_BUDGET


def run_sessions(
    sessions: Sequence[object],
    params: Params,
    *,
    local_steps: int,
    lr: float,
) -> MultiClientResult:
    """τ DP-SGD steps for every client of a vectorised group, run by the platform: each
    client's records, stream and declared `SubsampledGaussian` come from its worker-bound
    `raydpfl.privacy.mechanisms.kernel.PrivacySession`, and each session counts its τ invocations.
    The algorithm chooses only τ and η (`DPFedAvg.local_update_group_sum`).

    Raises:
        PrivacyContractError: A session is not bound to a client's records, the clients do
            not share one mechanism and one resident pool, or an invocation is open.
    """
    from raydpfl.privacy.mechanisms.kernel import (
        STEP_STATS_NOTE,
        PrivacyContractError,
        PrivacySession,
        check_batch_shape,
    )

    lives = []
    for session in sessions:
        if not isinstance(session, PrivacySession) or session._records is None:
            raise PrivacyContractError(
                "a vectorised group trains from its clients' worker-bound privacy sessions"
            )
        lives.append(session.dp_sgd())
    mech = lives[0].mechanism

    def shared(m: object) -> tuple:  # a truncated mechanism also names its client's |D|
        return (m.noise_multiplier, m.clip_norm, m.sampling_rate, m.max_batch_size)  # type: ignore[attr-defined]

    if any(shared(live.mechanism) != shared(mech) for live in lives):
        raise PrivacyContractError("a vectorised group must share one DP-SGD mechanism")
    records = [s._records for s in sessions]  # type: ignore[attr-defined]
    first = records[0]
    if any(r._x is not first._x or r._y is not first._y for r in records):
        raise PrivacyContractError("a vectorised group must share one resident data pool")
    for live, r in zip(lives, records, strict=True):
        check_batch_shape(live.mechanism, r.num_examples)
    out = for_model(sessions[0]._model).run(  # type: ignore[attr-defined]
        params,
        first._x,
        first._y,
        [r._indices for r in records],
        [live._generator for live in lives],
        local_steps=local_steps,
        lr=lr,
        sampling_rate=mech.sampling_rate,
        clip_norm=mech.clip_norm,
        noise_multiplier=mech.noise_multiplier,
        max_batch_size=mech.max_batch_size,
    )
    for live in lives:  # the engine drew τ Poisson batches and noises per client
        live._count_vectorised(local_steps)
    for session in sessions:  # its batch sizes and clipped fractions go back un-noised
        session._note(STEP_STATS_NOTE)  # type: ignore[attr-defined]
    return out
