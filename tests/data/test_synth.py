from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from scipy import ndimage

from crackseg.core.errors import InputError
from crackseg.core.options import parse_size
from crackseg.core.locks import FolderLock
from crackseg.data import synth, synth_folder
from crackseg.data.synth import SynthOptions, make_sample, write_dataset


def _files(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_gives_identical_bytes_and_other_seeds_differ(tmp_path):
    write_dataset(tmp_path / "a", count=4, size=(48, 64), seed=3, options=SynthOptions(truth=True))
    write_dataset(tmp_path / "b", count=4, size=(48, 64), seed=3, options=SynthOptions(truth=True), workers=2)
    write_dataset(tmp_path / "c", count=4, size=(48, 64), seed=4, options=SynthOptions(truth=True))
    a, b, c = (_files(tmp_path / name) for name in "abc")
    assert len(a) == 13  # 4 images, 4 masks, 4 truth labels, truth.json
    assert a == b
    assert all(a[name] != c[name] for name in a if name.suffix == ".jpg")


def test_masks_are_binary_png_of_the_image_size(tmp_path):
    stems = write_dataset(tmp_path, count=5, size=(40, 72), seed=1)
    for stem in stems:
        image = Image.open(tmp_path / "images" / f"{stem}.jpg")
        mask = Image.open(tmp_path / "masks" / f"{stem}.png")
        assert image.size == mask.size == (72, 40)
        assert image.mode == "RGB" and mask.mode == "L"
        assert set(np.unique(np.asarray(mask))) <= {0, 255}


def test_crack_pixels_are_darker_than_their_surroundings():
    rng = np.random.default_rng(0)
    contrasts = []
    for _ in range(20):
        sample = make_sample(rng, 96, 96)
        if not sample.mask.any():
            continue
        grey = sample.image.mean(axis=2)
        ring = ndimage.binary_dilation(sample.mask, iterations=4) & ~sample.mask
        contrasts.append(grey[ring].mean() - grey[sample.mask].mean())
    assert len(contrasts) >= 10
    assert np.mean(contrasts) > 15  # grey levels


def test_some_images_are_crack_free():
    rng = np.random.default_rng(1)
    empty = [not make_sample(rng, 32, 32).mask.any() for _ in range(60)]
    assert 2 <= sum(empty) <= 25


def test_distractors_are_visible_but_not_labelled():
    rng = np.random.default_rng(2)
    contrasts = []
    for _ in range(40):
        sample = make_sample(rng, 96, 96)
        marks = sample.distractors & ~ndimage.binary_dilation(sample.mask, iterations=6)
        assert not sample.mask[marks].any()
        grey = sample.image.mean(axis=2)
        labels, count = ndimage.label(marks, np.ones((3, 3)))
        for index in range(1, count + 1):
            mark = labels == index
            if mark.sum() >= 15:
                ring = ndimage.binary_dilation(mark, iterations=3) & ~ndimage.binary_dilation(marks)
                contrasts.append(abs(grey[mark].mean() - grey[ring].mean()))
    assert len(contrasts) >= 10
    assert np.median(contrasts) > 5  # grey levels: the marks show in the photo


def test_truth_lengths_and_widths_are_plausible(tmp_path):
    write_dataset(tmp_path, count=6, size=(128, 128), seed=5, options=SynthOptions(truth=True))
    truth = json.loads((tmp_path / "truth.json").read_text())
    cracks = [crack for stem in truth for crack in truth[stem]]
    assert cracks
    for crack in cracks:
        assert 1.0 <= crack["mean_width_px"] <= crack["max_width_px"] <= 10.0
        assert crack["length_px"] >= 0
    for stem, listed in truth.items():
        crack_pixels = np.asarray(Image.open(tmp_path / "masks" / f"{stem}.png")).astype(bool).sum()
        nominal_area = sum(c["length_px"] * c["mean_width_px"] for c in listed)
        if nominal_area > 200:
            assert 0.4 < crack_pixels / nominal_area < 1.6  # overlapping branches make it inexact


def test_without_crack_free_images_every_mask_has_cracks_and_every_listed_crack_its_pixels(tmp_path):
    """At 32 px a crack may walk out of the image at once: it is no crack, and the image is still meant to show one."""
    write_dataset(tmp_path, count=30, size=(32, 32), seed=0, options=SynthOptions(truth=True, crack_free=0.0))
    truth = json.loads((tmp_path / "truth.json").read_text())
    for stem, cracks in truth.items():
        labels = np.asarray(Image.open(tmp_path / "truth" / f"{stem}.png"))
        assert np.asarray(Image.open(tmp_path / "masks" / f"{stem}.png")).any(), stem
        assert all(crack["length_px"] > 0 for crack in cracks) and set(np.unique(labels)) - {0} == set(range(1, len(cracks) + 1)), stem


def test_existing_output_is_not_overwritten(tmp_path):
    write_dataset(tmp_path, count=1, size=(32, 32), seed=0)
    before = _files(tmp_path)
    with pytest.raises(InputError, match="already holds files"):
        write_dataset(tmp_path, count=1, size=(32, 32), seed=1)
    assert _files(tmp_path) == before
    write_dataset(tmp_path, count=1, size=(32, 32), seed=1, overwrite=True)
    assert _files(tmp_path) != before


def test_an_overwrite_stopped_part_way_leaves_the_earlier_dataset_whole(tmp_path, monkeypatch):
    write_dataset(tmp_path, count=4, size=(32, 32), seed=0, options=SynthOptions(truth=True))
    before = _files(tmp_path)
    real = synth._write_one

    def stopped_at_the_third(job):
        if job[2] == 2:
            raise KeyboardInterrupt
        return real(job)

    monkeypatch.setattr(synth, "_write_one", stopped_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        write_dataset(tmp_path, count=4, size=(32, 32), seed=1, overwrite=True)
    assert _files(tmp_path) == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["images", "masks", "truth", "truth.json"]


def test_a_swap_that_fails_part_way_puts_the_earlier_dataset_back(tmp_path, monkeypatch):
    """A part that cannot be moved (a mount point, a folder without write permission) stops the swap: undone, not a mix."""
    write_dataset(tmp_path, count=3, size=(32, 32), seed=0, options=SynthOptions(truth=True))
    before = _files(tmp_path)
    real = os.replace

    def failing_at_the_new_masks(source, target):
        if Path(source) == tmp_path / synth_folder.STAGING / "masks":  # the earlier parts aside, the new images in place
            assert (tmp_path / "images").is_dir() and not (tmp_path / "masks").exists()
            raise OSError(16, "Device or resource busy", str(source))
        return real(source, target)

    monkeypatch.setattr(os, "replace", failing_at_the_new_masks)
    with pytest.raises(OSError, match="busy"):
        write_dataset(tmp_path, count=2, size=(32, 32), seed=1, overwrite=True)
    assert _files(tmp_path) == before and not (tmp_path / synth_folder.STAGING).exists()


def test_what_a_killed_run_left_is_cleared_and_a_running_one_is_not_disturbed(tmp_path):
    fresh, tmp_path = tmp_path / "fresh", tmp_path / "out"
    write_dataset(tmp_path, count=2, size=(32, 32), seed=0)
    staging = tmp_path / synth_folder.STAGING / "images"
    staging.mkdir(parents=True)
    (staging / "00000.jpg").write_bytes(b"half a run of another seed")
    (tmp_path / "lock").write_text(json.dumps({"pid": 2**22 + 1, "host": socket.gethostname(), "since": "then"}))
    write_dataset(tmp_path, count=3, size=(32, 32), seed=1, overwrite=True)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["images", "masks"]
    write_dataset(fresh, count=3, size=(32, 32), seed=1)
    assert _files(tmp_path) == _files(fresh)

    running = FolderLock(tmp_path, "crackseg synth", "OUT")
    running.acquire()
    try:
        with pytest.raises(InputError, match=f"^{tmp_path} is in use by"):
            write_dataset(tmp_path, count=1, size=(32, 32), seed=2, overwrite=True)
    finally:
        running.release()
    assert _files(tmp_path) == _files(fresh)


@pytest.mark.parametrize("sub, kind, what", [("images", "file", "a file, not a folder"), ("masks", "file", "a file, not a folder"),
                                             ("truth", "link", "a broken link, not a folder"),
                                             ("truth.json", "folder", "a folder, not a file")])
def test_a_file_where_a_dataset_folder_goes_is_refused_before_anything_is_written(tmp_path, sub, kind, what):
    if kind == "file":
        (tmp_path / sub).write_text("notes")
    elif kind == "link":
        (tmp_path / sub).symlink_to(tmp_path / "nowhere")
    else:
        (tmp_path / sub).mkdir()
    with pytest.raises(InputError, match=f"^{tmp_path / sub} is {what}; synth writes its"):
        write_dataset(tmp_path, count=1, size=(32, 32), seed=0, overwrite=True)
    assert sorted(path.name for path in tmp_path.iterdir()) == [sub]


@pytest.mark.parametrize("text, expected", [("256", (256, 256)), ("320x480", (320, 480)), ("64X32", (64, 32))])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "10", "3x4x5", "-5"])
def test_parse_size_rejects_bad_text(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_overwrite_with_fewer_images_leaves_only_the_new_dataset(tmp_path):
    write_dataset(tmp_path, count=5, size=(32, 32), seed=1, options=SynthOptions(truth=True))
    write_dataset(tmp_path, count=2, size=(32, 32), seed=2, overwrite=True)
    assert sorted(p.name for p in (tmp_path / "images").iterdir()) == ["00000.jpg", "00001.jpg"]
    assert sorted(p.name for p in (tmp_path / "masks").iterdir()) == ["00000.png", "00001.png"]
    assert not (tmp_path / "truth.json").exists()
    (tmp_path / "images" / "holiday.jpg").write_bytes(b"someone else's photo")
    with pytest.raises(InputError, match="holiday.jpg: not written by crackseg synth"):
        write_dataset(tmp_path, count=2, size=(32, 32), seed=2, overwrite=True)
    assert (tmp_path / "images" / "holiday.jpg").exists()
