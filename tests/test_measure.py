from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.spatial import cKDTree

from crackseg.measure import WidthClasses, find_cracks


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
    (crack,) = find_cracks(mask)[1]
    visible_length = 200 + width  # the stroke's rounded ends add width / 2 at each end
    assert crack.length_px == pytest.approx(visible_length, rel=0.10)
    assert crack.mean_width_px == pytest.approx(width, rel=0.10)
    assert crack.max_width_px == pytest.approx(width, rel=0.10)
    assert crack.area_px == mask.sum()


def test_separate_cracks_are_measured_separately_longest_first():
    mask = _stroke((200, 300), _straight(3, 150), 3) | _stroke((200, 300), np.stack([np.full(500, 20.0), np.linspace(10, 60, 500)], 1), 5)
    labels, cracks = find_cracks(mask)
    assert len(cracks) == 2 and [c.id for c in cracks] == [1, 2]
    assert cracks[0].length_px == pytest.approx(153, rel=0.1) and cracks[1].length_px == pytest.approx(55, rel=0.1)
    assert cracks[0].area_px > cracks[1].area_px
    assert (labels == 1).sum() == cracks[0].area_px and (labels == 2).sum() == cracks[1].area_px
    for crack in cracks:
        assert labels[crack.anchor] == crack.id  # the id is written on the crack itself


def test_hand_made_masks():
    assert find_cracks(np.zeros((10, 10), bool))[1] == []
    dot = np.zeros((10, 10), bool)
    dot[4, 4] = True
    (speck,) = find_cracks(dot)[1]
    assert speck.area_px == 1 and speck.length_px == 1 and speck.max_width_px == 1
    line = np.zeros((9, 30), bool)
    line[4, 5:25] = True  # one pixel wide, 20 long
    (thin,) = find_cracks(line)[1]
    assert thin.length_px == pytest.approx(20, abs=1.0) and thin.max_width_px == 1.0
    assert thin.bbox == (4, 5, 5, 25)



def _broken_line(gaps: list[tuple[int, int]], width: int = 3, length: int = 220) -> np.ndarray:
    """A straight crack 3 px wide along row 60, with the column ranges ``gaps`` left out."""
    mask = np.zeros((120, length + 40), bool)
    mask[60 - width // 2 : 60 + width // 2 + 1, 20 : 20 + length] = True
    for start, stop in gaps:
        mask[:, start:stop] = False
    return mask


def test_pieces_of_one_crack_are_joined_across_short_gaps_along_their_direction():
    mask = _broken_line([(70, 76), (150, 158)])  # three pieces, gaps of 6 and 8 px
    assert len(find_cracks(mask)[1]) == 3
    labels, (crack,) = find_cracks(mask, join_gap=10)
    assert crack.fragments == 3 and crack.length_px == pytest.approx(220, rel=0.05)
    assert crack.mean_width_px == pytest.approx(3, rel=0.1) and crack.area_px == mask.sum()
    assert set(np.unique(labels[mask])) == {1} and not labels[~mask].any()  # the bridges are not mask pixels
    assert len(find_cracks(mask, join_gap=7)[1]) == 2  # the 8 px gap stays open


def test_joining_follows_the_crack_not_whatever_lies_near():
    mask = _broken_line([(140, 260)], length=220)  # one piece ending at column 140
    mask[70:100, 146:149] = True  # a separate mark beside the end, across the crack's direction
    mask[20:40, 120:123] = True  # and one beside the crack, 20 px away
    _, cracks = find_cracks(mask, join_gap=15)
    assert len(cracks) == 3 and all(c.fragments == 1 for c in cracks)


def test_specks_under_the_minimum_length_are_dropped():
    mask = _broken_line([])
    mask[10:13, 10:14] = True  # a 4 px speck
    labels, cracks = find_cracks(mask, min_length=10)
    assert len(cracks) == 1 and not labels[10:13, 10:14].any()


def test_width_classes():
    bre = WidthClasses.parse("bre251")
    assert [bre.classify(w) for w in (0.05, 0.1, 0.5, 1.0, 3, 10, 20, 40)] == ["0", "0", "1", "1", "2", "3", "4", "5"]
    aci = WidthClasses.parse("aci224")
    assert aci.labels[0] == "<=0.1" and aci.classify(0.16) == "0.15-0.18" and aci.narrowest_band_mm() == pytest.approx(0.03)
    custom = WidthClasses.parse("0.1,0.2,0.3,1.0")
    assert custom.labels == ("<=0.1", "0.1-0.2", "0.2-0.3", "0.3-1", ">1") and custom.classify(2.0) == ">1"
    for bad in ("0.3,0.2", "abc", "-1,2", ""):
        with pytest.raises(ValueError):
            WidthClasses.parse(bad)
