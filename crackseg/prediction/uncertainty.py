"""How unsure a model is of one image, from its probabilities: predictions.csv's columns, labels rank's order, the
score Label Studio sorts its tasks by."""

from __future__ import annotations

import numpy as np


def uncertainty(prob: np.ndarray, threshold: float) -> dict:
    """How unsure the model is of one image, from its probabilities (H, W) in [0, 1] (predictions.csv, rank.csv).

    A pixel is unsure when its probability is nearer the decision threshold ``t`` than the sure
    answer on its side (0 for background, 1 for crack): in [t/2, (1+t)/2). ``uncertainty`` is the
    share of the image's pixels that are unsure; ``unsure_crack_share`` the share of the crack
    pixels (probability >= t) that are.
    """
    unsure = (prob >= threshold / 2) & (prob < (1 + threshold) / 2)
    crack = prob >= threshold
    cracks = int(crack.sum())
    return {"uncertainty": round(float(unsure.mean()), 6) if unsure.size else 0.0,
            "unsure_crack_share": round(int((crack & unsure).sum()) / cracks, 6) if cracks else 0.0}
