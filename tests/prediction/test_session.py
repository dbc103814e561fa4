"""A session's mask is predict's mask for the same picture, whether it is handed a PIL image or pixels."""

from __future__ import annotations


import numpy as np
import pytest
from conftest import pavement, predict_cli
from PIL import Image

from crackseg.core.errors import InputError
from crackseg.prediction.session import PredictionSession


def test_the_mask_is_predicts_mask(tmp_path, checkpoint):
    photo = tmp_path / "wall.png"
    Image.fromarray(pavement(96, 160, seed=3).transpose(1, 2, 0)).save(photo)
    session = PredictionSession(checkpoint)
    threshold = float(np.median(session.probabilities(Image.open(photo))))  # about half the pixels on each side
    assert predict_cli("--checkpoint", checkpoint, photo, "--out", tmp_path / "out", "--threshold", threshold) == 0
    expected = np.asarray(Image.open(tmp_path / "out" / "masks" / "wall.png")) > 0
    tuned = PredictionSession(checkpoint, threshold=threshold)
    assert 0.2 < expected.mean() < 0.8
    assert np.array_equal(tuned.mask(Image.open(photo)), expected)
    assert np.array_equal(tuned.mask(np.asarray(Image.open(photo).convert("RGB"))), expected)


def test_upright_like_predict_and_bad_pixels_refused(tmp_path, checkpoint):
    stored = Image.fromarray(pavement(64, 96, seed=1).transpose(1, 2, 0))
    exif = stored.getexif()
    exif[0x0112] = 6  # shown rotated a quarter turn: 96 tall, 64 wide
    stored.save(tmp_path / "turned.jpg", exif=exif)
    session = PredictionSession(checkpoint)
    assert session.mask(Image.open(tmp_path / "turned.jpg")).shape == (96, 64)
    with pytest.raises(InputError, match="uint8 RGB"):
        session.mask(np.zeros((8, 8), np.uint8))
    with pytest.raises(InputError, match="threshold"):
        PredictionSession(checkpoint, threshold=2.0)
