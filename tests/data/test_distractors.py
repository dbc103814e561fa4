"""crackseg synth --hard-negatives and --crack-free: look-alikes that show but are never labelled, the default data unchanged."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math

import numpy as np
import pytest
from PIL import Image
from scipy import ndimage

from crackseg.cli.main import build_parser, main
from crackseg.core.errors import InputError
from crackseg.data import synth
from crackseg.data.distractors import KINDS, draw_look_alike
from crackseg.data.synth import CRACK_FREE_FRACTION, SynthOptions, make_sample, write_dataset

# Recorded from the code before --hard-negatives existed: the demo data, test fixtures and docs depend on them.
DEFAULT_FILES_SHA256 = "6f8b5bbb8f85eca62bf0abb5606168f6ff4317bf5755e0fcdb4872b9f87e7db3"
DEFAULT_ARRAYS_SHA256 = "eb4e25e635654b569cd3e9a8077533a3e2e277b3dfaaca0e5f74f48adde5c89f"


def _files(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _masks(root) -> dict[str, np.ndarray]:
    return {p.stem: np.asarray(Image.open(p)) for p in sorted((root / "masks").iterdir())}


def _synth(*args: str) -> tuple[int, str]:
    """Exit status and stderr of ``crackseg synth ARGS`` run in this process."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(["synth", *args])
        except SystemExit as exit:
            code = exit.code
    return code, err.getvalue()


def test_default_samples_are_unchanged():
    """The drawing itself, before any encoder: image, crack mask, crack labels and distractors of six samples."""
    digest = hashlib.sha256()
    for index in range(6):
        sample = make_sample(np.random.default_rng([7, index]), 48, 64)
        for array in (sample.image, sample.mask, sample.labels, sample.distractors):
            digest.update(np.ascontiguousarray(array).tobytes())
    assert digest.hexdigest() == DEFAULT_ARRAYS_SHA256


def test_default_files_are_unchanged(tmp_path):
    """Byte for byte (should Pillow's JPEG or PNG encoder change, the sample test above still holds)."""
    write_dataset(tmp_path, count=6, size=(48, 64), seed=7, options=SynthOptions(truth=True))
    digest = hashlib.sha256()
    for name, data in _files(tmp_path).items():
        digest.update(name.encode())
        digest.update(data)
    assert digest.hexdigest() == DEFAULT_FILES_SHA256


def test_the_cli_default_share_is_the_library_default():
    synth_parser = build_parser()._subparsers._group_actions[0].choices["synth"]
    assert synth_parser.get_default("crack_free") == CRACK_FREE_FRACTION
    assert synth_parser.get_default("hard_negatives") is False


def test_hard_negatives_change_the_photos_but_not_one_mask_pixel(tmp_path):
    """The look-alikes draw from their own generator: cracks, masks, labels and truth.json stay as without them."""
    write_dataset(tmp_path / "plain", count=10, size=(64, 64), seed=4, options=SynthOptions(truth=True, crack_free=0.4))
    write_dataset(tmp_path / "hard", count=10, size=(64, 64), seed=4,
                  options=SynthOptions(truth=True, crack_free=0.4, hard_negatives=True))
    plain, hard = _files(tmp_path / "plain"), _files(tmp_path / "hard")
    assert plain.keys() == hard.keys()
    for name in plain:
        assert (plain[name] == hard[name]) == (not name.endswith(".jpg")), name
    masks = _masks(tmp_path / "hard")
    empty = [stem for stem, mask in masks.items() if not mask.any()]
    assert 0 < len(empty) < len(masks)
    assert json.loads((tmp_path / "hard" / "truth.json").read_text())[empty[0]] == []


