"""Training samples from a dataset: augmented (image, mask) pairs, epoch-aware sampling (crack-free
samples mixed in at a stated share), loaders.

The dataset on disk (pairs, checks, splits) is :mod:`crackseg.data.datasets`; this module
turns its samples into tensors for training and validation.
"""

from __future__ import annotations

import math
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch
from torch.utils.data import DistributedSampler, SequentialSampler, Subset
from torchvision import tv_tensors

from crackseg.core.errors import InputError
from crackseg.data.datasets import Sample, decoding_threads
from crackseg.data.images import DECODE_ERRORS, describe_error, load_image, load_mask
from crackseg.training.seeding import mix_seed
from crackseg.training.transforms import train_transform

if TYPE_CHECKING:
    from crackseg.model import distributed
    from crackseg.training.options import TrainConfig
    from crackseg.training.setup import Prepared


class CrackDataset(torch.utils.data.Dataset):
    """(image, mask) pairs as ``tv_tensors``: image (3, H, W) uint8, mask (1, H, W) uint8 in {0, 1}.

    Indexed by ``(epoch, index)`` (see :class:`EpochSampler`) with a ``seed``, each sample's
    augmentation is a pure function of (seed, epoch, index): a resumed run draws exactly
    what an uninterrupted one would, whatever the number of loader workers. A key
    ``(epoch, index, repeat)`` (:class:`NegativeMixSampler`) draws anew for a sample seen again in one epoch.
    A sample without a mask file (a crack-free photo) gets an all-background mask.
    ``cache=True`` decodes everything once up front; loader workers forked afterwards
    share those tensors instead of decoding again every epoch.
    """

    def __init__(
        self,
        samples: list[Sample],
        transform=None,
        seed: int | None = None,
        cache: bool = False,
        workers: int | None = None,
    ):
        self.samples = list(samples)
        self.transform = transform
        self.seed = seed
        self._cache = None
        if cache:
            with ThreadPoolExecutor(workers or decoding_threads()) as pool:
                self._cache = list(pool.map(self._decode, range(len(self.samples))))

    def __len__(self) -> int:
        return len(self.samples)

    def _decode(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        sample = self.samples[index]
        try:
            image = load_image(sample.image)
            return image, load_mask(sample.mask) if sample.mask else torch.zeros((1, *image.shape[1:]), dtype=torch.uint8)
        except DECODE_ERRORS as error:
            raise InputError(f"{sample.image}: {describe_error(error)} (changed since the dataset was checked?)") from None

    def __getitem__(self, key: int | tuple[int, ...]) -> tuple[tv_tensors.Image, tv_tensors.Mask]:
        epoch, index, *repeat = key if isinstance(key, tuple) else (0, key)
        image, mask = self._cache[index] if self._cache is not None else self._decode(index)
        image, mask = tv_tensors.Image(image), tv_tensors.Mask(mask)
        if self.transform is None:
            return image, mask
        if self.seed is None:
            return self.transform(image, mask)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(mix_seed(self.seed, epoch, index, *repeat))
            return self.transform(image, mask)


class EpochSampler(torch.utils.data.Sampler):
    """Wraps a sampler so each index travels with its epoch: yields ``(epoch, index)``."""

    def __init__(self, sampler: torch.utils.data.Sampler):
        self.sampler = sampler
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self):
        return ((self.epoch, index) for index in self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)


def negatives_per_epoch(positives: int, share: float) -> int:
    """k crack-free samples per epoch with k / (positives + k) = ``share``, rounded half up: 10 at 0.25 -> 3."""
    return math.floor(share * positives / (1 - share) + 0.5)


