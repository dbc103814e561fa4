"""Training on several datasets at once: each its own split and its share of every epoch, validation per dataset and
pooled (across torchrun's processes too: tests/model/test_distributed.py), the datasets recorded in the run folder."""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections import Counter
from pathlib import Path

import pytest
import torch

from crackseg.cli.main import main
from crackseg.data.collection import dataset_checksum, dataset_names
from crackseg.data.pairing import Sample
from crackseg.data.synth import write_dataset
from crackseg.model.checkpoint import read_checkpoint
from crackseg.training.engine import Validation
from crackseg.training.loader import MixSampler, Pool, dataset_shares

TINY_FLAGS = ["--encoder", "mobilenet_v2", "--encoder-weights", "none", "--crop-size", "64", "--batch-size", "2",
              "--workers", "0", "--val-fraction", "0.25", "--log-every", "1", "--device", "cpu"]


def _train(*args) -> tuple[int, str]:
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(["train", *map(str, args)])
        except SystemExit as exit:
            code = exit.code
    return code, stderr.getvalue()


@pytest.fixture(scope="module")
def two_datasets(tmp_path_factory) -> tuple[Path, Path]:
    """A dataset of 12 photos with its own test.txt, and one of 4 without split files: apart by size and by name."""
    big, small = tmp_path_factory.mktemp("walls") / "walls", tmp_path_factory.mktemp("roads") / "roads"
    write_dataset(big, count=12, size=(64, 64), seed=3)
    write_dataset(small, count=4, size=(64, 64), seed=4)
    (big / "test.txt").write_text("00010\n00011\n")
    return big, small


def test_shares_follow_the_weights_and_fill_the_epoch():
    assert dataset_shares(16, [1, 1]) == [8, 8]
    assert dataset_shares(16, [1, 1, 2]) == [4, 4, 8]
    assert sorted(dataset_shares(10, [1, 1, 1])) == [3, 3, 4]
    assert sum(dataset_shares(10, [1, 1, 1])) == 10 and dataset_shares(3, [100, 1]) == [2, 1]


def test_every_pool_gives_its_share_and_a_small_one_repeats_only_after_a_whole_pass():
    sampler = MixSampler([Pool(12, 8), Pool(4, 8)], seed=5)
    for epoch in (1, 2, 3):
        sampler.set_epoch(epoch)
        keys = sampler.epoch_keys()
        by_pool = Counter("small" if key[1] >= 12 else "big" for key in keys)
        assert by_pool == {"big": 8, "small": 8}
        small = Counter(key[1] for key in keys if key[1] >= 12)
        assert set(small.values()) == {2}  # 8 draws from 4 photos: each twice, the second with its own augmentation
        assert len({key for key in keys if key[1] >= 12}) == 8
    sampler.set_epoch(1)
    first = [key[1] for key in sampler.epoch_keys() if key[1] < 12]
    sampler.set_epoch(2)
    second = [key[1] for key in sampler.epoch_keys() if key[1] < 12]
    assert len(set(first)) == 8 and set(range(12)) <= set(first) | set(second)  # every big photo within two epochs


def test_processes_share_one_epoch_and_a_resume_draws_the_same():
    whole = MixSampler([Pool(12, 8), Pool(4, 8)], seed=5)
    whole.set_epoch(3)
    shards = []
    for rank in (0, 1):
        shard = MixSampler([Pool(12, 8), Pool(4, 8)], seed=5, world_size=2, rank=rank)
        shard.set_epoch(3)
        shards.append(list(shard))
    assert len(shards[0]) == len(shards[1]) == 8 and sorted(shards[0] + shards[1]) == sorted(whole.epoch_keys())
    again = MixSampler([Pool(12, 8), Pool(4, 8)], seed=5)
    again.set_epoch(3)
    assert again.epoch_keys() == whole.epoch_keys()


def test_pooled_validation_is_the_validation_of_the_union():
    generator = torch.Generator().manual_seed(0)
    parts = [Validation(float(torch.rand(1, generator=generator)), torch.randint(0, 50, (3, 8), generator=generator), weight=w)
             for w in (10.0, 30.0)]
    pooled = Validation.pooled(parts)
    assert torch.equal(pooled.histograms, parts[0].histograms + parts[1].histograms)
    assert pooled.loss == pytest.approx((parts[0].loss * 10 + parts[1].loss * 30) / 40) and pooled.weight == 40


def test_names_are_the_folders_numbered_where_they_repeat(tmp_path):
    assert dataset_names([tmp_path / "cfd"]) == [""]
    assert dataset_names([tmp_path / "cfd", tmp_path / "a" / "cfd", tmp_path / "masonry", tmp_path / "b" / "cfd"]) == \
        ["cfd", "cfd-2", "masonry", "cfd-3"]


