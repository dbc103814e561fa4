"""train --cache: decoded once per machine (its sharing by torchrun's processes: tests/model/test_distributed.py)."""

from __future__ import annotations

import os

import pytest
import torch
from PIL import Image

from crackseg.core.errors import InputError
from crackseg.data.datasets import open_dataset
from crackseg.data.pairing import Sample
from crackseg.training import image_cache
from crackseg.training.image_cache import decode_sample, decoded_samples


def test_one_process_decodes_every_sample_as_training_reads_it(synth_root, tmp_path):
    samples = open_dataset(synth_root).samples
    crack_free = Sample("free", samples[0].image, None)  # no mask file: all background
    for (image, mask), sample in zip(decoded_samples([*samples, crack_free]), [*samples, crack_free]):
        want_image, want_mask = decode_sample(sample)
        assert torch.equal(image, want_image) and torch.equal(mask, want_mask)
    assert not decoded_samples([*samples, crack_free])[-1][1].any()


def test_no_shared_file_is_made_where_shared_memory_lacks_the_room(tmp_path):
    name = image_cache.SHARED_MEMORY / f"crackseg-cache-test-{os.getpid()}"
    assert not image_cache._make(name, 2**60)
    assert not name.exists()


def test_a_mask_whose_size_no_longer_matches_its_image_is_one_line_naming_both(tmp_path):
    image, mask = tmp_path / "wall.jpg", tmp_path / "wall.png"
    Image.new("RGB", (64, 48)).save(image)
    Image.new("L", (32, 48)).save(mask)  # replaced after the dataset check
    with pytest.raises(InputError, match=f"^{image}: its mask {mask} is 32x48 px but the image is 64x48 "
                                         r"\(changed since the dataset was checked\?\)$"):
        decode_sample(Sample("wall", image, mask))
