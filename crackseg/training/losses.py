"""Pixel-weighted BCE (crack pixels weighted by ``pos_weight``), plus a soft Dice term when asked
(training asks by default, ``--loss bce+dice``).

The BCE of a batch is ``sum(w * bce) / sum(w)`` over its pixels, where ``w`` is
``pos_weight`` on crack pixels and 1 elsewhere. The training loop computes the
denominator over the whole global batch (all micro-batches, all processes) before the
backward passes, so gradient accumulation and the process count do not change the BCE:
B images on 2 GPUs give exactly its gradient of 2B images on one. The Dice term is per
process and micro-batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class CrackLoss:
    def __init__(self, pos_weight: float | None, dice: bool = False):
        self.pos_weight = pos_weight
        self.dice = dice

    def pixel_weights(self, masks: torch.Tensor) -> torch.Tensor:
        """(N, 1, H, W) weights: ``pos_weight`` on crack pixels, 1 on background."""
        if self.pos_weight is None:
            return torch.ones_like(masks, dtype=torch.float32)
        return torch.where(masks.bool(), self.pos_weight, 1.0)

    def weight_sum(self, masks: torch.Tensor) -> torch.Tensor:
        return self.pixel_weights(masks).sum(dtype=torch.float64)

    def weighted_bce_sum(self, logits: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        """``sum(w * bce)`` in float32, to be divided by the global weight sum."""
        bce = F.binary_cross_entropy_with_logits(logits.float(), masks.float(), reduction="none")
        return (bce * self.pixel_weights(masks)).sum()

    def dice_loss(self, logits: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        """Soft Dice loss over the (micro-)batch; not decomposable, so it is per process."""
        probs = torch.sigmoid(logits.float())
        target = masks.float()
        overlap = (probs * target).sum()
        return 1.0 - (2.0 * overlap + 1.0) / (probs.sum() + target.sum() + 1.0)
