"""``train --cache``: every image and mask decoded once, and held as uint8 where every process of a machine reads them.

With one process, the decoded tensors are in its memory, and the loader workers it forks share them. With
torchrun's processes, one machine's processes share one file in shared memory (``/dev/shm``): each decodes its
share of the samples into it, so a machine decodes each image once and holds it once, however many GPUs it
trains on. Where that file does not fit, each process decodes and holds everything itself, as it would alone.
"""

from __future__ import annotations

import logging
import mmap
import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from crackseg.core.errors import InputError, RunError
from crackseg.data.datasets import decoding_threads
from crackseg.data.images import DECODE_ERRORS, describe_error, displayed_size, load_image, load_mask, open_picture
from crackseg.data.pairing import Sample
from crackseg.model import distributed

log = logging.getLogger("crackseg.train.cache")  # into train.log, by the run folder's handlers
SHARED_MEMORY = Path("/dev/shm")
_HEADROOM = 1.1  # the file is refused unless shared memory has this much more room than it needs

Decoded = tuple[torch.Tensor, torch.Tensor]  # image (3, H, W) uint8, mask (1, H, W) uint8 in {0, 1}


def decode_sample(sample: Sample) -> Decoded:
    """A sample's image and mask as training reads them; a sample without a mask gets an all-background one."""
    try:
        image = load_image(sample.image)
        mask = load_mask(sample.mask) if sample.mask else torch.zeros((1, *image.shape[1:]), dtype=torch.uint8)
    except DECODE_ERRORS as error:
        raise _changed(sample, describe_error(error)) from None
    except InputError as error:  # a StorageError: a loader worker's is made again from its message alone, as an InputError is
        raise InputError(str(error)) from None
    if mask.shape[1:] != image.shape[1:]:  # a file replaced since the check: the crops would fail in torchvision
        (height, width), (image_height, image_width) = mask.shape[1:], image.shape[1:]
        raise _changed(sample, f"its mask {sample.mask} is {width}x{height} px but the image is {image_width}x{image_height}")
    return image, mask


def decoded_samples(samples: list[Sample], env: distributed.Environment | None = None,
                    workers: int | None = None) -> list[Decoded]:
    """Every sample decoded (see the module): in this process alone (``env`` None: one process), or shared by the
    processes of this machine."""
    local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if env is None or not env.distributed or local_processes == 1:
        return _decoded_here(samples, workers)
    shapes = _shapes(samples, workers)
    sizes = [4 * height * width for height, width in shapes]  # 3 channels of image, then 1 of mask
    ends = np.cumsum(sizes)
    name = SHARED_MEMORY / f"crackseg-cache-{distributed.broadcast_from_main(secrets.token_hex(8))}"
    local_rank = env.local_rank
    made = local_rank != 0 or _make(name, int(ends[-1]) if len(ends) else 0)
    megabytes = int(ends[-1]) / 2**20 if len(ends) else 0.0
    if distributed.all_reduce_min(torch.tensor(int(made))).item() == 0:  # some machine lacks the room: each process alone
        if local_rank == 0:
            name.unlink(missing_ok=True)
        log.info(f"--cache: {SHARED_MEMORY} lacks the room for {len(samples)} decoded images ({megabytes:.1f} MB) on some "
                 "machine: each process decodes and holds them")
        return _decoded_here(samples, workers)
    try:
        error = None
        try:
            with open(name, "r+b") as file:
                buffer = mmap.mmap(file.fileno(), 0) if len(ends) else bytearray()
            views = []
            for (height, width), end, size in zip(shapes, ends, sizes):
                flat = np.frombuffer(buffer, np.uint8, size, end - size)
                views.append((torch.from_numpy(flat[: 3 * height * width].reshape(3, height, width)),
                              torch.from_numpy(flat[3 * height * width :].reshape(1, height, width))))
            mine = range(local_rank, len(samples), local_processes)
            with ThreadPoolExecutor(workers or decoding_threads()) as pool:
                for index, (image, mask) in zip(mine, pool.map(decode_sample, [samples[i] for i in mine])):
                    if image.shape != views[index][0].shape or mask.shape != views[index][1].shape:
                        raise _changed(samples[index], f"decoded as {tuple(image.shape[1:])} px, its header says "
                                                       f"{tuple(views[index][0].shape[1:])}")
                    views[index][0].copy_(image)
                    views[index][1].copy_(mask)
        except Exception as failed:  # every process reaches the gather, whatever stopped it, so none waits in it alone
            error = (str(failed), isinstance(failed, InputError))
        errors = [found for found in distributed.gather_objects(error, env) if found]
    finally:
        distributed.barrier()
        if local_rank == 0:
            name.unlink(missing_ok=True)  # every process has it mapped: the memory stays until the last one ends
    if errors:
        message, mistake = errors[0]
        raise InputError(message) if mistake else RunError(f"--cache: the shared memory could not be filled ({message})")
    log.info(f"--cache: {_count(len(samples), 'image', 'images')} decoded once per machine into shared memory "
             f"({megabytes:.1f} MB), for its {_count(local_processes, 'process', 'processes')}")
    return views


def _count(number: int, one: str, many: str) -> str:
    return f"{number} {one if number == 1 else many}"


def _shapes(samples: list[Sample], workers: int | None) -> list[tuple[int, int]]:
    """(height, width) of each sample's image, from its header, as decoding will orient it."""

    def shape(sample: Sample) -> tuple[int, int]:
        try:
            with open_picture(sample.image) as picture:
                width, height = displayed_size(picture)
            return height, width
        except DECODE_ERRORS as error:
            raise _changed(sample, describe_error(error)) from None

    with ThreadPoolExecutor(workers or decoding_threads()) as pool:
        return list(pool.map(shape, samples))


def _decoded_here(samples: list[Sample], workers: int | None) -> list[Decoded]:
    with ThreadPoolExecutor(workers or decoding_threads()) as pool:
        return list(pool.map(decode_sample, samples))


def _changed(sample: Sample, problem: str) -> InputError:
    return InputError(f"{sample.image}: {problem} (changed since the dataset was checked?)")


def _make(name: Path, size: int) -> bool:
    """The shared file of ``size`` bytes, its memory reserved now (not at a page's first write, where a full
    ``/dev/shm`` would kill the process); False where shared memory lacks the room."""
    try:
        free = os.statvfs(SHARED_MEMORY)
        if free.f_bavail * free.f_frsize < size * _HEADROOM:
            return False
        descriptor = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return False
    try:
        if size:
            os.posix_fallocate(descriptor, 0, size)
        return True
    except OSError:
        name.unlink(missing_ok=True)
        return False
    finally:
        os.close(descriptor)
