"""The floors: no-framework runners over raydpfl's exact work.

Every floor consumes a `BatchPlan`: the cohorts and Poisson batches that raydpfl draws
for the same config and seed, replayed in an untimed pre-pass, and the split of each
round's clients over worker processes that raydpfl's Ray pool makes. raydpfl is used
only to load and partition the data, to replay its RNG streams and to compute that
split; the timed loops below are plain PyTorch and never call raydpfl's training or
DP-SGD code, so the floors stay independent of the thing they measure.

- non-private floor: forward, backward, SGD step on each recorded batch, client after
  client; in one process (`run_nonprivate(processes=1)`) or in P one-thread worker
  processes that train the clients the Ray pool's P workers train (`processes=P`: the
  like-for-like floor of the Ray backend).
- client-vectorised non-private floor (`run_vectorised_nonprivate`): the same SGD
  steps for a chunk of clients at once (stacked parameters, padded batches, masks,
  `vmap` over clients): the floor for raydpfl's client-vectorised DP-SGD (W3).
- per-sample floor: per-sample gradients by `torch.func` (vmap of grad), flat
  clipping at C, sum, Gaussian noise σ·C, division by the expected batch q·|D_i|.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from raydpfl.algorithms import DPFedAvg
from raydpfl.experiment.build import Experiment
from raydpfl.privacy.noise import counter_noise
from raydpfl.privacy.noise.noise_samplers import seeded_stream
from raydpfl.simulation.reduction import lpt_bins
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
    #: Per round, per worker process: positions (into that round's clients) of the
    #: clients the Ray pool's worker trains, in plan order.
    splits: tuple[tuple[tuple[int, ...], ...], ...]
    eval_every: int
    lr: float
    sampling_rate: float
    clip_norm: float
    noise_multiplier: float
    #: raydpfl's Gaussian sampler (``privacy.noise_sampler``): ``torch`` (one randn per
    #: tensor) or ``ziggurat``/``boxmuller`` (one seed draw per tensor, then the sampler's
    #: documented stream, `raydpfl.privacy.noise.counter_noise`), replayed by the per-sample floor.
    noise_sampler: str = "torch"

    def round_samples(self) -> list[int]:
        """Records sampled in each round, summed over clients and steps."""
        return [sum(int(s.rows.numel()) for c in rnd for s in c.steps) for rnd in self.rounds]

    def evaluates_after(self, round_idx: int) -> bool:
        """Whether raydpfl's server scores the global model after 0-based `round_idx`."""
        return round_idx + 1 == len(self.rounds) or (round_idx + 1) % self.eval_every == 0


def worker_split(
    client_rows: Sequence[int], sampling_rate: float, local_steps: int, groups: int, workers: int
) -> tuple[tuple[int, ...], ...]:
    """Which of a round's clients each of `workers` Ray workers trains.

    raydpfl's server splits a round's tasks into `groups` aggregation groups by greedy
    LPT on estimated work (τ × max(q·|D_i|, 1) samples), and the Ray backend deals the
    groups to its workers by LPT on their summed work (`raydpfl.simulation.reduction`).
    The multi-process floors replay that split, so each floor process trains the very
    clients the matching Ray worker trains.
    """
    work = [max(local_steps, 1) * max(sampling_rate * n, 1.0) for n in client_rows]
    group_bins = lpt_bins(work, groups)
    group_work = [sum(work[i] for i in g) for g in group_bins]
    out = []
    for worker_groups in lpt_bins(group_work, workers):
        out.append(tuple(sorted(i for g in worker_groups for i in group_bins[g])))
    return tuple(out)


