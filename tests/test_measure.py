from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.spatial import cKDTree

from crackseg.measure import measure_cracks


def _stroke(shape, centreline: np.ndarray, width: float) -> np.ndarray:
    """Pixels whose centre lies closer than width / 2 to a dense centreline: area = length x width."""
    yy, xx = np.mgrid[0 : shape[0], 0 : shape[1]]
    distance, _ = cKDTree(centreline).query(np.stack([yy.ravel(), xx.ravel()], 1))
    return distance.reshape(shape) < width / 2


def _straight(width: float, length: float = 200.0) -> np.ndarray:
    offset = 0.0 if width % 2 else 0.5  # centre odd widths on a pixel row, even ones between rows
    x = np.linspace(50, 50 + length, 4000)
    return np.stack([np.full_like(x, 100 + offset), x], 1)


def _slanted(width: float, length: float = 200.0, degrees: float = 30.0) -> np.ndarray:
    t = np.linspace(0, length, 4000)
    return np.stack([40 + t * math.sin(math.radians(degrees)), 40 + t * math.cos(math.radians(degrees))], 1)


def _arc(width: float, length: float = 200.0, radius: float = 120.0) -> np.ndarray:
    theta = np.linspace(0, length / radius, 4000)
    return np.stack([150 + radius * np.sin(theta), 30 + radius * (1 - np.cos(theta))], 1)


@pytest.mark.parametrize("shape_of", [_straight, _slanted, _arc], ids=["straight", "slanted-30deg", "curved"])
@pytest.mark.parametrize("width", [3, 6, 10])
def test_length_and_widths_within_ten_percent(shape_of, width):
    mask = _stroke((320, 320), shape_of(width), width)
    (crack,) = measure_cracks(mask)
    visible_length = 200 + width  # the stroke's rounded ends add width / 2 at each end
    assert crack.length_px == pytest.approx(visible_length, rel=0.10)
    assert crack.mean_width_px == pytest.approx(width, rel=0.10)
    assert crack.max_width_px == pytest.approx(width, rel=0.10)
    assert crack.area_px == mask.sum()


def test_separate_cracks_are_measured_separately_largest_first():
    mask = _stroke((200, 300), _straight(3, 150), 3) | _stroke((200, 300), np.stack([np.full(500, 20.0), np.linspace(10, 60, 500)], 1), 5)
    cracks = measure_cracks(mask)
    assert len(cracks) == 2
    assert cracks[0].length_px == pytest.approx(153, rel=0.1) and cracks[1].length_px == pytest.approx(55, rel=0.1)
    assert cracks[0].area_px > cracks[1].area_px


def test_hand_made_masks():
    assert measure_cracks(np.zeros((10, 10), bool)) == []
    dot = np.zeros((10, 10), bool)
    dot[4, 4] = True
    (speck,) = measure_cracks(dot)
    assert speck.area_px == 1 and speck.length_px == 1 and speck.max_width_px == 1
    line = np.zeros((9, 30), bool)
    line[4, 5:25] = True  # one pixel wide, 20 long
    (thin,) = measure_cracks(line)
    assert thin.length_px == pytest.approx(20, abs=1.0) and thin.max_width_px == 1.0
    assert thin.bbox == (4, 5, 5, 25)
