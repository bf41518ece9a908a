"""Model evaluation: loss and accuracy of given parameters on held-out records."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

Params = dict[str, torch.Tensor]


@dataclass(frozen=True)
class EvalResult:
    """Summed loss, correct count and number of examples (sums merge across shards)."""

    loss_sum: float
    correct: int
    num_examples: int

    @property
    def loss(self) -> float:
        """Mean cross-entropy; NaN when there are no examples."""
        return self.loss_sum / self.num_examples if self.num_examples else float("nan")

    @property
    def accuracy(self) -> float:
        """Fraction correct; NaN when there are no examples."""
        return self.correct / self.num_examples if self.num_examples else float("nan")


@torch.no_grad()
def evaluate(
    model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor, batch_size: int = 2048
) -> EvalResult:
    """Evaluates `model` with `params` (functionally) on (x, y) in batches."""
    loss_sum, correct = 0.0, 0
    for start in range(0, x.shape[0], batch_size):
        xb, yb = x[start : start + batch_size], y[start : start + batch_size]
        logits = functional_call(model, params, (xb,))
        loss_sum += float(F.cross_entropy(logits, yb, reduction="sum"))
        correct += int((logits.argmax(1) == yb).sum())
    return EvalResult(loss_sum=loss_sum, correct=correct, num_examples=int(x.shape[0]))
