"""The two W1 floors: single-process, no-framework runners over raydpfl's exact work.

Both floors consume a `BatchPlan`: the cohorts and Poisson batches that raydpfl draws
for the same config and seed, replayed in an untimed pre-pass. raydpfl is used only
to load and partition the data and to replay its RNG streams; the timed loops below
are plain PyTorch and never call raydpfl's training or DP-SGD code, so the floors stay
independent of the thing they measure.

- non-private floor: forward, backward, SGD step on each recorded batch.
- per-sample floor: per-sample gradients by `torch.func` (vmap of grad), flat
  clipping at C, sum, Gaussian noise σ·C, division by the expected batch q·|D_i|.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from raydpfl.algorithms import DPFedAvg
from raydpfl.experiment.build import Experiment
from raydpfl.simulation.seeding import SERVER, numpy_rng, torch_generator

Params = dict[str, torch.Tensor]

#: Same guard as every DP-SGD implementation (opacus, raydpfl): min(1, C / (‖g‖ + ε)).
CLIP_EPS = 1e-6


@dataclass(frozen=True)
class Step:
    """One recorded local step of one client.

    Attributes:
        rows: Indices into the pool of the records Poisson-sampled for this step.
        noise_state: The client's generator state just before the step's noise draw,
            so the per-sample floor adds the very noise raydpfl adds.
    """

    rows: torch.Tensor
    noise_state: torch.Tensor


@dataclass(frozen=True)
class ClientRun:
    """One client's work in one round."""

    client_id: int
    num_examples: int
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class BatchPlan:
    """Everything a floor needs: data, initial model, hyperparameters, recorded batches."""

    x: torch.Tensor
    y: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    input_shape: tuple[int, ...]
    num_classes: int
    init_params: Params
    build_model: Callable[[], nn.Module]  # the workload's architecture (a fresh instance)
    rounds: tuple[tuple[ClientRun, ...], ...]
    eval_every: int
    lr: float
    sampling_rate: float
    clip_norm: float
    noise_multiplier: float

    def round_samples(self) -> list[int]:
        """Records sampled in each round, summed over clients and steps."""
        return [sum(int(s.rows.numel()) for c in rnd for s in c.steps) for rnd in self.rounds]

    def evaluates_after(self, round_idx: int) -> bool:
        """Whether raydpfl's server scores the global model after 0-based `round_idx`."""
        return round_idx + 1 == len(self.rounds) or (round_idx + 1) % self.eval_every == 0


def record_batches(exp: Experiment, rounds: int) -> BatchPlan:
    """Replays raydpfl's cohort and per-client RNG streams for `rounds` rounds (untimed).

    The replay follows DP-FedAvg's draw order on a client's "train" stream: per step,
    ``torch.rand(|D_i|) < q`` for the Poisson mask, then one ``torch.randn`` per
    parameter tensor in ``named_parameters()`` order for the noise. Skipping any draw
    would shift every later batch, so the batch-size check in `w1.py` guards this order.
    """
    algo = exp.algorithm
    if not isinstance(algo, DPFedAvg):
        raise ValueError(f"W1 is DP-FedAvg; the config names {algo.name!r}")
    if exp.device != "cpu":
        raise ValueError(f"the floors run on the CPU; the experiment resolved to {exp.device!r}")
    seed = exp.config.runtime.seed
    shapes = [p.shape for p in exp.init_params.values()]  # named_parameters() order
    ds = exp.dataset
    client_rows = [torch.as_tensor(idx) for idx in ds.client_train]
    plan_rounds = []
    for r in range(rounds):
        cohort = algo.select(r, ds.num_clients, numpy_rng(seed, r, SERVER, "select"))
        clients = []
        for c in cohort:
            gen = torch_generator(seed, r, c, "train")
            rows = client_rows[c]
            steps = []
            for _ in range(algo.local_steps):
                positions = torch.rand(rows.numel(), generator=gen) < algo.sampling_rate
                state = gen.get_state()
                for shape in shapes:
                    torch.randn(shape, generator=gen)
                steps.append(Step(rows[positions.nonzero().flatten()], state))
            clients.append(ClientRun(c, int(rows.numel()), tuple(steps)))
        plan_rounds.append(tuple(clients))
    return BatchPlan(
        x=torch.as_tensor(ds.x),
        y=torch.as_tensor(ds.y),
        x_test=torch.as_tensor(ds.x_test),
        y_test=torch.as_tensor(ds.y_test),
        input_shape=tuple(ds.input_shape),
        num_classes=ds.num_classes,
        init_params={n: t.clone() for n, t in exp.init_params.items()},
        build_model=exp.model_spec.build,
        rounds=tuple(plan_rounds),
        eval_every=exp.config.experiment.algorithm.eval_every,
        lr=algo.lr,
        sampling_rate=algo.sampling_rate,
        clip_norm=algo.clip_norm,
        noise_multiplier=algo.noise_multiplier,
    )


