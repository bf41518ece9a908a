"""Model evaluation: loss and accuracy of given parameters on held-out records.

The task follows the targets: integer labels are classification (cross-entropy, accuracy);
floating-point targets are regression (the model has one output; the loss is the squared
error, so `EvalResult.loss` is the test MSE, and `accuracy` is NaN: a regression run never
reports an accuracy). A parameter dict may carry a personalised input transformation
(``input_transform.*`` entries, PRIVATEFL's; `raydpfl.models.input_transform`), which is applied
to the inputs before the model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from raydpfl.algorithms.multi_model import GLOBAL_MODEL, model_params, shared_params
from raydpfl.models.input_transform import apply_input_transform

Params = dict[str, torch.Tensor]


@dataclass(frozen=True)
class EvalResult:
    """Summed loss, correct count and number of examples (sums merge across shards).

    For a regression evaluation (`regression`), `loss_sum` is the summed squared error and
    `correct` is 0 and meaningless.
    """

    loss_sum: float
    correct: int
    num_examples: int
    regression: bool = False

    @property
    def loss(self) -> float:
        """Mean cross-entropy (regression: mean squared error); NaN without examples."""
        return self.loss_sum / self.num_examples if self.num_examples else float("nan")

    @property
    def accuracy(self) -> float:
        """Fraction correct; NaN without examples, and always NaN for regression."""
        if self.regression:
            return float("nan")
        return self.correct / self.num_examples if self.num_examples else float("nan")


def is_regression(y: torch.Tensor) -> bool:
    """Whether targets `y` are real-valued (regression) rather than class labels."""
    return y.is_floating_point()


def evaluation_params(broadcast: Mapping[str, torch.Tensor], model_key: str) -> Params:
    """The parameters that score a client whose model is `model_key` in a broadcast.

    ``global``: the whole (single-model) mapping. Any other key: the key's own
    ``"{model_key}/"`` entries (`model_params`) laid over the unprefixed (shared) entries,
    so a key may hold a whole model (multi-model algorithms, whose names are all
    prefixed: unchanged) or only a client's personal part over a shared model (PRIVATEFL:
    the shared model plus that client's input transformation).
    """
    if model_key == GLOBAL_MODEL:
        return dict(broadcast)
    return {**shared_params(broadcast), **model_params(broadcast, model_key)}


#: Evaluation batch on the CPU: small enough that a CNN's activations stay under the
#: 64 MiB mmap threshold (`raydpfl.backends.allocator`), so their memory is reused batch
#: after batch. At 2,048 FedAvgCNN's first activation alone is 151 MB: every batch
#: mmapped and faulted in afresh, ~800k page faults and 2.8 s for Fashion-MNIST's 10,000
#: test images on one thread, against 1.4 s and no faults at 256 (128-512 alike).
CPU_EVAL_BATCH = 256
#: On an accelerator large batches keep it busy and there is no such cost.
DEVICE_EVAL_BATCH = 2048


def eval_batch_size(device: torch.device | str) -> int:
    """The evaluation batch for tensors on `device`."""
    return CPU_EVAL_BATCH if torch.device(device).type == "cpu" else DEVICE_EVAL_BATCH


def num_batches(num_examples: int, batch_size: int) -> int:
    """How many evaluation batches `num_examples` records make (the last may be short)."""
    return -(-num_examples // batch_size)


@dataclass(frozen=True)
class BatchScores:
    """Per-batch sums of one stretch of evaluation batches: batch k of the stretch has
    loss sum ``loss_sums[k]`` and ``corrects[k]`` right answers. Stretches evaluated on
    different workers merge exactly (`merge_batches`): the batches are the same whoever
    scores them, and their sums are added in batch order."""

    loss_sums: tuple[float, ...]
    corrects: tuple[int, ...]


@torch.no_grad()
def evaluate_batches(
    model: nn.Module,
    params: Params,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int,
    batches: range,
) -> BatchScores:
    """Scores `params` on batches `batches` of (x, y) cut at multiples of `batch_size`."""
    regression = is_regression(y)
    loss_sums: list[float] = []
    corrects: list[int] = []
    for b in batches:
        xb, yb = x[b * batch_size : (b + 1) * batch_size], y[b * batch_size : (b + 1) * batch_size]
        xb, weights = apply_input_transform(xb, params)
        out = functional_call(model, weights, (xb,))
        if regression:
            loss_sums.append(float(F.mse_loss(out.reshape(yb.shape), yb, reduction="sum")))
            corrects.append(0)
        else:
            loss_sums.append(float(F.cross_entropy(out, yb, reduction="sum")))
            corrects.append(int((out.argmax(1) == yb).sum()))
    return BatchScores(tuple(loss_sums), tuple(corrects))


def merge_batches(parts: Sequence[BatchScores], num_examples: int, regression: bool) -> EvalResult:
    """One `EvalResult` from consecutive stretches of batches, summed in batch order (so
    the loss is the same float however the batches were split among workers)."""
    loss_sum, correct = 0.0, 0
    for part in parts:
        for loss, right in zip(part.loss_sums, part.corrects, strict=True):
            loss_sum += loss
            correct += right
    return EvalResult(
        loss_sum=loss_sum, correct=correct, num_examples=num_examples, regression=regression
    )


def evaluate(
    model: nn.Module,
    params: Params,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int | None = None,
) -> EvalResult:
    """Evaluates `model` with `params` (functionally) on (x, y) in batches (default:
    `eval_batch_size` for x's device)."""
    if batch_size is None:
        batch_size = eval_batch_size(x.device)
    n = int(x.shape[0])
    scores = evaluate_batches(model, params, x, y, batch_size, range(num_batches(n, batch_size)))
    return merge_batches([scores], n, is_regression(y))


@dataclass
class CentralTestSet:
    """The held-out test set the global model is scored on each evaluated round.

    The server scores it itself (`evaluate`), or a backend spreads its batches over its
    workers (`raydpfl.simulation.backend.Backend.evaluate_central`), each of which holds
    the same records (the dataset's ``x_test``/``y_test``).
    """

    model: nn.Module
    x: torch.Tensor
    y: torch.Tensor

    @property
    def batch_size(self) -> int:
        """Its evaluation batch (`eval_batch_size` for the set's device)."""
        return eval_batch_size(self.x.device)

    @property
    def num_examples(self) -> int:
        return int(self.x.shape[0])

    @property
    def regression(self) -> bool:
        return is_regression(self.y)

    def evaluate(self, params: Params) -> EvalResult:
        """Loss and accuracy of `params` on the whole set, on the set's device (the
        server's parameters live on the CPU; the set may be resident on a GPU)."""
        on_device = {n: t.to(self.x.device) for n, t in params.items()}
        return evaluate(self.model, on_device, self.x, self.y)
