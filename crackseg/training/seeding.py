"""Seeds derived from several numbers, so that each piece of randomness depends on what it belongs to.

A training epoch's RNG depends on (seed, epoch, rank) and a sample's augmentation on
(seed, epoch, index), never on what ran before: a resumed run draws exactly what an
uninterrupted one would.
"""

from __future__ import annotations

import random

import numpy as np
import torch

_PRIME = 1_000_003


def mix_seed(*parts: int) -> int:
    """One non-negative 63-bit seed from ``parts``; different tuples give different seeds in practice."""
    value = 0
    for part in parts:
        value = value * _PRIME + part
    return value % 2**63


def seed_everything(value: int) -> None:
    """Seed torch (CPU and CUDA), numpy's global generator and ``random``."""
    torch.manual_seed(value)
    random.seed(value)
    np.random.seed(value % 2**32)
