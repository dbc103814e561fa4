from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy import ndimage
from scipy.cluster.hierarchy import DisjointSet
from scipy.spatial import cKDTree
from skimage.draw import line as draw_line
from skimage.morphology import thin

from crackseg.cracks import joins
from crackseg.cracks.measure import CORNER, DIAGONAL, ORTHOGONAL, CrackMeasure, CrackParts, crack_parts, find_cracks
from crackseg.cracks.pixel_sets import Pixels, thin_grown, thinning


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


@pytest.mark.parametrize("width", [3, 4, 6])
def test_the_mean_width_of_a_uniform_crack_along_the_pixel_grid_is_never_above_its_max(width):
    mask = np.zeros((40, 160), bool)
    mask[10 : 10 + width, 20:120] = True
    (crack,) = find_cracks(mask)[1]
    assert crack.max_width_px == width and width * 0.97 <= crack.mean_width_px <= crack.max_width_px


@pytest.mark.parametrize("degrees", [44.5, 45.0, 135.0])
@pytest.mark.parametrize("width", [3, 4, 6])
@pytest.mark.parametrize("offset", [(0.5, 0.0), (0.0, 0.5), (0.7, 0.2)], ids=str)
def test_a_crack_near_the_diagonal_keeps_its_length(degrees, width, offset):
    """Zhang and Suen's thinning (skimage's skeletonize) erases up to half of such a band; the length must not drop."""
    centreline = _slanted(width, 150.0, degrees) + offset + (0.0, 150.0 if degrees > 90 else 0.0)  # off the pixel centres
    (crack,) = find_cracks(_stroke((200, 200), centreline, width))[1]
    assert crack.length_px == pytest.approx(150 + width, rel=0.05)


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


@pytest.mark.parametrize("join_gap", [1e3, 1e20, math.inf])
def test_a_join_gap_beyond_the_image_joins_as_one_across_it_does(join_gap):
    mask = _broken_line([(60, 160)])
    (labels, cracks), (want_labels, want_cracks) = find_cracks(mask, join_gap), find_cracks(mask, 150.0)
    assert np.array_equal(labels, want_labels) and cracks == want_cracks and len(cracks) == 1


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




JOIN_GAP, MIN_LENGTH = 10.0, 10.0


def _segment(shape, start: np.ndarray, end: np.ndarray, width: float) -> np.ndarray:
    """Pixels whose centre lies closer than width / 2 to the segment from ``start`` to ``end`` (row, col)."""
    offset = np.moveaxis(np.mgrid[0 : shape[0], 0 : shape[1]], 0, -1) - start
    along = end - start
    t = np.clip(offset @ along / (along @ along), 0.0, 1.0)
    return np.linalg.norm(offset - t[..., None] * along, axis=-1) < width / 2


def _random_mask(seed: int) -> np.ndarray:
    """Strokes of several widths (some from beyond the image's border, some branching off another),
    cut across by gaps a little under and over JOIN_GAP, and specks under MIN_LENGTH."""
    rng = np.random.default_rng(seed)
    shape = (int(rng.integers(200, 300)), int(rng.integers(200, 300)))
    mask = np.zeros(shape, bool)
    starts = []
    for _ in range(rng.integers(2, 6)):
        start = starts[-1] if starts and rng.random() < 0.3 else rng.uniform(-20, np.add(shape, 20))
        end = rng.uniform(-20, np.add(shape, 20))
        if rng.random() < 0.3:  # along an edge of the image, touching it
            side = int(rng.integers(0, 2))
            start[side], end[side] = rng.uniform(-2, 3, 2) if rng.random() < 0.5 else shape[side] - rng.uniform(-2, 3, 2)
        mask |= _segment(shape, start, end, rng.choice([1.2, 2.0, 3.0, 4.5, 6.0, 9.0, 13.0]))
        starts.append((start + end) / 2)
    for _ in range(rng.integers(1, 4)):
        at, size = int(rng.integers(0, min(shape))), int(JOIN_GAP) + int(rng.integers(-3, 3))
        if rng.random() < 0.5:
            mask[:, at : at + size] = False
        else:
            mask[at : at + size, :] = False
    for _ in range(rng.integers(0, 6)):
        row, col = rng.integers(0, shape)
        mask[row : row + rng.integers(1, 4), col : col + rng.integers(1, 4)] = True
    return mask


