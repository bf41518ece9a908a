"""Plug-ins written against the public API by a researcher cutting corners (not a test module).

Each class is what someone might write to get a smaller ε, a cleaner record or a faster run
than the one they paid for: a subclass of a built-in of 5-15 lines, using only public names
(classes, methods, arguments, returned values). `tests/privacy/adversarial/test_*.py` runs
each one and checks that it is refused in one line or has no effect (the honest model and
ε), and that whatever it did release outside a mechanism is listed by the platform.

The kinds, as issue 49 lists them:
1. a mechanism whose class (or instance) states its own cost;
2. declarations the server would trust: count 0, a task kind other than ``train`` with no
   mechanism, a q that is not the one trained at;
3. live mechanisms fed any batch or any clipping engine, raw records;
4. a receipt produced without the release: another session, another context, the stream;
5. a weight rule that turns its own sensitivity check off;
6. client level: an unclipped upload, a share added to something else, a heavier weight or
   a scaled clip bit; a server half that steps with the un-noised sum, reads the exact
   count, learns the noise through a release of its own, or sees every clipped upload;
7. raw statistics in metrics or in extra result fields;
8. refusals: one line, exit 2, naming the registered algorithm, client and round.
"""

from __future__ import annotations

import dataclasses

import torch

from raydpfl.algorithms import ClientResult, DPFedAvg
from raydpfl.algorithms.base import ClientContext, WeightedUpdateSum, privacy_session
from raydpfl.algorithms.dp_fedavg_client import DPFedAvgClientLevel
from raydpfl.algorithms.dp_ftrl_client import DPFTRLClientLevel
from raydpfl.algorithms.fedavg import FedAvg
from raydpfl.algorithms.local_dp_sgd import dp_sgd_local_loop, dp_sgd_local_update
from raydpfl.papers.ali_dpfl.pe_dpfl import PeDpfl
from raydpfl.privacy.accounting.ledger import PrivacyCost
from raydpfl.privacy.mechanisms.kernel import (
    UNBOUNDED_WEIGHT_RULES,
    GaussianRelease,
    PrivacySession,
    SampledBatch,
    SubsampledGaussian,
    uses,
)


# ---- 1. the mechanism states its own cost ---------------------------------------------------
class InstanceCost(DPFedAvg):
    """Plants a cost method on each declared mechanism's instance that claims σ = 100."""

    def plan(self, round_idx, cohort, train_sizes):
        tasks = super().plan(round_idx, cohort, train_sizes)
        for t in tasks:
            m = t.mechanisms[0].mechanism
            object.__setattr__(m, "cost", lambda n, q=m.sampling_rate: PrivacyCost(100.0, q, n))
        return tasks


@dataclasses.dataclass(frozen=True)
class LookAlikeGaussian:
    """A look-alike of the kernel's SubsampledGaussian, with a generous cost."""

    noise_multiplier: float
    clip_norm: float
    sampling_rate: float
    population_level = False

    def cost(self, n):
        return PrivacyCost(100.0 * self.noise_multiplier, self.sampling_rate, n)


class LookAlike(DPFedAvg):
    """Declares its DP-SGD steps with the look-alike mechanism."""

    def plan(self, round_idx, cohort, train_sizes):
        fake = LookAlikeGaussian(self.noise_multiplier, self.clip_norm, self.sampling_rate)
        return [
            dataclasses.replace(t, mechanisms=(uses(fake, t.local_steps),))  # type: ignore[arg-type]
            for t in super().plan(round_idx, cohort, train_sizes)
        ]


# ---- 2. declarations ------------------------------------------------------------------------
class CountZero(DPFedAvg):
    """Declares its DP-SGD mechanism with count 0, so it is charged nothing."""

    def plan(self, round_idx, cohort, train_sizes):
        return [
            dataclasses.replace(t, mechanisms=(uses(t.mechanisms[0].mechanism, 0),))
            for t in super().plan(round_idx, cohort, train_sizes)
        ]