def record_batches(exp: Experiment, rounds: int, workers: int = 1) -> BatchPlan:
    """Replays raydpfl's cohort and per-client RNG streams for `rounds` rounds (untimed).

    The replay follows DP-FedAvg's draw order on a client's "train" stream: per step,
    ``torch.rand(|D_i|) < q`` for the Poisson mask, then per parameter tensor in
    ``named_parameters()`` order the noise: one ``torch.randn`` of the tensor's shape, or
    with ``privacy.noise_sampler`` ziggurat or boxmuller one seed draw
    (`counter_noise.draw_seed`).
    Skipping any draw would shift every later batch, so the batch check in
    `workloads.py` guards this order.
    """
    algo = exp.algorithm
    if not isinstance(algo, DPFedAvg):
        raise ValueError(f"W1 is DP-FedAvg; the config names {algo.name!r}")
    if exp.device != "cpu":
        raise ValueError(f"the floors run on the CPU; the experiment resolved to {exp.device!r}")
    seed = exp.config.runtime.seed
    groups = exp.config.runtime.aggregation_groups
    sampler = exp.config.experiment.privacy.noise_sampler
    shapes = [p.shape for p in exp.init_params.values()]  # named_parameters() order
    ds = exp.dataset
    client_rows = [torch.as_tensor(idx) for idx in ds.client_train]
    plan_rounds, splits = [], []
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
                    if sampler != "torch":
                        counter_noise.draw_seed(gen)
                    else:
                        torch.randn(shape, generator=gen)
                steps.append(Step(rows[positions.nonzero().flatten()], state))
            clients.append(ClientRun(c, int(rows.numel()), tuple(steps)))
        plan_rounds.append(tuple(clients))
        sizes = [c.num_examples for c in clients]
        splits.append(worker_split(sizes, algo.sampling_rate, algo.local_steps, groups, workers))
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
        splits=tuple(splits),
        eval_every=exp.config.experiment.algorithm.eval_every,
        lr=algo.lr,
        sampling_rate=algo.sampling_rate,
        clip_norm=algo.clip_norm,
        noise_multiplier=algo.noise_multiplier,
        noise_sampler=sampler,
    )


@dataclass
class FloorResult:
    """Per-round wall seconds, the final central test accuracy and global model."""

    round_seconds: list[float]
    test_accuracy: float
    final_params: Params


# A client trainer: (global params, the client's recorded work) -> its local params.
ClientTrainer = Callable[[Params, ClientRun], Params]

# A partial trainer: (global params, some clients' work) -> (Σ |D_i|·local_i, Σ |D_i|).
PartialTrainer = Callable[[Params, Sequence[ClientRun]], tuple[Params, int]]

# Builds a partial trainer inside the process that runs it (model, optimiser, vmaps).
TrainerFactory = Callable[["BatchPlan"], PartialTrainer]

# Called after each round with (0-based round, wall seconds): progress output.
OnRound = Callable[[int, float], None]


def _sequential(train_client: ClientTrainer) -> PartialTrainer:
    """Trains the clients one after another, accumulating the |D_i|-weighted sum."""

    def partial(global_params: Params, clients: Sequence[ClientRun]) -> tuple[Params, int]:
        total = {n: torch.zeros_like(t) for n, t in global_params.items()}
        weight = 0
        for client in clients:
            local = train_client(global_params, client)
            for n, t in local.items():
                total[n].add_(t, alpha=client.num_examples)
            weight += client.num_examples
        return total, weight

    return partial


def _run_rounds(
    plan: BatchPlan, factory: TrainerFactory, processes: int, on_round: OnRound | None
) -> FloorResult:
    """FedAvg over the plan's rounds: the |D_i|-weighted mean of the local models.

    That mean equals raydpfl's global + weighted mean of updates. Each round is timed
    from cohort start to the end of its evaluation, like raydpfl's ``wall_seconds``.
    With `processes` > 1 the clients are trained in that many forked one-thread worker
    processes, each on the clients the Ray pool's matching worker trains (`plan.splits`):
    per round this process sends the global parameters to every worker (pickled numpy
    arrays over a pipe, as Ray ships the round's parameters to its workers), receives
    one partial sum from each, and adds them in worker order.
    """
    model = plan.build_model()
    if processes == 1:
        return _rounds_in_process(plan, model, factory(plan), on_round)
    if any(len(split) > processes for split in plan.splits):
        raise ValueError(f"the plan splits clients over more than {processes} processes")
    return _rounds_in_workers(plan, model, factory, processes, on_round)


# One round's weighted sum: (0-based round, global params) -> (Σ |D_i|·local_i, Σ |D_i|).
RoundSum = Callable[[int, Params], tuple[Params, int]]