def _assert_same_parts(got: CrackParts, want: CrackParts) -> None:
    """Every sum, and the images of the labels and the skeleton in place of the pixel sets they are made from."""
    held = {"pixels", "pixel_labels", "skeleton_pixels"}
    for name in [field.name for field in dataclasses.fields(CrackParts) if field.name not in held] + ["labels", "skeleton"]:
        a, b = getattr(got, name), getattr(want, name)
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and np.array_equal(a, b), name
        else:
            assert a == b, name


def test_find_cracks_equals_the_whole_image_computation_bit_for_bit():
    joined = 0
    for seed in range(30):
        mask = _random_mask(seed)
        for join_gap in (0.0, JOIN_GAP):
            labels, cracks = find_cracks(mask, join_gap, MIN_LENGTH)
            want_labels, want_cracks = _whole_image_cracks(mask, join_gap, MIN_LENGTH)
            assert labels.dtype == np.int32 and np.array_equal(labels, want_labels), (seed, join_gap)
            assert cracks == want_cracks, (seed, join_gap)  # ids, order, and every float to the last bit
            joined += sum(crack.fragments > 1 for crack in cracks)
        band = slice(int(mask.shape[0] * 0.3), int(mask.shape[0] * 0.7))  # as crackseg.prediction.streamed measures a band of rows
        _assert_same_parts(crack_parts(mask, JOIN_GAP, band), _whole_image_parts(mask, JOIN_GAP, band))
    assert joined >= 10  # the masks do have pieces joined across gaps


@pytest.mark.parametrize("name", ["empty", "dot", "full", "full-but-one", "one-row", "noise", "blob"])
def test_degenerate_masks_equal_the_whole_image_computation(name):
    """Blob: pixels far deeper than a crack's (measured through the k-d tree), touching the image's edge."""
    rows, cols = np.mgrid[:70, :90]
    mask = {"empty": np.zeros((7, 9), bool), "dot": np.ones((1, 1), bool), "full": np.ones((6, 8), bool),
            "full-but-one": np.arange(99).reshape(9, 11) != 49, "one-row": np.array([[1, 1, 0, 1, 1, 1, 0, 1]], bool),
            "noise": np.random.default_rng(0).random((60, 80)) > 0.4,
            "blob": ((rows - 40) ** 2 + (cols - 30) ** 2 < 27 ** 2) | (np.random.default_rng(1).random((70, 90)) > 0.9)}[name]
    for join_gap in (0.0, JOIN_GAP):
        labels, cracks = find_cracks(mask, join_gap, 3)
        want_labels, want_cracks = _whole_image_cracks(mask, join_gap, 3)
        assert np.array_equal(labels, want_labels) and cracks == want_cracks
        _assert_same_parts(crack_parts(mask, join_gap, slice(2, 5)), _whole_image_parts(mask, join_gap, slice(2, 5)))


@pytest.mark.parametrize("shape", [(5, 40), (20, 30), (64, 64)])
def test_a_mask_of_crack_alone_is_measured_within_the_image(shape):
    """No background to measure a width to: the image's edge bounds it, never the distance to a pixel past a corner."""
    (crack,) = find_cracks(np.ones(shape, bool))[1]
    assert crack.max_width_px <= min(shape) and crack.mean_width_px <= min(shape) and crack.length_px <= max(shape)


@pytest.mark.parametrize("flip", [(1, 1), (1, -1), (-1, 1), (-1, -1)])
def test_a_gap_to_two_equally_near_targets_is_bridged_as_before(flip):
    """A crack ends in front of a bracket whose two arms are equally far: the bridge goes to the one the
    whole-image computation chose (the last of the ties that scipy's k-d tree of all skeleton pixels lists)."""
    for gap, arm in ((4, 4), (5, 2), (5, 4), (6, 2), (6, 3), (6, 4), (7, 3)):
        mask = np.zeros((60, 90), bool)
        mask[30, 5:40] = True  # the crack, ending at column 39
        mask[30 - arm, 39 + gap : 70] = mask[30 + arm, 39 + gap : 80] = True  # the bracket's arms
        mask[30 - arm : 30 + arm + 1, 70] = True
        mask = mask[:: flip[0], :: flip[1]]
        _assert_same_parts(crack_parts(mask, JOIN_GAP), _whole_image_parts(mask, JOIN_GAP))


