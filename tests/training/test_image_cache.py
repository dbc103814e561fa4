"""train --cache: decoded once per machine, in shared memory for torchrun's processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from crackseg.data.datasets import Sample, open_dataset
from crackseg.model.checkpoint import read_checkpoint
from crackseg.training import image_cache
from crackseg.training.image_cache import decode_sample, decoded_samples

ROOT = Path(__file__).resolve().parents[2]
TINY_FLAGS = ["--encoder", "mobilenet_v2", "--encoder-weights", "none", "--crop-size", "64", "--batch-size", "2",
              "--val-fraction", "0.25", "--log-every", "1", "--device", "cpu", "--workers", "1", "--epochs", "2", "--amp", "off"]


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


@pytest.mark.slow
def test_two_processes_share_one_decoded_copy_and_train_as_without_it(synth_root, tmp_path):
    """Each of 2 local processes decodes half the samples into one shared file, removed once both mapped it; the
    run's weights are those of a run that decodes every image in every step."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env |= {"PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    before = set(image_cache.SHARED_MEMORY.glob("crackseg-cache-*"))
    weights = []
    for name, extra in (("cached", ["--cache"]), ("plain", [])):
        run = tmp_path / name
        result = subprocess.run(["bash", str(ROOT / "launch.sh"), "--nproc", "2", "--max-restarts", "0", "train", "--data",
                                 str(synth_root), "--run", str(run), *TINY_FLAGS, *extra],
                                capture_output=True, text=True, env=env, timeout=300)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
        weights.append(read_checkpoint(run / "last.pt")["model"]["state_dict"])
    log = (tmp_path / "cached" / "train.log").read_text()
    assert "images decoded once per machine into shared memory" in log and "for its 2 processes" in log
    assert log.count("--cache:") == 2  # the training and the validation images
    assert set(image_cache.SHARED_MEMORY.glob("crackseg-cache-*")) == before
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[0])