def _fedavg_rounds(
    plan: BatchPlan, model: nn.Module, round_sum: RoundSum, on_round: OnRound | None
) -> FloorResult:
    """The timed round loop both layouts share: sum, divide, evaluate when raydpfl does."""
    global_params = {n: t.clone() for n, t in plan.init_params.items()}
    seconds, accuracy = [], float("nan")
    for r in range(len(plan.rounds)):
        t0 = time.perf_counter()
        total, weight = round_sum(r, global_params)
        global_params = {n: t.div_(weight) for n, t in total.items()}
        if plan.evaluates_after(r):
            accuracy = _accuracy(model, global_params, plan.x_test, plan.y_test)
        seconds.append(time.perf_counter() - t0)
        if on_round is not None:
            on_round(r, seconds[-1])
    return FloorResult(seconds, accuracy, global_params)


def _rounds_in_process(
    plan: BatchPlan, model: nn.Module, partial: PartialTrainer, on_round: OnRound | None
) -> FloorResult:
    return _fedavg_rounds(plan, model, lambda r, g: partial(g, plan.rounds[r]), on_round)


def _worker_main(plan: BatchPlan, factory: TrainerFactory, index: int, conn: Connection) -> None:
    """A floor worker process: one torch thread, trains its share of every round."""
    torch.set_num_threads(1)
    partial = factory(plan)
    while (msg := conn.recv()) is not None:
        round_idx, arrays = msg
        params = {n: torch.from_numpy(a) for n, a in arrays.items()}
        split = plan.splits[round_idx]
        clients = plan.rounds[round_idx]
        mine = [clients[i] for i in split[index]] if index < len(split) else []
        if mine:
            total, weight = partial(params, mine)
        else:
            total, weight = {n: torch.zeros_like(t) for n, t in params.items()}, 0
        conn.send(({n: t.numpy() for n, t in total.items()}, weight))
    conn.close()


def _rounds_in_workers(
    plan: BatchPlan,
    model: nn.Module,
    factory: TrainerFactory,
    processes: int,
    on_round: OnRound | None,
) -> FloorResult:
    # fork: the workers share the parent's data pages (copy-on-write), as Ray's workers
    # map one copy of the dataset. The parent has run torch with one thread only
    # (workloads.py sets it before the pre-pass), so no OpenMP pool is forked.
    ctx = mp.get_context("fork")
    conns, procs = [], []
    for k in range(processes):
        parent_end, child_end = ctx.Pipe()
        proc = ctx.Process(target=_worker_main, args=(plan, factory, k, child_end), daemon=True)
        proc.start()
        child_end.close()
        conns.append(parent_end)
        procs.append(proc)
    # The server side evaluates with the cores, idle while it does (Ray's server actor).
    torch.set_num_threads(processes)

    def round_sum(r: int, global_params: Params) -> tuple[Params, int]:
        arrays = {n: t.numpy() for n, t in global_params.items()}
        for conn in conns:
            conn.send((r, arrays))
        total = {n: torch.zeros_like(t) for n, t in global_params.items()}
        weight = 0
        for conn in conns:  # worker order: a fixed summation order
            part, w = conn.recv()
            for n, a in part.items():
                total[n].add_(torch.from_numpy(a))
            weight += w
        return total, weight

    try:
        result = _fedavg_rounds(plan, model, round_sum, on_round)
    finally:
        for conn in conns:
            with contextlib.suppress(BrokenPipeError, OSError):
                conn.send(None)
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
    if any(proc.exitcode not in (0, None) for proc in procs):
        raise RuntimeError(f"a floor worker failed: exit codes {[p.exitcode for p in procs]}")
    return result


@torch.no_grad()
def _accuracy(
    model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor, batch: int = 2048
) -> float:
    correct = 0
    for i in range(0, x.shape[0], batch):
        logits = functional_call(model, params, (x[i : i + batch],))
        correct += int((logits.argmax(1) == y[i : i + batch]).sum())
    return correct / x.shape[0]