@pytest.mark.parametrize("degrees, bridged", [(30.0, None), (29.0, True), (31.0, False)])  # None: handed back
def test_an_angle_within_rounding_of_30_degrees_is_left_to_numpys_dot_product(degrees, bridged):
    """The compiled search decides an angle only where rounding cannot: exactly at 30 degrees it hands the end back
    (the k-d tree path then takes the dot product as NumPy does); inside it bridges, outside it does not."""
    points = np.array([[5, 5], [5, 6]])  # an end, and a pixel of another piece one step along the columns
    owner, depth = np.array([1, 2]), np.array([1.0, 1.0])
    turn = math.radians(degrees)
    direction = np.array([[math.sin(turn), math.cos(turn)]]) if degrees != 30.0 else np.array([[0.5, joins._COS_30]])
    target, gaps = np.full(1, -1, np.int64), np.zeros(1)
    head = joins._targets((points, owner, depth), np.array([0]), direction, JOIN_GAP, (*joins._grid(points, 16, (20, 20)), 16),
                          (np.arange(3), target, gaps), 0)
    assert head == (0 if bridged is None else 1)
    assert target[0] == (1 if bridged else -1)


def test_thinning_a_grown_set_from_the_base_history_equals_thinning_it_whole():
    """Bridges, strokes as wide as the cracks and specks added to a mask: thinning them from the thinning of the mask
    gives scikit-image's thin of the whole, whatever the additions change far from themselves."""
    for seed in range(20):
        rng = np.random.default_rng(seed)
        mask = _random_mask(seed)
        grown = mask.copy()
        for _ in range(rng.integers(1, 4)):
            grown |= _segment(mask.shape, rng.uniform(0, mask.shape), rng.uniform(0, mask.shape), rng.choice([1.0, 3.0, 9.0]))
        rows, cols = rng.integers(0, mask.shape, (20, 2)).T
        grown[rows, cols] = True
        base = Pixels.of(mask)
        _, removed_at = thinning(base)
        assert np.array_equal(thin_grown(Pixels.of(grown), base, removed_at).image(True, bool), thin(grown)), seed


def test_thinning_a_set_that_lacks_pixels_of_the_base_is_refused():
    mask = _broken_line([])
    base = Pixels.of(mask)
    _, removed_at = thinning(base)
    shrunk = mask.copy()
    shrunk[60, 100] = False
    with pytest.raises(ValueError, match="lacks pixels of the base"):
        thin_grown(Pixels.of(shrunk), base, removed_at)


def test_a_crack_on_a_large_photo_is_measured_as_in_its_own_box():
    rng = np.random.default_rng(1)
    crack = _stroke((120, 200), np.linspace((20, 15), (100, 185), 800), 5) & (rng.random((120, 200)) > 0.05)
    photo = np.zeros((3000, 4000), bool)
    photo[1700:1820, 2500:2700] = crack
    labels, cracks = find_cracks(photo, JOIN_GAP, MIN_LENGTH)
    want_labels, want_cracks = find_cracks(crack, JOIN_GAP, MIN_LENGTH)
    assert np.array_equal(labels[1700:1820, 2500:2700], want_labels) and labels.sum() == want_labels.sum()
    assert cracks == [dataclasses.replace(c, bbox=(c.bbox[0] + 1700, c.bbox[1] + 2500, c.bbox[2] + 1700, c.bbox[3] + 2500),
                                          anchor=(c.anchor[0] + 1700, c.anchor[1] + 2500)) for c in want_cracks]


# The whole-image computation that find_cracks and crack_parts did before they worked on the crack
# pixels alone, kept as it was: what they must still give, bit for bit.