def test_a_crack_across_a_look_alike_stays_crack_and_shows():
    """Masks are exactly the crack pixels; the cracks still darken what lies below them."""
    contrasts = []
    for index in range(12):
        plain = make_sample(np.random.default_rng([5, index]), 96, 96, crack_free=0.0)
        hard = make_sample(np.random.default_rng([5, index]), 96, 96, 0.0, np.random.default_rng([5, index, 1]))
        assert hard.look_alikes and set(hard.look_alikes) <= set(KINDS)
        assert np.array_equal(plain.mask, hard.mask) and np.array_equal(plain.labels, hard.labels)
        over = hard.mask & hard.distractors
        if over.sum() >= 10:
            grey = hard.image.mean(axis=2)
            ring = ndimage.binary_dilation(over, iterations=3) & ~ndimage.binary_dilation(hard.mask) & hard.distractors
            if ring.any():
                contrasts.append(grey[ring].mean() - grey[over].mean())
    assert len(contrasts) >= 3
    assert np.median(contrasts) > 5  # grey levels: darker than the look-alike around it


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_shows_where_the_mask_is_empty(kind, monkeypatch):
    """Every kind leaves a mark with contrast against its surroundings, on crack-free and cracked photos alike."""

    drawn = []  # the look-alike's own marks, apart from synth's usual joints and scratches

    def only(rng, texture, shade, marks):
        drawn.append(np.zeros_like(marks))
        draw_look_alike(kind, rng, texture, shade, drawn[-1])
        marks |= drawn[-1]
        return [kind]

    monkeypatch.setattr(synth, "add_look_alikes", only)
    contrasts = []
    for index in range(10):
        sample = make_sample(np.random.default_rng([8, index]), 96, 96, 0.5, np.random.default_rng([8, index, 2]))
        assert sample.look_alikes == [kind]
        near_crack = ndimage.binary_dilation(sample.mask, iterations=3)
        marks = drawn[-1] & ~near_crack
        ring = ndimage.binary_dilation(marks, iterations=4) & ~ndimage.binary_dilation(sample.distractors) & ~near_crack
        assert not sample.mask[marks].any()
        if marks.sum() >= 10 and ring.sum() >= 10:
            grey = sample.image.mean(axis=2)
            contrasts.append(abs(grey[marks].mean() - grey[ring].mean()))
    assert len(contrasts) >= 6, kind
    assert min(contrasts) > 5 and np.median(contrasts) > 12, (kind, contrasts)  # grey levels


@pytest.mark.parametrize("share", [0.0, 0.4, 0.8])
def test_the_crack_free_share_is_honoured(tmp_path, share):
    count = 200
    write_dataset(tmp_path, count=count, size=(48, 48), seed=2, options=SynthOptions(crack_free=share, hard_negatives=True))
    empty = sum(not mask.any() for mask in _masks(tmp_path).values())
    spread = 4 * math.sqrt(count * share * (1 - share)) + 6  # four binomial standard deviations, and now and then a crack wholly off the image
    assert abs(empty - count * share) <= spread, (empty, share)


def test_crack_free_1_with_hard_negatives_writes_look_alike_photos_with_empty_masks(tmp_path):
    assert _synth(str(tmp_path), "--count", "12", "--size", "64", "--crack-free", "1", "--hard-negatives") == (0, "")
    assert all(not mask.any() for mask in _masks(tmp_path).values())
    photos = [np.asarray(Image.open(p).convert("L"), np.float32) for p in sorted((tmp_path / "images").iterdir())]
    assert len(photos) == 12 and all(photo.std() > 3 for photo in photos)


def test_same_seed_gives_identical_bytes_whatever_the_workers(tmp_path):
    flags = ["--count", "6", "--size", "48x64", "--seed", "9", "--hard-negatives", "--crack-free", "0.5", "--truth"]
    assert _synth(str(tmp_path / "a"), *flags)[0] == 0
    assert _synth(str(tmp_path / "b"), *flags, "--workers", "2")[0] == 0
    assert _synth(str(tmp_path / "c"), *flags[:5], "10", *flags[6:])[0] == 0
    a, b, c = (_files(tmp_path / name) for name in "abc")
    assert len(a) == 19 and a == b  # 6 images, 6 masks, 6 truth labels, truth.json
    assert all(a[name] != c[name] for name in a if name.endswith(".jpg"))


@pytest.mark.parametrize("value", ["1.5", "-0.1", "nan", "half"])
def test_a_bad_crack_free_share_is_a_one_line_error(tmp_path, value):
    code, err = _synth(str(tmp_path / "out"), "--crack-free", value)
    assert code == 2 and err.count("\n") == 1 and err.startswith("crackseg: error: ") and "--crack-free" in err
    assert not (tmp_path / "out").exists()


def test_write_dataset_refuses_a_share_outside_0_1(tmp_path):
    with pytest.raises(InputError, match="--crack-free"):
        write_dataset(tmp_path, count=1, size=(32, 32), seed=0, options=SynthOptions(crack_free=1.2))