def _nonprivate_trainer(plan: BatchPlan) -> PartialTrainer:
    """Plain SGD on the recorded batches, one client after another.

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
        # Views of the model's tensors: `_sequential` consumes them before the next client.
        return {n: p.detach() for n, p in params.items()}

    return _sequential(train_client)


def run_nonprivate(
    plan: BatchPlan, on_round: OnRound | None = None, processes: int = 1
) -> FloorResult:
    """The non-private floor, in one process or in `processes` one-thread workers."""
    return _run_rounds(plan, _nonprivate_trainer, processes, on_round)


#: Clients trained together by the vectorised floor: bounds the stacked parameters and
#: padded batches (W3: 256 clients × ~6 records of 28×28, 256 × 4,266 parameters).
VECTOR_CHUNK = 256


def _vectorised_trainer(plan: BatchPlan) -> PartialTrainer:
    """Non-private SGD for a chunk of clients at once (the floor of client-vectorised
    DP-SGD): per step, one padded batch [k, m, ...] with a mask, and the k clients'
    gradients of Σ_j mask·CE / (q·|D_i|) by `vmap` over clients of `grad`. At the first
    step every client holds the global parameters, so they are not copied (in_dims None);
    later steps vmap over stacked per-client parameters. Padded slots repeat record 0
    with mask 0 and add nothing; a client whose batch is empty keeps its parameters.
    """
    model = plan.build_model()
    model.requires_grad_(False)  # parameters are passed in functionally

    def client_loss(
        params: Params,
        x: torch.Tensor,
        y: torch.Tensor,
        mask: torch.Tensor,
        expected: torch.Tensor,
    ) -> torch.Tensor:
        logits = functional_call(model, params, (x,))
        return (F.cross_entropy(logits, y, reduction="none") * mask).sum() / expected

    shared = vmap(grad(client_loss), in_dims=(None, 0, 0, 0, 0))
    stacked = vmap(grad(client_loss), in_dims=(0, 0, 0, 0, 0))
    steps = len(plan.rounds[0][0].steps) if plan.rounds and plan.rounds[0] else 0

    def partial(global_params: Params, clients: Sequence[ClientRun]) -> tuple[Params, int]:
        total = {n: torch.zeros_like(t) for n, t in global_params.items()}
        weight = 0
        for start in range(0, len(clients), VECTOR_CHUNK):
            chunk = clients[start : start + VECTOR_CHUNK]
            k = len(chunk)
            sizes = torch.tensor([c.num_examples for c in chunk], dtype=torch.float32)
            expected = plan.sampling_rate * sizes
            local: Params | None = None
            for s in range(steps):
                rows = [c.steps[s].rows for c in chunk]
                m = max(1, max(int(r.numel()) for r in rows))
                index = torch.zeros(k, m, dtype=torch.long)
                mask = torch.zeros(k, m)
                for i, r in enumerate(rows):
                    index[i, : r.numel()] = r
                    mask[i, : r.numel()] = 1.0
                x, y = plan.x[index], plan.y[index]
                if local is None:
                    g = shared(global_params, x, y, mask, expected)
                    local = {n: global_params[n] - plan.lr * g[n] for n in global_params}
                else:
                    g = stacked(local, x, y, mask, expected)
                    local = {n: p.sub_(g[n], alpha=plan.lr) for n, p in local.items()}
            for n, t in total.items():
                if local is None:  # no local steps: every client returns the global model
                    t.add_(global_params[n], alpha=float(sizes.sum()))
                else:
                    t.add_(torch.tensordot(sizes, local[n], dims=1))
            weight += int(sizes.sum())
        return total, weight

    return partial


def run_vectorised_nonprivate(
    plan: BatchPlan, on_round: OnRound | None = None, processes: int = 1
) -> FloorResult:
    """The client-vectorised non-private floor, in one process or `processes` workers."""
    return _run_rounds(plan, _vectorised_trainer, processes, on_round)


def _per_sample_trainer(plan: BatchPlan) -> PartialTrainer:
    """DP-SGD with materialised per-sample gradients.

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
    gen = seeded_stream(plan.noise_sampler, 0)  # its state is restored at every step

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
                if plan.noise_sampler != "torch":  # its stream: std applied by the sampler
                    s = summed[n].add_(counter_noise.normal(p.shape, noise_std, gen, p.dtype))
                else:
                    s = summed[n].add_(torch.randn(p.shape, generator=gen), alpha=noise_std)
                p.sub_(s, alpha=step_size)
        return params

    return _sequential(train_client)


def run_per_sample(
    plan: BatchPlan, on_round: OnRound | None = None, processes: int = 1
) -> FloorResult:
    """The per-sample floor, in one process or in `processes` one-thread workers."""
    return _run_rounds(plan, _per_sample_trainer, processes, on_round)