def test_two_datasets_train_together_each_split_apart_and_are_recorded(two_datasets, tmp_path):
    big, small = two_datasets
    run = tmp_path / "run"
    code, error = _train("--data", big, "--data", small, "--run", run, "--epochs", "2", *TINY_FLAGS)
    assert code == 0, error
    split = json.loads((run / "split.json").read_text())
    assert split["test"] == ["walls/00010", "walls/00011"]  # each dataset's own test.txt, its stems named
    assert {stem.split("/")[0] for stem in split["train"] + split["val"]} == {"walls", "roads"}
    assert sum(stem.startswith("walls/") for stem in split["val"]) == 2 and sum(stem.startswith("roads/") for stem in split["val"]) == 1
    setup = json.loads((run / "config.json").read_text())
    assert setup["options"]["data"] == [str(big), str(small)]
    walls, roads = setup["datasets"]
    assert (walls["name"], walls["train"], walls["val"], walls["test"], walls["weight"]) == ("walls", 8, 2, 2, 1.0)
    assert (roads["name"], roads["train"], roads["val"], roads["test"]) == ("roads", 3, 1, 0)
    samples = [Sample(path.stem, path, big / "masks" / f"{path.stem}.png") for path in sorted((big / "images").iterdir())]
    assert walls["checksum"] == dataset_checksum(samples)
    log = (run / "train.log").read_text()
    assert "2 datasets: walls (8 train, weight 1), roads (3 train, weight 1)" in log
    assert "    walls: F1" in log and "    roads: F1" in log
    saved = read_checkpoint(run / "last.pt")
    assert saved["model"]["config"]["threshold"] == pytest.approx(saved["metrics"]["threshold"])  # the pooled sets'

    code, error = _train("--data", big, "--data", small, "--run", run, "--epochs", "3", *TINY_FLAGS)  # resumed
    assert code == 0, error
    assert read_checkpoint(run / "last.pt")["epoch"] == 3
    code, error = _train("--data", small, "--data", big, "--run", run, "--epochs", "4", *TINY_FLAGS)
    assert code == 2 and "contradicts the run saved" in error and error.count("\n") == 1


def test_a_list_file_names_the_datasets_and_their_weights(two_datasets, tmp_path):
    big, small = two_datasets
    listing = tmp_path / "lists" / "datasets.txt"
    listing.parent.mkdir()
    listing.write_text(f"# the sites\n{big}  3\n{os.path.relpath(small, listing.parent)}   # relative to the list\n")
    run = tmp_path / "run"
    code, error = _train("--data", listing, "--run", run, "--epochs", "1", *TINY_FLAGS)
    assert code == 0, error
    setup = json.loads((run / "config.json").read_text())
    assert setup["options"]["data"] == [str(big), str(small)] and setup["options"]["data_weights"] == [3.0, 1.0]
    assert [entry["weight"] for entry in setup["datasets"]] == [3.0, 1.0]


@pytest.mark.parametrize("flags, message", [
    (["--data-weights", "1"], "--data-weights gives 1 weights for 2 datasets"),
    (["--data-weights", "1,0"], "argument --data-weights: must be > 0, got 0"),
    (["--images", "x"], "--images and --masks name the folders of one dataset"),
])
def test_mistakes_with_several_datasets_are_one_line(two_datasets, tmp_path, flags, message):
    big, small = two_datasets
    code, error = _train("--data", big, "--data", small, "--run", tmp_path / "run", *flags, *TINY_FLAGS)
    assert code == 2 and message in error and error.count("\n") == 1, error
    assert not (tmp_path / "run").exists()


def test_images_and_masks_with_a_list_of_several_datasets_are_refused(two_datasets, tmp_path):
    """Every dataset of the list would have read the one --images folder: one site's photos, trained on twice."""
    big, small = two_datasets
    listing = tmp_path / "datasets.txt"
    listing.write_text(f"{big}\n{small}\n")
    code, error = _train("--data", listing, "--images", big / "images", "--masks", big / "masks", "--run", tmp_path / "run", *TINY_FLAGS)
    assert code == 2 and "--images and --masks name the folders of one dataset" in error and error.count("\n") == 1, error
    assert not (tmp_path / "run").exists()


def test_the_same_dataset_twice_is_refused_even_through_a_link_or_a_list(two_datasets, tmp_path):
    big, small = two_datasets
    (tmp_path / "again").symlink_to(big)
    listing = tmp_path / "datasets.txt"
    listing.write_text(f"{small}\n{big}\n")
    for data in ([big, small, big], [big, small, tmp_path / "again"], [listing, big]):
        code, error = _train(*[arg for root in data for arg in ("--data", root)], "--run", tmp_path / "run", *TINY_FLAGS)
        assert code == 2 and "given twice" in error and f"the same dataset as {big}" in error and error.count("\n") == 1, error
        assert not (tmp_path / "run").exists()