class WarmupKind(DPFedAvg):
    """Calls its training tasks ``warmup`` and declares nothing: plain SGD on the records."""

    def plan(self, round_idx, cohort, train_sizes):
        return [
            dataclasses.replace(t, kind="warmup", mechanisms=(), batch_size=32)
            for t in super().plan(round_idx, cohort, train_sizes)
        ]

    def local_update(self, ctx, params, data, task):
        return FedAvg.local_update(self, ctx, params, data, task)  # type: ignore[arg-type]


class TinyDeclaredQ(DPFedAvg):
    """Declares q = 1e-6 (a tiny ε) while its config says 0.1, hoping to train at 0.1."""

    def plan(self, round_idx, cohort, train_sizes):
        tiny = SubsampledGaussian(self.noise_multiplier, self.clip_norm, 1e-6)
        return [
            dataclasses.replace(t, mechanisms=(uses(tiny, t.local_steps),))
            for t in super().plan(round_idx, cohort, train_sizes)
        ]


# ---- 3. live mechanisms fed anything ----------------------------------------------------------
class FullBatchForged(DPFedAvg):
    """Samples through the mechanism, then hands the step a batch of every record."""

    def local_update(self, ctx, params, data, task):
        dp = privacy_session(ctx, task, data).dp_sgd()
        for _ in range(task.local_steps):
            dp.sample()
            every = SampledBatch(dp, torch.arange(data.num_examples))
            dp.step_(params, every, lr=task.lr, divisor=1.0)
        raise AssertionError("unreachable: the step takes only the batch it drew")


class NoClipEngine:
    """A clipping engine that does not clip (every weight 1)."""

    def __init__(self, engine):
        self.engine = engine

    def clipped_sum(self, params, x, y, weight_rule, **kw):
        return self.engine.clipped_sum(params, x, y, lambda n, *_: torch.ones_like(n), **kw)


class OwnEngine(DPFedAvg):
    """Gives the shared loop a context whose clipping engine does not clip."""

    def local_update(self, ctx, params, data, task):
        ctx = dataclasses.replace(ctx, clipping=NoClipEngine(ctx.clipping))
        return dp_sgd_local_update(ctx, params, data, task)


class MeanInTheUpdate(DPFedAvg):
    """Trains honestly, then adds 1e-3 × the mean of its raw records to the bias."""

    def local_update(self, ctx, params, data, task):
        result = super().local_update(ctx, params, data, task)
        x, _ = data.records()
        result.update["linear.bias"] += 1e-3 * x.mean()
        return result


# ---- 4. a receipt without the release -------------------------------------------------------
class OwnSessionOnly(DPFedAvg):
    """Builds a PrivacySession of its own with σ = 0.01 and trains through it."""

    def local_update(self, ctx, params, data, task):
        weak = SubsampledGaussian(0.01, self.clip_norm, self.sampling_rate)
        session = PrivacySession((uses(weak, task.local_steps),), ctx.generator, ctx.device)
        dp = session.dp_sgd()
        for _ in range(task.local_steps):
            dp.step_(params, dp.sample(), lr=task.lr, divisor=1.0)
        raise AssertionError("unreachable: a session no worker bound has no records")


class NoSessionContext(DPFedAvg):
    """Calls the shared loop with a context stripped of its session, hoping for a fresh one."""

    def local_update(self, ctx, params, data, task):
        bare = ClientContext(ctx.model, ctx.clipping, torch.Generator().manual_seed(0), ctx.device)
        return dp_sgd_local_update(bare, params, data, task)


class RebindsTheRecords(DPFedAvg):
    """Binds a direct context of its own (a stream it knows) to the worker's records."""

    def local_update(self, ctx, params, data, task):
        from raydpfl.algorithms.base import direct_context

        known = torch.Generator().manual_seed(0)
        mine = direct_context(ctx.model, data, task, known, engine=ctx.clipping)
        return dp_sgd_local_update(mine, params, data, task)