class NegativeMixSampler(torch.utils.data.Sampler):
    """Every positive once per epoch plus k crack-free samples (:func:`negatives_per_epoch`), shuffled together.

    Keys are for a :class:`CrackDataset` over the positives, then the negatives (indices from
    ``positives`` on). The negatives come from an endless stream, the pool in a new seeded order
    per pass, so each is used before any repeats; epoch e (counted from 1) takes the stream's
    positions (e - 1) k .. e k - 1. A negative drawn twice in one epoch (a pool smaller than k)
    gets key ``(epoch, index, repeat)`` and so its own augmentation. Stream and order are functions
    of (seed, epoch): a resumed run draws what an uninterrupted one would. The epoch's list is split
    over processes as ``DistributedSampler(drop_last=True)`` splits a dataset: its last
    len % world_size keys are left out, and every process gets as many.
    """

    _ORDER, _LAP = -1, -2  # seed tags, apart from the (seed, epoch, index >= 0) of augmentation

    def __init__(self, positives: int, negatives: int, share: float, seed: int, world_size: int = 1, rank: int = 0):
        if negatives < 1 or not 0 <= share < 1:
            raise ValueError(f"needs crack-free samples and a share in [0, 1), got {negatives} and {share}")
        self.positives, self.negatives, self.seed = positives, negatives, seed
        self.per_epoch = negatives_per_epoch(positives, share)
        self.epoch = 1
        self._shard = DistributedSampler(range(positives + self.per_epoch), world_size, rank, shuffle=False, drop_last=True)

    def set_epoch(self, epoch: int) -> None:
        if epoch < 1:
            raise ValueError(f"epochs count from 1, got {epoch}")
        self.epoch = epoch

    def epoch_keys(self) -> list[tuple[int, ...]]:
        """The whole epoch's keys in their shuffled order, before they are split over processes."""
        keys = [(self.epoch, index) for index in range(self.positives)]
        seen = Counter()
        for drawn in self._drawn_negatives():
            keys.append((self.epoch, self.positives + drawn, seen[drawn]) if seen[drawn] else (self.epoch, self.positives + drawn))
            seen[drawn] += 1
        order = torch.randperm(len(keys), generator=torch.Generator().manual_seed(mix_seed(self.seed, self.epoch, self._ORDER)))
        return [keys[i] for i in order.tolist()]

    def _drawn_negatives(self) -> list[int]:
        start = (self.epoch - 1) * self.per_epoch
        stop = start + self.per_epoch
        drawn = []
        for lap in range(start // self.negatives, -(-stop // self.negatives)):
            generator = torch.Generator().manual_seed(mix_seed(self.seed, lap, self._LAP))
            order = torch.randperm(self.negatives, generator=generator).tolist()
            offset = lap * self.negatives
            drawn += order[max(start - offset, 0) : min(stop - offset, self.negatives)]
        return drawn

    def __iter__(self):
        keys = self.epoch_keys()
        return iter([keys[position] for position in self._shard])

    def __len__(self) -> int:
        return len(self._shard)


def make_loader(
    dataset: torch.utils.data.Dataset,
    batch_size: int,
    sampler: torch.utils.data.Sampler,
    workers: int = 0,
    pin_memory: bool = False,
    drop_last: bool = False,
    collate_fn=None,
) -> torch.utils.data.DataLoader:
    """A loader with persistent workers and pinned memory where they help.

    Its own generator keeps it from drawing on the global RNG, so starting a loader does
    not shift the random stream of the training step (dropout) after a resume.
    """
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        pin_memory=pin_memory,
        persistent_workers=workers > 0,
        prefetch_factor=4 if workers > 0 else None,
        drop_last=drop_last,
        collate_fn=collate_fn,
        generator=torch.Generator().manual_seed(0),
    )


def run_loaders(config: TrainConfig, env: distributed.Environment, prepared: Prepared):
    """Training loader (shuffled, sharded, last partial batch dropped) and this process's validation shard."""
    by_stem = {sample.stem: sample for sample in prepared.samples}
    split, workers, pin = prepared.split, prepared.resolved.workers, env.device.type == "cuda"
    positives, share = [by_stem[stem] for stem in split["train"]], prepared.resolved.negative_share
    negatives = prepared.negatives if share > 0 else []  # at share 0 the epochs are those of a run without any
    train_set = CrackDataset(positives + negatives, train_transform(config.crop_size), seed=config.seed, cache=config.cache)
    val_set = CrackDataset([by_stem[stem] for stem in split["val"]], cache=config.cache)  # crack images only, as without negatives
    if negatives:
        train_sampler = NegativeMixSampler(len(positives), len(negatives), share, config.seed, env.world_size, env.rank)
    else:
        train_sampler = EpochSampler(
            DistributedSampler(train_set, env.world_size, env.rank, shuffle=True, seed=config.seed, drop_last=True)
        )
    train_loader = make_loader(train_set, config.batch_size, train_sampler, workers, pin, drop_last=True)
    val_shard = Subset(val_set, list(range(env.rank, len(val_set), env.world_size)))  # every image once, no padding
    val_loader = make_loader(val_shard, None, SequentialSampler(val_shard), workers, pin)  # one whole image at a time
    return train_sampler, train_loader, val_loader
