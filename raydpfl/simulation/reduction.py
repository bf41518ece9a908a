"""Deterministic grouping of a round's tasks for partial sums and load balancing.

Floating-point addition is not associative, so a sum of client updates computed in
worker-sized pieces would change with the number of workers. Instead, a round's tasks
are split into a *fixed* number of groups that depends only on the plan: each group
is summed in plan order where it is trained, and the server adds the group sums in
group order. Every backend, with any number of workers, therefore produces the same
bits, while only one partial sum per group travels back instead of one update per
client.

Both splits are greedy LPT (longest processing time first): items in decreasing
order of estimated work, each to the currently least-loaded bin, ties broken by
position so the result is a pure function of its inputs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from raydpfl.algorithms.base import ClientTask


def estimated_work(task: ClientTask, num_examples: int) -> float:
    """Samples the task will process: τ × expected batch (Poisson) or minibatch size."""
    if task.sampling_rate is not None:
        per_step = task.sampling_rate * num_examples
    elif task.batch_size is not None:
        per_step = min(task.batch_size, num_examples)
    else:
        per_step = num_examples
    # A follow-up task (no local steps, e.g. statistics) still costs about one pass.
    return max(task.local_steps, 1) * max(per_step, 1.0)


def lpt_bins(work: Sequence[float], num_bins: int) -> list[list[int]]:
    """Greedy LPT: item indices per bin, each bin in ascending index order.

    Empty bins are dropped, so fewer than `num_bins` lists come back when there are
    fewer items than bins.
    """
    if num_bins < 1:
        raise ValueError(f"num_bins must be >= 1, got {num_bins}")
    order = sorted(range(len(work)), key=lambda i: (-work[i], i))
    loads = [0.0] * num_bins
    bins: list[list[int]] = [[] for _ in range(num_bins)]
    for i in order:
        b = min(range(num_bins), key=lambda k: (loads[k], k))
        bins[b].append(i)
        loads[b] += work[i]
    return [sorted(b) for b in bins if b]


def group_tasks(
    tasks: Sequence[ClientTask], train_sizes: np.ndarray, num_groups: int
) -> list[list[ClientTask]]:
    """Splits `tasks` into at most `num_groups` balanced groups, each in plan order."""
    work = [estimated_work(t, int(train_sizes[t.client_id])) for t in tasks]
    return [[tasks[i] for i in idx] for idx in lpt_bins(work, num_groups)]


def group_work(groups: Sequence[Sequence[ClientTask]], train_sizes: np.ndarray) -> list[float]:
    """Estimated work of each group."""
    return [sum(estimated_work(t, int(train_sizes[t.client_id])) for t in g) for g in groups]