class NoiseCanceller(DPFedAvg):
    """Replays the context's stream to predict each step's noise and subtracts it."""

    def local_update(self, ctx, params, data, task):
        replay = torch.Generator().set_state(ctx.generator.get_state())
        start, _ = dp_sgd_local_loop(ctx, params, data, task)
        std = (
            task.lr
            * task.noise_multiplier
            * task.clip_norm
            / (task.sampling_rate * data.num_examples)
        )
        with torch.no_grad():
            for _ in range(task.local_steps):
                torch.rand(data.num_examples, generator=replay)  # the Poisson draw
                for p in params.values():
                    p.add_(torch.randn(p.shape, generator=replay), alpha=std)
        return ClientResult(
            task.client_id,
            {n: params[n] - start[n] for n in params},
            float(data.num_examples),
            data.num_examples,
        )


# ---- 5. a weight rule that opts out of its check ------------------------------------------
class LooseRule:
    """Weights of 100: each sample contributes up to 100·‖g‖, far above C."""

    unbounded_by_design = True  # the old opt-out, on the rule

    def __call__(self, norms):
        return torch.full_like(norms, 100.0)


class UnboundedRule(DPFedAvg):
    """Trains through the shared loop with `LooseRule`."""

    def local_update(self, ctx, params, data, task):
        start, _ = dp_sgd_local_loop(ctx, params, data, task, weight_rule=LooseRule())
        n = data.num_examples
        return ClientResult(task.client_id, {k: params[k] - start[k] for k in params}, float(n), n)


class LateRunLevelOptOut(UnboundedRule):
    """Sets the run-level opt-out on itself inside the client half, then uses `LooseRule`."""

    def local_update(self, ctx, params, data, task):
        setattr(self, UNBOUNDED_WEIGHT_RULES, True)
        return super().local_update(ctx, params, data, task)


class DeclaredRunLevelOptOut(UnboundedRule):
    """Sets the run-level opt-out when it is built, as FedFDP's paper mode does."""

    def __init__(self, **kw):
        super().__init__(**kw)
        setattr(self, UNBOUNDED_WEIGHT_RULES, True)


# ---- 6. client level ------------------------------------------------------------------------
class UnclippedUpload(DPFedAvgClientLevel):
    """Uploads its update without clipping it to S."""

    def upload(self, ctx, task, update):
        return dict(update), 0.0, self.clip_norm


class ShareOnADummy(DPFedAvgClientLevel):
    """With distributed noise: adds its share to zeros and uploads its clipped update bare."""

    def upload(self, ctx, task, update):
        from raydpfl.algorithms.dp_fedavg_client import ClientLevelAlgorithm
        from raydpfl.privacy.mechanisms.client_level_mechanisms import GaussianShare

        out, norm, clip = ClientLevelAlgorithm.upload(self, ctx, task, update)
        ctx.privacy.get(GaussianShare).add({n: torch.zeros_like(t) for n, t in out.items()})
        return out, norm, clip


class NoiseOnADummy(DPFedAvgClientLevel):
    """Server half: draws the round's charged noise on zeros and applies the bare sum."""

    def aggregate_sum(self, global_params, tasks, total):
        from raydpfl.algorithms.dp_fedavg_client import dp_fedavg_update
        from raydpfl.privacy.mechanisms.client_level_mechanisms import round_session

        live = round_session(self, self._round, self.round_mechanisms, self.seed).get()
        live.release({n: torch.zeros_like(t) for n, t in global_params.items()})
        bare = {n: total.total[n] for n in global_params}
        return dp_fedavg_update(global_params, bare, self.expected_cohort)


class WeightedByData(DPFedAvgClientLevel):
    """Client half: weights its clipped upload by its number of records, like FedAvg."""

    def local_update(self, ctx, params, data, task):
        result = super().local_update(ctx, params, data, task)
        return dataclasses.replace(result, weight=float(data.num_examples))


class LouderClipBit(DPFedAvgClientLevel):
    """Adaptive clipping: reports its unclipped bit x 10, to lift the count above its noise."""

    def local_update(self, ctx, params, data, task):
        result = super().local_update(ctx, params, data, task)
        result.metrics["update_within_clip"] *= 10.0
        return result


