"""Training samples from a dataset: augmented (image, mask) pairs, epoch-aware sampling, loaders.

The dataset on disk (pairs, checks, splits) is :mod:`crackseg.data.datasets`; this module
turns its samples into tensors for training and validation.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch
from torchvision import tv_tensors

from crackseg.core.errors import InputError
from crackseg.data.datasets import Sample, decoding_threads
from crackseg.data.images import DECODE_ERRORS, describe_error, load_image, load_mask
from crackseg.training.seeding import mix_seed


class CrackDataset(torch.utils.data.Dataset):
    """(image, mask) pairs as ``tv_tensors``: image (3, H, W) uint8, mask (1, H, W) uint8 in {0, 1}.

    Indexed by ``(epoch, index)`` (see :class:`EpochSampler`) with a ``seed``, each sample's
    augmentation is a pure function of (seed, epoch, index): a resumed run draws exactly
    what an uninterrupted one would, whatever the number of loader workers.
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
            return load_image(sample.image), load_mask(sample.mask)
        except DECODE_ERRORS as error:
            raise InputError(f"{sample.image}: {describe_error(error)} (changed since the dataset was checked?)") from None

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[tv_tensors.Image, tv_tensors.Mask]:
        epoch, index = key if isinstance(key, tuple) else (0, key)
        image, mask = self._cache[index] if self._cache is not None else self._decode(index)
        image, mask = tv_tensors.Image(image), tv_tensors.Mask(mask)
        if self.transform is None:
            return image, mask
        if self.seed is None:
            return self.transform(image, mask)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(mix_seed(self.seed, epoch, index))
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
