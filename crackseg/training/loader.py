"""Training samples from a dataset: augmented (image, mask) pairs, epoch-aware sampling (crack-free
samples mixed in at a stated share), loaders.

The dataset on disk (pairs, checks, splits) is :mod:`crackseg.data.datasets`; this module
turns its samples into tensors for training and validation.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch.utils.data import DistributedSampler, SequentialSampler, Subset
from torchvision import tv_tensors

from crackseg.core.workers import quiet_when_parent_stops
from crackseg.data.collection import dataset_of
from crackseg.data.pairing import Sample
from crackseg.training.image_cache import Decoded, decode_sample, decoded_samples
from crackseg.training.seeding import mix_seed
from crackseg.training.transforms import train_transform, window_transform

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
    ``cached``: every sample already decoded (:func:`crackseg.training.image_cache.decoded_samples`, ``--cache``),
    which loader workers forked afterwards share instead of decoding again every epoch.
    """

    def __init__(self, samples: list[Sample], transform=None, seed: int | None = None, cached: list[Decoded] | None = None):
        self.samples = list(samples)
        self.transform = transform
        self.seed = seed
        self._cached = cached

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, key: int | tuple[int, ...]) -> tuple[tv_tensors.Image, tv_tensors.Mask]:
        epoch, index, *repeat = key if isinstance(key, tuple) else (0, key)
        image, mask = self._cached[index] if self._cached is not None else decode_sample(self.samples[index])
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


@dataclass(frozen=True)
class Pool:
    """Samples of one kind in a training epoch: ``size`` of them, ``per_epoch`` drawn each epoch; ``whole``: every one
    once, in order (then ``per_epoch`` is ``size``), else drawn from an endless stream of the pool."""

    size: int
    per_epoch: int
    whole: bool = False


class MixSampler(torch.utils.data.Sampler):
    """Each epoch, ``per_epoch`` samples of every pool (:class:`Pool`), shuffled together: the datasets of a run, each an
    equal share of the epoch by default, and its crack-free photos.

    Keys are for a :class:`CrackDataset` over the pools one after the other. A pool that is not taken whole comes from
    an endless stream, the pool in a new seeded order per pass, so each sample is used before any repeats; epoch e
    (counted from 1) takes the stream's positions (e - 1) k .. e k - 1. A sample drawn twice in one epoch (a pool
    smaller than k) gets key ``(epoch, index, repeat)`` and so its own augmentation. Streams and order are functions of
    (seed, epoch): a resumed run draws what an uninterrupted one would. The epoch's list is split over processes as
    ``DistributedSampler(drop_last=True)`` splits a dataset: its last len % world_size keys are left out, and every
    process gets as many.
    """

    _ORDER, _LAP = -1, -2  # seed tags, apart from the (seed, epoch, index >= 0) of augmentation; streams count down

    def __init__(self, pools: list[Pool], seed: int, world_size: int = 1, rank: int = 0):
        if any(pool.size < 1 and pool.per_epoch for pool in pools) or any(pool.whole and pool.per_epoch != pool.size for pool in pools):
            raise ValueError(f"pools to draw from must hold samples, and a whole pool gives each once: {pools}")
        self.pools, self.seed, self.epoch = list(pools), seed, 1
        self._shard = DistributedSampler(range(sum(pool.per_epoch for pool in pools)), world_size, rank, shuffle=False,
                                         drop_last=True)

    def set_epoch(self, epoch: int) -> None:
        if epoch < 1:
            raise ValueError(f"epochs count from 1, got {epoch}")
        self.epoch = epoch

    def epoch_keys(self) -> list[tuple[int, ...]]:
        """The whole epoch's keys in their shuffled order, before they are split over processes."""
        keys, offset, stream = [], 0, 0
        for pool in self.pools:
            if pool.whole:
                keys += [(self.epoch, offset + index) for index in range(pool.size)]
            else:
                seen = Counter()
                for drawn in self._drawn(pool, self._LAP - stream):
                    keys.append((self.epoch, offset + drawn, seen[drawn]) if seen[drawn] else (self.epoch, offset + drawn))
                    seen[drawn] += 1
                stream += 1
            offset += pool.size
        order = torch.randperm(len(keys), generator=torch.Generator().manual_seed(mix_seed(self.seed, self.epoch, self._ORDER)))
        return [keys[i] for i in order.tolist()]

    def _drawn(self, pool: Pool, tag: int) -> list[int]:
        start = (self.epoch - 1) * pool.per_epoch
        stop = start + pool.per_epoch
        drawn = []
        for lap in range(start // pool.size, -(-stop // pool.size)):
            generator = torch.Generator().manual_seed(mix_seed(self.seed, lap, tag))
            order = torch.randperm(pool.size, generator=generator).tolist()
            offset = lap * pool.size
            drawn += order[max(start - offset, 0) : min(stop - offset, pool.size)]
        return drawn

    def __iter__(self):
        keys = self.epoch_keys()
        return iter([keys[position] for position in self._shard])

    def __len__(self) -> int:
        return len(self._shard)


class NegativeMixSampler(MixSampler):
    """Every positive once per epoch plus k crack-free samples (:func:`negatives_per_epoch`), shuffled together."""

    def __init__(self, positives: int, negatives: int, share: float, seed: int, world_size: int = 1, rank: int = 0):
        if negatives < 1 or not 0 <= share < 1:
            raise ValueError(f"needs crack-free samples and a share in [0, 1), got {negatives} and {share}")
        pools = [Pool(positives, positives, whole=True), Pool(negatives, negatives_per_epoch(positives, share))]
        super().__init__(pools, seed, world_size, rank)


def dataset_shares(total: int, weights: list[float]) -> list[int]:
    """How many of an epoch's ``total`` samples each dataset gives: one each, the rest in proportion to their weights
    (largest remainders rounded up)."""
    rest = max(total - len(weights), 0)
    exact = [rest * weight / sum(weights) for weight in weights]
    counts = [int(value) for value in exact]
    for index in sorted(range(len(exact)), key=lambda i: counts[i] - exact[i])[: rest - sum(counts)]:
        counts[index] += 1
    return [count + 1 for count in counts]


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
        worker_init_fn=quiet_when_parent_stops,
        generator=torch.Generator().manual_seed(0),
    )