class CleanSumStep(DPFedAvgClientLevel):
    """Server half (the old hook): releases the round's real sum through the round's
    session, so the receipt closes, then steps with the clean sum."""

    def aggregate_sum(self, global_params, tasks, total):
        from raydpfl.algorithms.dp_fedavg_client import dp_fedavg_update
        from raydpfl.privacy.mechanisms.client_level_mechanisms import round_session

        clean = {n: total.total[n] for n in global_params}
        round_session(self, self._round, self.round_mechanisms, self.seed).get().release(clean)
        return dp_fedavg_update(global_params, clean, self.expected_cohort)


class ExactClipCount(DPFedAvgClientLevel):
    """Adaptive clipping whose server half moves S by the exact unclipped fraction (the
    noisy count makes S jumpy), and takes the noisy release for the model."""

    def aggregate_sum(self, global_params, tasks, total):
        from raydpfl.algorithms.dp_fedavg_client import geometric_clip_update

        exact = total.metric_sums["update_within_clip"] / max(total.count, 1)
        new = super().aggregate_sum(global_params, tasks, total)
        self.current_clip_norm = geometric_clip_update(
            self._round_clip["update_clip_norm"], exact, self.target_quantile, self.clip_lr
        )
        return new


class NoiseFromAnEmptyRound(DPFedAvgClientLevel):
    """Server half (the new hook): releases an empty round through the direct-call path to
    learn the round's noise, and subtracts it from the platform's release."""

    def aggregate_release(self, global_params, tasks, released):
        noise = self.aggregate_sum(global_params, tasks, WeightedUpdateSum())
        clean = {n: released.noisy_sum[n] - (noise[n] - global_params[n]) for n in noise}
        return super().aggregate_release(
            global_params, tasks, dataclasses.replace(released, noisy_sum=clean)
        )


class FtrlCleanPrefix(DPFTRLClientLevel):
    """DP-FTRL (the old hook) that keeps the clean prefix itself and adds only the newest
    node's noise, not the whole prefix's."""

    def aggregate_sum(self, global_params, tasks, total):
        from raydpfl.privacy.mechanisms.client_level_mechanisms import round_session

        if self._position(self._round)[1] == 1:
            self.start = {n: p.clone() for n, p in global_params.items()}
            self.prefix = {n: torch.zeros_like(p) for n, p in global_params.items()}
        for n in self.prefix:
            self.prefix[n] += total.total[n]
        live = round_session(self, self._round, self.round_mechanisms, self.seed).get()
        z = live.node_noise(self.prefix)
        scale = self.server_lr / self.cohort_size
        return {n: self.start[n] + scale * (self.prefix[n] + z[n]) for n in self.start}


class FtrlMedianOfUpdates(DPFTRLClientLevel):
    """DP-FTRL made robust: a coordinate-wise median of the round's clipped uploads."""

    linear_aggregation = False

    def aggregate(self, global_params, tasks, results):
        stacked = {n: torch.stack([r.update[n] for r in results]) for n in global_params}
        return {n: p + stacked[n].median(dim=0).values for n, p in global_params.items()}


class VectorisedUnclipped(DPFedAvgClientLevel):
    """Trains its cohort vectorised and returns the group's unclipped sum."""

    def supports_group(self, tasks):
        return True

    def local_update_group_sum(self, ctxs, params, datas, tasks):
        from raydpfl.algorithms.fedavg import FedAvg as Plain

        total = WeightedUpdateSum()
        for ctx, data, task in zip(ctxs, datas, tasks, strict=True):
            start = {n: p.detach().clone() for n, p in params.items()}
            trained = Plain.local_update(self, ctx, params, data, task)
            total.add({n: 10.0 * t for n, t in trained.update.items()}, 1.0)
            for n, p in params.items():
                p.data.copy_(start[n])
        return total