def test_a_dataset_with_nothing_to_train_on_is_one_line_and_leaves_no_run_folder(two_datasets, tmp_path):
    import shutil

    big, small = two_datasets
    held_out = tmp_path / "held-out"
    shutil.copytree(small, held_out)
    (held_out / "val.txt").write_text("".join(f"{path.stem}\n" for path in (held_out / "images").iterdir()))
    empty = tmp_path / "empty"
    (empty / "images").mkdir(parents=True)
    (empty / "masks").mkdir()
    for other, reason in ((held_out, "its split files put all 4 of its usable photos in val or test"),
                          (empty, "it has no usable image/mask pairs")):
        code, error = _train("--data", big, "--data", other, "--run", tmp_path / "run", "--on-bad-sample", "skip", *TINY_FLAGS)
        assert code == 2 and f"--data {other}: no training images" in error, error
        assert reason in error and error.count("\n") == 1 and "Traceback" not in error, error
        assert not (tmp_path / "run").exists()


def test_a_file_that_is_not_a_list_is_one_line(two_datasets, tmp_path):
    binary = tmp_path / "weights.pt"
    binary.write_bytes(bytes(range(256)))
    code, error = _train("--data", binary, "--data", two_datasets[0], "--run", tmp_path / "run", *TINY_FLAGS)
    assert code == 2 and f"--data {binary}: a file, but not a text list of dataset folders" in error and error.count("\n") == 1


def test_a_dataset_that_is_not_there_is_named_before_any_saved_run_is_compared(two_datasets, tmp_path):
    """A typo in --data names the folder, not a contradiction with the run it would resume; a list file that names no
    dataset folder (a split file given by mistake) names its line."""
    big, _ = two_datasets
    assert _train("--data", big, "--run", tmp_path / "run", "--epochs", "1", *TINY_FLAGS)[0] == 0
    code, error = _train("--data", tmp_path / "bgi", "--run", tmp_path / "run", "--epochs", "1", *TINY_FLAGS)
    assert code == 2 and error == f"crackseg: error: --data {tmp_path / 'bgi'}: no such dataset folder or list file\n", error
    stems = tmp_path / "train.txt"
    stems.write_text("00000\n00001\n")
    code, error = _train("--data", stems, "--run", tmp_path / "other", *TINY_FLAGS)
    assert code == 2 and f"{stems}:1: 00000: no such dataset folder (the file lists one per line" in error, error
    assert error.count("\n") == 1 and not (tmp_path / "other").exists()
    listing = tmp_path / "datasets.txt"  # saved by Notepad: UTF-8 with a byte order mark, or "Unicode"
    for encoding in ("utf-8-sig", "utf-16"):
        listing.write_bytes(f"{big}\n".encode(encoding))
        assert _train("--data", listing, "--run", tmp_path / "run", "--epochs", "1", *TINY_FLAGS)[0] == 0, encoding


def test_one_dataset_s_crack_free_photos_are_mixed_in_under_its_name(two_datasets, tmp_path):
    import shutil

    import numpy as np
    from PIL import Image

    big, small = two_datasets
    roads = tmp_path / "roads"
    shutil.copytree(small, roads)
    for index in range(2):
        Image.fromarray(np.full((64, 64, 3), 120 + 40 * index, np.uint8)).save(roads / "images" / f"free{index}.png")
    (roads / "negatives.txt").write_text("free0\nfree1\n")
    run = tmp_path / "run"
    code, error = _train("--data", big, "--data", roads, "--run", run, "--epochs", "1", *TINY_FLAGS)
    assert code == 0, error
    split = json.loads((run / "split.json").read_text())
    assert split["negatives"] == ["roads/free0", "roads/free1"]
    assert not {"roads/free0", "roads/free1"} & set(split["train"] + split["val"] + split.get("test", []))
    assert "of 2 crack-free images in each epoch" in (run / "train.log").read_text()


def test_a_dataset_changed_since_the_run_began_is_said(two_datasets, tmp_path):
    import shutil

    big, small = two_datasets
    copy = tmp_path / "roads"
    shutil.copytree(small, copy)
    run = tmp_path / "run"
    assert _train("--data", big, "--data", copy, "--run", run, "--epochs", "1", *TINY_FLAGS)[0] == 0
    mask = sorted((copy / "masks").iterdir())[0]
    mask.write_bytes(sorted((big / "masks").iterdir())[0].read_bytes())
    code, error = _train("--data", big, "--data", copy, "--run", run, "--epochs", "2", *TINY_FLAGS)
    assert code == 0 and "dataset roads" in error and "changed since the run began" in error