@dataclass
class FloorResult:
    """Per-round wall seconds and the final central test accuracy."""

    round_seconds: list[float]
    test_accuracy: float


# A client trainer: (global params, the client's recorded work) -> its local params.
ClientTrainer = Callable[[Params, ClientRun], Params]


# Called after each round with (0-based round, wall seconds): progress output.
OnRound = Callable[[int, float], None]


def _run_rounds(
    plan: BatchPlan, model: nn.Module, train_client: ClientTrainer, on_round: OnRound | None
) -> FloorResult:
    """FedAvg over the plan's rounds: the |D_i|-weighted mean of the local models.

    That mean equals raydpfl's global + weighted mean of updates. Each round is timed
    from cohort start to the end of its evaluation, like raydpfl's ``wall_seconds``.
    """
    global_params = {n: t.clone() for n, t in plan.init_params.items()}
    seconds, accuracy = [], float("nan")
    for r, clients in enumerate(plan.rounds):
        t0 = time.perf_counter()
        total = {n: torch.zeros_like(t) for n, t in global_params.items()}
        weight = 0
        for client in clients:
            local = train_client(global_params, client)
            for n, t in local.items():
                total[n].add_(t, alpha=client.num_examples)
            weight += client.num_examples
        global_params = {n: t.div_(weight) for n, t in total.items()}
        if plan.evaluates_after(r):
            accuracy = _accuracy(model, global_params, plan.x_test, plan.y_test)
        seconds.append(time.perf_counter() - t0)
        if on_round is not None:
            on_round(r, seconds[-1])
    return FloorResult(seconds, accuracy)


@torch.no_grad()
def _accuracy(
    model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor, batch: int = 2048
) -> float:
    correct = 0
    for i in range(0, x.shape[0], batch):
        logits = functional_call(model, params, (x[i : i + batch],))
        correct += int((logits.argmax(1) == y[i : i + batch]).sum())
    return correct / x.shape[0]


def run_nonprivate(plan: BatchPlan, on_round: OnRound | None = None) -> FloorResult:
    """The non-private floor: plain SGD on the recorded batches.

    The loss is the *sum* over the batch divided by the expected batch q·|D_i| (not
    the mean over the realised batch), so each step has DP-SGD's scale and an empty
    Poisson batch is a zero gradient; such a step is skipped, as SGD would not move.
    """
    model = plan.build_model()
    opt = torch.optim.SGD(model.parameters(), lr=plan.lr)
    params = dict(model.named_parameters())

    def train_client(global_params: Params, client: ClientRun) -> Params:
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(global_params[n])
        expected = plan.sampling_rate * client.num_examples
        for step in client.steps:
            if step.rows.numel() == 0:
                continue
            logits = model(plan.x[step.rows])
            loss = F.cross_entropy(logits, plan.y[step.rows], reduction="sum") / expected
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        # Views of the model's tensors: `_run_rounds` consumes them before the next client.
        return {n: p.detach() for n, p in params.items()}

    return _run_rounds(plan, model, train_client, on_round)


def run_per_sample(plan: BatchPlan, on_round: OnRound | None = None) -> FloorResult:
    """The per-sample floor: DP-SGD with materialised per-sample gradients.

    Per step: g_i by vmap(grad), a_i = min(1, C/(‖g_i‖ + 1e-6)) over all layers
    together, s = Σ a_i g_i + N(0, σ²C²I) with raydpfl's own noise draw (restored
    generator state), w ← w − η·s/(q·|D_i|). The whole batch goes through vmap at
    once: W1's batches are small enough that chunking would only add overhead.
    """
    model = plan.build_model()
    model.requires_grad_(False)  # parameters are passed in functionally

    def sample_loss(params: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = functional_call(model, params, (x.unsqueeze(0),))
        return F.cross_entropy(logits, y.unsqueeze(0))

    per_sample_grads = vmap(grad(sample_loss), in_dims=(None, 0, 0))
    noise_std = plan.noise_multiplier * plan.clip_norm
    gen = torch.Generator()

    def train_client(global_params: Params, client: ClientRun) -> Params:
        params = {n: t.clone() for n, t in global_params.items()}
        step_size = plan.lr / (plan.sampling_rate * client.num_examples)
        for step in client.steps:
            if step.rows.numel():
                grads = per_sample_grads(params, plan.x[step.rows], plan.y[step.rows])
                norms = torch.stack([g.flatten(1).pow(2).sum(1) for g in grads.values()]).sum(0)
                weights = (plan.clip_norm / (norms.sqrt() + CLIP_EPS)).clamp(max=1.0)
                summed = {n: torch.tensordot(weights, g, dims=1) for n, g in grads.items()}
            else:  # an empty Poisson batch still gets its noise
                summed = {n: torch.zeros_like(p) for n, p in params.items()}
            gen.set_state(step.noise_state)
            for n, p in params.items():
                s = summed[n].add_(torch.randn(p.shape, generator=gen), alpha=noise_std)
                p.sub_(s, alpha=step_size)
        return params

    return _run_rounds(plan, model, train_client, on_round)
