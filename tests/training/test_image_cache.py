"""train --cache: decoded once per machine (its sharing by torchrun's processes: tests/model/test_distributed.py)."""

from __future__ import annotations

import os

import torch

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