def _whole_image_cracks(mask: np.ndarray, join_gap: float, min_length: float) -> tuple[np.ndarray, list[CrackMeasure]]:
    parts = _whole_image_parts(mask, join_gap)
    found = []
    for number in range(1, len(parts.area)):
        if parts.area[number] == 0:
            continue
        measure = parts.measure(number, number)
        if measure.length_px >= min_length:
            found.append((number, measure))
    found.sort(key=lambda item: (-item[1].length_px, item[0]))
    renumber = np.zeros(len(parts.area), np.int32)
    cracks = []
    for new_id, (old, measure) in enumerate(found, 1):
        renumber[old] = new_id
        cracks.append(dataclasses.replace(measure, id=new_id))
    return np.where(mask, renumber[parts.labels], 0).astype(np.int32), cracks


def _whole_image_distance(mask: np.ndarray) -> np.ndarray:
    """To the nearest background pixel; in a mask of crack alone, to the nearest pixel outside the image."""
    if not mask.any():
        return np.zeros(mask.shape)
    return ndimage.distance_transform_edt(np.pad(mask, 1))[1:-1, 1:-1] if mask.all() else ndimage.distance_transform_edt(mask)


def _whole_image_parts(mask: np.ndarray, join_gap: float = 0.0, counted: slice = slice(None)) -> CrackParts:
    mask = np.asarray(mask, bool)
    pieces, count = ndimage.label(mask, _EIGHT)
    distance = _whole_image_distance(mask)
    rows = np.zeros(mask.shape[0], bool)
    rows[counted] = True
    joined, bridges = _whole_image_join(mask, pieces, distance, join_gap) if join_gap > 0 and count else (mask, [])
    labels, total = ndimage.label(joined, _EIGHT) if bridges else (pieces, count)
    mine = np.where(rows[:, None], labels, 0)
    skeleton = thin(joined) if count else np.zeros(mask.shape, bool)
    length = np.concatenate([[0.0], _whole_image_chain_length(skeleton, mine, total)])
    ends = _whole_image_end_points(skeleton)
    length += np.bincount(mine[ends], weights=distance[ends] - 0.5, minlength=total + 1)
    gap = np.zeros(total + 1)
    for (row, col), size in bridges:
        if rows[row]:
            gap[labels[row, col]] += size
    max_width = np.concatenate([[0.0], _whole_image_max_width(np.where(mask, distance, 0.0), skeleton & mask, ends, mine, total)])
    box = np.tile(np.array([mask.shape[0], mask.shape[1], 0, 0]), (total + 1, 1))
    for number, found in enumerate(ndimage.find_objects(mine), 1):
        if found is not None:
            box[number] = (found[0].start, found[1].start, found[0].stop, found[1].stop)
    first_rows = np.array([found[0].start for found in ndimage.find_objects(pieces)], int)
    owners = ndimage.maximum(labels, pieces, np.arange(1, count + 1)).astype(int) if count else np.zeros(0, int)
    fragments = np.bincount(owners[rows[first_rows]], minlength=total + 1)
    return CrackParts(length, gap, np.bincount(mine[mask], minlength=total + 1), max_width, box, fragments,
                      _whole_image_anchors(skeleton, labels, total), Pixels.of(labels > 0), labels[labels > 0], Pixels.of(skeleton))


_EIGHT = np.ones((3, 3), bool)


def _whole_image_join(mask, pieces, distance, join_gap):
    skeleton = thin(mask)
    points = np.argwhere(skeleton)
    owner = pieces[skeleton]
    tree = cKDTree(points)
    reach = join_gap + 2 * distance.max()
    joined, bridges = mask.copy(), []
    joined_pieces = DisjointSet(range(pieces.max() + 1))
    for end in np.argwhere(_whole_image_end_points(skeleton)):
        piece = pieces[tuple(end)]
        near = [i for i in tree.query_ball_point(end, 10.0) if owner[i] == piece]
        tip = [i for i in near if np.hypot(*(points[i] - end)) <= 1.5]
        direction = points[tip].mean(axis=0) - points[near].mean(axis=0)
        if np.hypot(*direction) < 0.5:
            continue
        direction /= np.hypot(*direction)
        best, best_gap = None, join_gap
        for i in tree.query_ball_point(end, reach):
            if joined_pieces.connected(owner[i], piece):
                continue
            step = points[i] - end
            span = np.hypot(*step)
            gap = span - (distance[tuple(end)] - 0.5) - (distance[tuple(points[i])] - 0.5)
            if gap <= best_gap and step @ direction >= span * math.cos(math.radians(30)):
                best, best_gap = points[i], gap
        if best is not None:
            joined_pieces.merge(pieces[tuple(best)], piece)
            rows, cols = draw_line(int(end[0]), int(end[1]), int(best[0]), int(best[1]))
            joined[rows, cols] = True
            bridges.append(((int(end[0]), int(end[1])), max(best_gap, 0.0)))
    return joined, bridges