# ---- 7. raw statistics reach the outputs -----------------------------------------------------
class RawMeanMetric(DPFedAvg):
    """Reports the mean of its raw labels as a metric."""

    def local_update(self, ctx, params, data, task):
        result = super().local_update(ctx, params, data, task)
        _, y = data.records()
        result.metrics["label_mean"] = float(y.float().mean())
        return result


@dataclasses.dataclass
class ResultWithRecords(ClientResult):
    """A result that carries a few raw records beside the update."""

    sample: torch.Tensor | None = None


class ExtraField(DPFedAvg):
    """Returns three of its records in an extra field of its result type."""

    linear_aggregation = False

    def local_update(self, ctx, params, data, task):
        r = super().local_update(ctx, params, data, task)
        x, _ = data.batch(torch.arange(3))
        return ResultWithRecords(
            r.client_id, r.update, r.weight, r.num_examples, r.metrics, sample=x
        )


# ---- 3b. un-subsampled releases (output perturbation, full-batch steps, selection) ------------
class PerturbsADummy(PeDpfl):
    """PE-DPFL that runs the output perturbation on a zero tensor (the receipt closes) and
    uploads its clean, unclipped local update."""

    def local_update(self, ctx, params, data, task):
        release = privacy_session(ctx, task, data).get(GaussianRelease)
        start = {n: p.clone() for n, p in params.items()}
        release.perturb_update({n: torch.zeros_like(p) for n, p in params.items()})
        x, y = data.records()
        leaves = {n: p.detach().requires_grad_(True) for n, p in start.items()}
        with torch.enable_grad():
            loss = torch.nn.functional.cross_entropy(
                torch.func.functional_call(ctx.model, leaves, (x,)), y
            )
            grads = torch.autograd.grad(loss, list(leaves.values()))
        update = {n: -task.lr * g for n, g in zip(start, grads, strict=True)}
        return ClientResult(task.client_id, update, float(data.num_examples), data.num_examples)


class WideClipFullBatch(DPFedAvg):
    """Declares a full-batch Gaussian release for C = 1 and then runs it at C = 100 (a
    step 100 times larger than the noise covers)."""

    def plan(self, round_idx, cohort, train_sizes):
        tasks = super().plan(round_idx, cohort, train_sizes)
        return [
            dataclasses.replace(
                t,
                mechanisms=(
                    uses(
                        GaussianRelease(
                            self.noise_multiplier,
                            2.0 * self.clip_norm / float(train_sizes[t.client_id]),
                        ),
                        1,
                    ),
                ),
            )
            for t in tasks
        ]

    def local_update(self, ctx, params, data, task):
        release = privacy_session(ctx, task, data).get(GaussianRelease)

        def loss(p, const, x, y):
            return torch.nn.functional.cross_entropy(
                torch.func.functional_call(ctx.model, {**p, **const}, (x,)), y
            )

        out = release.mean_clipped_gradient(params, loss, clip_norm=100.0 * self.clip_norm)
        update = {n: -task.lr * g for n, g in out.update.items()}
        return ClientResult(task.client_id, update, 1.0, data.num_examples)


class WeightChannel(DPFedAvg):
    """Puts a raw statistic (the mean of its labels) in its aggregation weight."""

    def local_update(self, ctx, params, data, task):
        result = super().local_update(ctx, params, data, task)
        _, y = data.records()
        result.weight = 1.0 + float(y.float().mean())
        return result


class CountChannel(DPFedAvg):
    """Reports a record count of its own (the number of label-0 records)."""

    def local_update(self, ctx, params, data, task):
        result = super().local_update(ctx, params, data, task)
        _, y = data.records()
        result.num_examples = int((y == 0).sum())
        return result


#: Client-level cheats use the config's client-level options; the rest are record-level.
CLIENT_LEVEL = {
    UnclippedUpload,
    ShareOnADummy,
    NoiseOnADummy,
    WeightedByData,
    LouderClipBit,
    CleanSumStep,
    ExactClipCount,
    NoiseFromAnEmptyRound,
    FtrlCleanPrefix,
    FtrlMedianOfUpdates,
    VectorisedUnclipped,
}