def augments_on_device(config: TrainConfig, env: distributed.Environment) -> bool:
    """Whether the scaled crops, flips and turns run on the device (--augment-on)."""
    return config.augment_on == "device" or (config.augment_on == "auto" and env.device.type == "cuda")


def run_loaders(config: TrainConfig, env: distributed.Environment, prepared: Prepared):
    """The training sampler and loader (shuffled, sharded, last partial batch dropped), and this process's validation
    shard of each dataset, by name."""
    by_stem = {sample.stem: sample for sample in prepared.samples}
    split, workers, pin = prepared.split, prepared.resolved.workers, env.device.type == "cuda"
    positives, share = [by_stem[stem] for stem in split["train"]], prepared.resolved.negative_share
    negatives = prepared.negatives if share > 0 else []  # at share 0 the epochs are those of a run without any
    cached = decoded_samples(positives + negatives, env) if config.cache else None
    crops = window_transform if augments_on_device(config, env) else train_transform  # the rest: DeviceGeometry
    train_set = CrackDataset(positives + negatives, crops(config.crop_size), seed=config.seed, cached=cached)
    train_sampler = _train_sampler(config, env, prepared, len(positives), len(negatives))
    train_loader = make_loader(train_set, config.batch_size, train_sampler, workers, pin, drop_last=True)
    val_loaders = {}
    for name in prepared.weights:  # crack images only, as without negatives
        samples = [by_stem[stem] for stem in split["val"] if dataset_of(stem) == name]
        val_set = CrackDataset(samples, cached=decoded_samples(samples, env) if config.cache else None)
        if len(val_set):
            val_shard = Subset(val_set, list(range(env.rank, len(val_set), env.world_size)))  # every image once, no padding
            val_loaders[name] = make_loader(val_shard, None, SequentialSampler(val_shard), workers, pin)  # one image at a time
    return train_sampler, train_loader, val_loaders


def _train_sampler(config: TrainConfig, env: distributed.Environment, prepared: Prepared, positives: int,
                   negatives: int) -> torch.utils.data.Sampler:
    """One dataset: each photo once per epoch (with crack-free photos, their share on top). Several: each dataset its
    weighted share of an epoch as long as all their photos together, drawn from its own stream, then the crack-free."""
    if len(prepared.weights) > 1:
        sizes = [sum(dataset_of(stem) == name for stem in prepared.split["train"]) for name in prepared.weights]
        pools = [Pool(size, count) for size, count in zip(sizes, dataset_shares(positives, list(prepared.weights.values())))]
        if negatives:
            pools.append(Pool(negatives, negatives_per_epoch(positives, prepared.resolved.negative_share)))
        return MixSampler(pools, config.seed, env.world_size, env.rank)
    if negatives:
        return NegativeMixSampler(positives, negatives, prepared.resolved.negative_share, config.seed, env.world_size, env.rank)
    dataset = range(positives)
    return EpochSampler(DistributedSampler(dataset, env.world_size, env.rank, shuffle=True, seed=config.seed, drop_last=True))