def _whole_image_anchors(skeleton, labels, count):
    points = np.argwhere(skeleton & (labels > 0))
    owners = labels[skeleton & (labels > 0)]
    order = np.argsort(owners, kind="stable")
    points, owners = points[order], owners[order]
    starts = np.searchsorted(owners, np.arange(1, count + 1))
    ends = np.searchsorted(owners, np.arange(1, count + 1), side="right")
    return {label: tuple(int(v) for v in points[(a + b) // 2]) for label, a, b in zip(range(1, count + 1), starts, ends) if b > a}


def _whole_image_chain_length(skeleton, labels, count):
    s = skeleton
    height, width = s.shape
    directions = np.zeros((height, width), np.uint8)
    links = {
        "E": (s[:, :-1] & s[:, 1:], (slice(None), slice(None, -1)), (slice(None), slice(1, None)), 0, 4),
        "S": (s[:-1, :] & s[1:, :], (slice(None, -1), slice(None)), (slice(1, None), slice(None)), 2, 6),
        "SE": (s[:-1, :-1] & s[1:, 1:] & ~s[:-1, 1:] & ~s[1:, :-1], (slice(None, -1), slice(None, -1)), (slice(1, None), slice(1, None)), 1, 5),
        "SW": (s[:-1, 1:] & s[1:, :-1] & ~s[:-1, :-1] & ~s[1:, 1:], (slice(None, -1), slice(1, None)), (slice(1, None), slice(None, -1)), 3, 7),
    }
    total = np.zeros(count + 1)
    for name, (present, first, second, bit, back) in links.items():
        step = ORTHOGONAL if name in ("E", "S") else DIAGONAL
        total += step * np.bincount(labels[first][present], minlength=count + 1)
        directions[first] |= present.astype(np.uint8) << bit
        directions[second] |= present.astype(np.uint8) << back
    degree = np.unpackbits(directions[..., None], axis=-1).sum(axis=-1)
    collinear = np.isin(directions, [0b00010001, 0b00100010, 0b01000100, 0b10001000])
    corners = s & (degree == 2) & ~collinear
    total -= CORNER * np.bincount(labels[corners], minlength=count + 1)
    return total[1:]


def _whole_image_max_width(distance, skeleton, ends, labels, count):
    points = np.argwhere(skeleton)
    owner = labels[skeleton]
    widths = _whole_image_full_width(distance, skeleton)[skeleton]
    plain = 2.0 * distance[skeleton] - 1.0
    result = np.zeros(count + 1)
    np.maximum.at(result, owner, plain)
    end_points = np.argwhere(ends)
    if len(end_points):
        to_end, _ = cKDTree(end_points).query(points)
        away = to_end > distance[skeleton] + 1
        np.maximum.at(result, owner[away], widths[away])
    else:
        np.maximum.at(result, owner, widths)
    return result[1:]


def _whole_image_end_points(skeleton):
    neighbours = ndimage.convolve(skeleton.astype(np.uint8), _EIGHT.astype(np.uint8), mode="constant") - 1
    return skeleton & (neighbours == 1)


def _whole_image_full_width(distance, skeleton):
    ridge_twin = ndimage.maximum_filter(np.where(skeleton, 0.0, distance), footprint=_EIGHT)
    even = np.isclose(ridge_twin, distance) & (distance > 0)
    return 2.0 * distance - 1.0 + even
