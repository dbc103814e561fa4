"""Crack-free samples mixed into training: the stated share per epoch, the draw, sharding, resume, the run."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from crackseg.cli.main import main
from crackseg.core.errors import InputError
from crackseg.data.pairing import Sample
from crackseg.training import image_cache
from crackseg.training.loader import CrackDataset, NegativeMixSampler, negatives_per_epoch
from crackseg.training.options import TrainConfig, check_same_run
from crackseg.training.transforms import train_transform

TINY_FLAGS = ["--encoder", "mobilenet_v2", "--encoder-weights", "none", "--crop-size", "64", "--batch-size", "2",
              "--workers", "0", "--val-fraction", "0.25", "--log-every", "1", "--device", "cpu", "--amp", "off"]


def _keys(positives: int, negatives: int, share: float, epoch: int, seed: int = 0, world_size: int = 1, rank: int = 0):
    sampler = NegativeMixSampler(positives, negatives, share, seed, world_size, rank)
    sampler.set_epoch(epoch)
    return list(sampler)


def _negatives_drawn(keys, positives: int) -> list[int]:
    return [key[1] - positives for key in keys if key[1] >= positives]


def test_each_epoch_holds_every_positive_once_and_the_stated_share_of_negatives():
    assert [negatives_per_epoch(10, s) for s in (0.0, 0.25, 0.5, 0.9)] == [0, 3, 10, 90]
    for epoch in (1, 2, 7):
        keys = _keys(10, 4, 0.25, epoch)
        assert len(keys) == 13 and {key[0] for key in keys} == {epoch}
        assert sorted(key[1] for key in keys if key[1] < 10) == list(range(10))
        assert len(_negatives_drawn(keys, 10)) == 3  # 3 / 13 = 0.23, the closest to 0.25
    assert sorted(_keys(10, 4, 0.0, 1)) == [(1, i) for i in range(10)]


def test_every_negative_is_used_before_any_repeats():
    per_epoch = [Counter(_negatives_drawn(_keys(9, 6, 0.25, epoch), 9)) for epoch in range(1, 7)]  # 3 of 6 per epoch
    for first in (0, 2, 4):  # two epochs make one pass over the pool
        assert per_epoch[first] + per_epoch[first + 1] == Counter(range(6))
    crowded = _keys(10, 4, 0.5, 1)  # 10 negatives from a pool of 4: passes 1 and 2, then 2 of pass 3
    counts = Counter(_negatives_drawn(crowded, 10))
    assert sorted(counts.values()) == [2, 2, 3, 3]
    assert len(set(crowded)) == len(crowded)  # a repeat has its own key, so its own augmentation


def test_the_draw_depends_on_seed_and_epoch_only():
    sampler = NegativeMixSampler(10, 4, 0.25, seed=3)
    for epoch in (1, 2, 3):  # an uninterrupted run's history ...
        sampler.set_epoch(epoch)
        list(sampler)
    assert list(sampler) == _keys(10, 4, 0.25, 3, seed=3)  # ... draws what a run resumed at epoch 3 draws
    assert _keys(10, 4, 0.25, 3, seed=3) != _keys(10, 4, 0.25, 4, seed=3)
    assert _keys(10, 4, 0.25, 3, seed=3) != _keys(10, 4, 0.25, 3, seed=4)
    with pytest.raises(ValueError, match="from 1"):
        sampler.set_epoch(0)


def test_two_processes_share_the_single_process_epoch_as_distributed_sampler_does():
    whole = NegativeMixSampler(10, 4, 0.25, seed=1)
    whole.set_epoch(2)
    epoch = whole.epoch_keys()
    ranks = [_keys(10, 4, 0.25, 2, seed=1, world_size=2, rank=rank) for rank in (0, 1)]
    assert [len(keys) for keys in ranks] == [6, 6]  # 13 keys: the last is left out (drop_last), as DistributedSampler does
    assert ranks[0] == epoch[0:12:2] and ranks[1] == epoch[1:12:2]
    assert sorted(ranks[0] + ranks[1]) == sorted(epoch[:12])
    assert len(set(ranks[0] + ranks[1])) == 12


def test_a_negative_without_a_mask_loads_as_background_and_a_repeat_draws_anew(tmp_path):
    pixels = np.random.default_rng(0).integers(0, 255, (40, 56, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "n.png")
    dataset = CrackDataset([Sample("n", tmp_path / "n.png", None)], train_transform(32), seed=0)
    image, mask = dataset[(1, 0)]
    assert image.shape == (3, 32, 32) and mask.shape == (1, 32, 32) and not mask.any()
    assert torch.equal(dataset[(1, 0)][0], image) and not torch.equal(dataset[(1, 0, 1)][0], image)
    assert CrackDataset([Sample("n", tmp_path / "n.png", None)])[0][1].shape == (1, 40, 56)


def test_a_resume_with_other_negatives_is_refused_and_older_runs_had_none(tmp_path):
    older = {key: value for key, value in TrainConfig(run="r", data="d").to_dict().items()
             if key not in ("negatives", "negative_share")}  # saved before these options existed
    check_same_run(TrainConfig(run="r", data="d"), older, tmp_path / "last.pt")
    with pytest.raises(InputError, match=r"--negatives /n \(saved: None\) contradicts"):
        check_same_run(TrainConfig(run="r", data="d", negatives="/n"), older, tmp_path / "last.pt")
    saved = TrainConfig(run="r", data="d", negatives="/n", negative_share=0.25).to_dict()
    with pytest.raises(InputError, match=r"--negative-share 0.5 \(saved: 0.25\)"):
        check_same_run(TrainConfig(run="r", data="d", negatives="/n", negative_share=0.5), saved, tmp_path / "last.pt")


def _train(capsys, *args) -> tuple[int, str]:
    try:
        code = main(["train", *map(str, args)])
    except SystemExit as exit:
        code = exit.code
    return code, capsys.readouterr().err


def _crack_free_photos(folder: Path, names, seed: int = 0) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        pixels = np.random.default_rng(seed + i).integers(110, 210, (64, 64, 3), dtype=np.uint8)
        pixels[20 + 5 * i : 22 + 5 * i] = 35  # a joint or paint line: dark and straight, not a crack
        Image.fromarray(pixels).save(folder / name)
    return [folder / name for name in names]


def test_training_mixes_in_the_crack_free_photos_and_records_them(synth_root, tmp_path, monkeypatch, capsys):
    data = tmp_path / "data"
    shutil.copytree(synth_root, data)
    listed = _crack_free_photos(data / "images", ["free1.png", "free2.png"])
    (data / "negatives.txt").write_text("free1\nfree2\n")
    photos = _crack_free_photos(tmp_path / "negatives", ["joint.png", "shadow.jpg"], seed=10)
    loaded = Counter()
    original = image_cache.load_image

    def counted(path):
        loaded[Path(path)] += 1
        return original(path)

    monkeypatch.setattr(image_cache, "load_image", counted)
    run = tmp_path / "run"
    code, error = _train(capsys, "--data", data, "--run", run, "--negatives", tmp_path / "negatives", "--epochs", "2", *TINY_FLAGS)
    assert code == 0, error
    # 12 crack images: 9 train, 3 val; 9 / (9 + 3) -> 3 crack-free per epoch, 6 in 2 epochs from a pool of 4
    assert "9 train / 3 val images; 3 of 4 crack-free images in each epoch (negative share 0.25)" in (run / "train.log").read_text()
    assert sum(loaded[path] for path in listed + photos) == 6 and all(loaded[path] for path in listed + photos)
    split = json.loads((run / "split.json").read_text())
    assert split["negatives"] == ["free1", "free2"] and split["negative_files"] == ["joint.png", "shadow.jpg"]
    assert not {"free1", "free2"} & set(split["train"] + split["val"] + split["test"])
    config = json.loads((run / "config.json").read_text())
    assert config["options"]["negatives"] == str((tmp_path / "negatives").absolute()) and config["options"]["negative_share"] is None
    assert config["resolved"]["negative_share"] == 0.25

    code, error = _train(capsys, "--data", data, "--run", run, "--epochs", "2", *TINY_FLAGS)
    assert code == 2 and "--negatives None (saved: " in error and error.count("\n") == 1


def test_negative_mistakes_are_one_line_errors(synth_root, tmp_path, capsys):
    folder = tmp_path / "negatives"
    _crack_free_photos(folder / "images", ["a.png"])
    cracked = folder / "masks" / "a.png"
    cracked.parent.mkdir()
    mask = np.zeros((64, 64), np.uint8)
    mask[10, 5:9] = 255
    Image.fromarray(mask).save(cracked)
    code, error = _train(capsys, "--data", synth_root, "--run", tmp_path / "r1", "--negatives", folder, *TINY_FLAGS)
    assert code == 2 and error == f"crackseg: error: {cracked}: 4 crack pixels in the mask of a crack-free image (a negative); " \
                                  "fix the mask, or take a.png out of the negatives\n"
    code, error = _train(capsys, "--data", synth_root, "--run", tmp_path / "r2", "--negative-share", "1", *TINY_FLAGS)
    assert code == 2 and "argument --negative-share: must be in [0, 1), got 1" in error and error.count("\n") == 1
    code, error = _train(capsys, "--data", synth_root, "--run", tmp_path / "r3", "--negative-share", "0.3", *TINY_FLAGS)
    assert code == 2 and "--negative-share 0.3 needs crack-free photos" in error and error.count("\n") == 1
