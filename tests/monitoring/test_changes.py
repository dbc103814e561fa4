from __future__ import annotations

import math

import numpy as np
import pytest
from skimage.morphology import thin

from crackseg.monitoring.changes import GONE, LONGER, LONGER_MIN_PX, MERGED, NEW, NOT_SEEN, SHORTER, SPLIT, UNCHANGED, WIDER, match
from crackseg.monitoring.date_cracks import measure_date
from crackseg.cracks.measure import find_cracks
from crackseg.monitoring.registration import Alignment

SIZE = (320, 320)
JOIN_GAP, MIN_LENGTH = 10.0, 10.0  # predict's defaults

# BEFORE cracks: polyline vertices (row, col) and width, in BEFORE px
A = ([(40, 30), (90, 150), (70, 200)], 3)
B = ([(150, 30), (160, 150)], 3)
C = ([(40, 260), (200, 270)], 3)
D = ([(230, 40), (280, 120)], 4)
B_EXTENSION = 40.0  # BEFORE px, along B's own direction
C_WIDTH_AFTER = 6.0  # AFTER px
F = ([(250, 200), (290, 290)], 3)  # new, drawn in AFTER px


def _similarity(degrees: float, scale: float, shift: tuple[float, float]) -> Alignment:
    """Rotation and scale about the image centre, then a shift (col, row), as BEFORE (col, row) -> AFTER (col, row)."""
    c, s = scale * math.cos(math.radians(degrees)), scale * math.sin(math.radians(degrees))
    centre = np.array([SIZE[1] / 2, SIZE[0] / 2])
    linear = np.array([[c, -s], [s, c]])
    matrix = np.eye(3)
    matrix[:2, :2] = linear
    matrix[:2, 2] = centre - linear @ centre + shift
    return Alignment(matrix=matrix, method="orb-similarity")


VIEW = _similarity(3.0, 1.04, (6.0, -4.0))


def _draw(strokes) -> np.ndarray:
    """A mask of the pixels whose centre lies closer than width / 2 to a polyline ((N, 2) row, col vertices)."""
    mask = np.zeros(SIZE, bool)
    for vertices, width in strokes:
        vertices = np.asarray(vertices, float)
        for start, stop in zip(vertices, vertices[1:]):
            low = np.maximum(np.floor(np.minimum(start, stop) - width), 0).astype(int)
            high = np.minimum(np.ceil(np.maximum(start, stop) + width), SIZE).astype(int)
            yy, xx = np.mgrid[low[0] : high[0], low[1] : high[1]]
            along = stop - start
            t = np.clip(((yy - start[0]) * along[0] + (xx - start[1]) * along[1]) / (along @ along), 0, 1)
            distance = np.hypot(yy - start[0] - t * along[0], xx - start[1] - t * along[1])
            mask[low[0] : high[0], low[1] : high[1]] |= distance < width / 2
    return mask


def _disc(centre, radius: float) -> np.ndarray:
    """A mask of the pixels whose centre lies within ``radius`` of ``centre`` (row, col): a blob-shaped crack."""
    rows, cols = np.indices(SIZE)
    return (rows - centre[0]) ** 2 + (cols - centre[1]) ** 2 <= radius**2


def _before(*cracks) -> np.ndarray:
    return _draw(cracks)


def _after(*cracks, alignment: Alignment = VIEW) -> np.ndarray:
    """BEFORE cracks drawn again where the alignment puts them (a similarity maps segments to segments), widths scaled."""
    scale = float(alignment.scale_at([(160.0, 160.0)])[0])
    return _draw([(alignment.map_points(vertices), width * scale) for vertices, width in cracks])


def _extended(crack, extra: float):
    vertices, width = crack
    start, stop = np.array(vertices[-2], float), np.array(vertices[-1], float)
    direction = (stop - start) / np.hypot(*(stop - start))
    return [*vertices, tuple(stop + extra * direction)], width


def _measure(mask):
    return measure_date(mask, JOIN_GAP, MIN_LENGTH)


def _crack_at(date, mask) -> int:
    """The id of the one crack of ``date`` that covers most of ``mask``'s pixels."""
    ids, counts = np.unique(date.labels[mask & (date.labels > 0)], return_counts=True)
    return int(ids[np.argmax(counts)])


def test_measure_date_is_find_cracks_with_skeleton_points():
    mask = np.zeros(SIZE, bool)
    mask[20:300, 10:310] = _before(A, B, C, D)[:280, :300]  # cracks away from the origin: the measured box is shifted
    mask |= _draw([([(200, 316), (319, 316)], 5)])  # and one on the image's edge
    date = _measure(mask)
    labels, cracks = find_cracks(mask, JOIN_GAP, MIN_LENGTH)
    assert date.cracks == cracks and len(cracks) == 5
    np.testing.assert_array_equal(date.labels, labels)
    skeleton = thin(labels > 0)
    for crack in cracks:
        np.testing.assert_array_equal(date.points[crack.id], np.argwhere(skeleton & (labels == crack.id)))


def test_changes_between_two_views_of_one_wall():
    before = _measure(_before(A, B, C, D))
    after_mask = _after(A, _extended(B, B_EXTENSION)) | _draw([(VIEW.map_points(C[0]), C_WIDTH_AFTER), F])
    after = _measure(after_mask)
    before_ids = {name: _crack_at(before, _before(crack)) for name, crack in zip("ABCD", (A, B, C, D))}
    after_ids = {name: _crack_at(after, _after(crack)) for name, crack in zip("ABC", (A, B, C))}
    after_ids["F"] = _crack_at(after, _before(F))
    changes = match(before, after, VIEW)

    by_before = {c.before.id: c for c in changes if c.before}
    statuses = {name: by_before[before_ids[name]].status for name in "ABCD"}
    assert statuses == {"A": UNCHANGED, "B": LONGER, "C": WIDER, "D": GONE}
    (f,) = (c for c in changes if c.status == NEW)
    assert f.after.id == after_ids["F"] and f.before is None and f.scale == pytest.approx(1.04) and f.box_after == f.after.bbox
    assert len(changes) == 5
    for name in "ABC":
        assert by_before[before_ids[name]].after.id == after_ids[name]
        assert by_before[before_ids[name]].scale == pytest.approx(1.04)

    a, b, c, d = (by_before[before_ids[name]] for name in "ABCD")
    assert abs(a.length_growth_px) < 0.04 * a.after.length_px and abs(a.mean_width_growth_px) < 1.0
    assert b.length_growth_px == pytest.approx(B_EXTENSION * 1.04, rel=0.15)
    assert c.mean_width_growth_px == pytest.approx(C_WIDTH_AFTER - C[1] * 1.04, abs=1.0)
    drawn = np.argwhere(_after(D))  # where D would be had it stayed
    expected = (*drawn.min(axis=0), *(drawn.max(axis=0) + 1))
    assert d.box_after[:2] <= expected[:2] and d.box_after[2:] >= expected[2:]  # the mapped box holds the crack
    assert np.abs(np.subtract(d.box_after, expected)).max() <= 6  # and is not much larger
    assert d.after is None and d.length_growth_px is None
    assert [c.status for c in changes[-1:]] == [GONE]  # gone rows come last


@pytest.mark.parametrize("degrees, shift", [(0.0, (0.3, 0.7)), (-3.0, (-5.5, 2.25)), (3.0, (6.0, -4.0))])
def test_an_untouched_crack_seen_again_is_unchanged(degrees, shift):
    view = _similarity(degrees, 1.04, shift)
    cracks = (A, B, C, D)
    changes = match(_measure(_before(*cracks)), _measure(_after(*cracks, alignment=view)), view)
    assert [c.status for c in changes] == [UNCHANGED] * 4


def test_a_gap_closed_by_growth_merges_and_a_crack_cut_in_two_splits():
    left, right, whole = ([(100, 40), (104, 140)], 3), ([(104, 160), (108, 260)], 3), ([(100, 40), (104, 140), (108, 260)], 3)
    merged = match(_measure(_before(left, right)), _measure(_after(whole)), VIEW)
    assert [c.status for c in merged] == [MERGED, MERGED]
    assert merged[0].after.id == merged[1].after.id and {c.before.id for c in merged} == {1, 2}
    assert merged[0].length_growth_px == pytest.approx(20 * 1.04, abs=12)  # the gap, within its caps and ends

    split = match(_measure(_before(whole)), _measure(_after(left, right)), VIEW)
    assert [c.status for c in split] == [SPLIT, SPLIT]
    assert split[0].before.id == split[1].before.id and [c.after.id for c in split] == [1, 2]


def test_many_to_many_gives_one_row_per_link_with_the_groups_status():
    """Before: 1 and 2 in line with a gap; after: the gap closed and a piece of 1 cut off on its other end,
    so the group is as long as before: neither joined by growth nor shortened, one crack broken elsewhere."""
    before = _measure(_before(([(100, 40), (100, 140)], 3), ([(100, 160), (100, 240)], 3)))
    after = _measure(_after(([(100, 40), (100, 70)], 3), ([(100, 85), (100, 240)], 3)))
    changes = match(before, after, VIEW)
    assert [(c.status, c.before.id, c.after.id) for c in changes] == [(UNCHANGED, 1, 1), (UNCHANGED, 2, 1), (UNCHANGED, 1, 2)]


def test_a_crack_the_other_date_breaks_at_a_faint_stretch_is_not_split():
    """A 12 px stretch missing from one date's mask (beyond the 10 px join gap) is the segmentation, not a repair."""
    whole, broken = ([(100, 40), (100, 260)], 3), (([(100, 40), (100, 144)], 3), ([(100, 156), (100, 260)], 3))
    assert {c.status for c in match(_measure(_before(whole)), _measure(_after(*broken)), VIEW)} == {UNCHANGED}
    assert {c.status for c in match(_measure(_before(*broken)), _measure(_after(whole)), VIEW)} == {UNCHANGED}


@pytest.mark.parametrize("old, beside", [
    (([(100, 40), (110, 260)], 3), ([(108, 60), (118, 240)], 3)),  # 8 px away, edge to edge 5 px
    (([(95, 45), (80, 245)], 3), ([(102.5, 62), (89.3, 228)], 3)),  # 7.5 px away, the other way up
    (([(104, 35), (104, 215)], 3), ([(113, 50), (113, 200)], 3)),  # 9 px away, along the rows
])
def test_a_new_crack_beside_an_old_one_is_new(old, beside):
    changes = match(_measure(_before(old)), _measure(_after(old, beside)), VIEW)
    assert sorted(c.status for c in changes) == [NEW, UNCHANGED]


def test_identical_masks_are_unchanged_with_no_growth():
    date = _measure(_before(A, B, C, D))
    changes = match(date, date, Alignment())
    assert [c.status for c in changes] == [UNCHANGED] * 4
    assert [c.before.id for c in changes] == [c.after.id for c in changes] == [1, 2, 3, 4]
    for change in changes:
        assert (change.length_growth_px, change.mean_width_growth_px, change.max_width_growth_px) == (0.0, 0.0, 0.0)
        assert change.overlap == 1.0 and change.scale == 1.0 and change.box_after == change.before.bbox


def test_empty_masks_on_either_side():
    empty = _measure(np.zeros(SIZE, bool))
    full = _measure(_before(A, B, C))
    assert empty.cracks == [] and empty.points == {} and not empty.labels.any()
    assert [(c.status, c.after.id) for c in match(empty, full, VIEW)] == [(NEW, 1), (NEW, 2), (NEW, 3)]
    gone = match(full, empty, VIEW)
    assert [(c.status, c.before.id) for c in gone] == [(GONE, 1), (GONE, 2), (GONE, 3)]
    assert all(c.scale == pytest.approx(1.04) for c in gone)
    assert match(empty, empty, VIEW) == []


SHIFTED = _similarity(2.0, 1.0, (-100.0, 0.0))  # the camera moved 100 px to the right (and turned 2 degrees)


def test_cracks_outside_the_view_both_dates_share_are_not_seen():
    """P leaves the view and Q comes into it: neither is gone nor new. S runs out of the AFTER frame, so AFTER sees
    60 px less of it: the frame cut it, it did not get shorter, and its growth counts over what both dates see."""
    p, r, s = ([(60, 20), (120, 70)], 3), ([(150, 150), (200, 300)], 3), ([(260, 40), (270, 200)], 3)
    q = ([(200, 250), (280, 300)], 3)  # AFTER px: 350-400 px right of BEFORE's left edge
    before = _measure(_before(p, r, s))
    after = _measure(_after(r, s, alignment=SHIFTED) | _draw([q]))
    changes = match(before, after, SHIFTED)
    by_before = {c.before.id: c for c in changes if c.before}
    by_after = {c.after.id: c for c in changes if c.after}
    out, come_in = by_before[_crack_at(before, _before(p))], by_after[_crack_at(after, _draw([q]))]
    assert (out.status, out.after) == (NOT_SEEN, None) and (come_in.status, come_in.before) == (NOT_SEEN, None)
    assert out.box_after[3] < 0  # left of the AFTER image, where the alignment puts it: not clipped
    assert come_in.box_after == come_in.after.bbox and out.length_growth_px is None
    for crack in (r, s):
        assert by_before[_crack_at(before, _before(crack))].status == UNCHANGED
    assert abs(by_before[_crack_at(before, _before(s))].length_growth_px) < 10  # measured over what both see, not -60
    assert len(changes) == 4


def test_unlinked_cracks_at_a_frames_edge_are_judged_by_what_the_other_date_saw():
    """T runs 100 px out of the AFTER frame and 150 px inside it, where nothing is left: gone, its box clipped to the
    AFTER image. U shows its last 6 px inside the AFTER frame: too little to tell. V and W hug their own date's
    frame edge, well inside the other date's frame: gone and new."""
    t, u, v = ([(60, 50), (80, 250)], 3), ([(200, 90), (205, 106)], 3), ([(100, 318), (200, 318)], 3)
    w = ([(20, 1), (120, 1)], 3)  # AFTER px: 100 px inside the BEFORE frame
    before = _measure(_before(t, u, v))
    changes = match(before, _measure(_draw([w])), SHIFTED)
    by_before = {c.before.id: c for c in changes if c.before}
    gone, unseen = by_before[_crack_at(before, _before(t))], by_before[_crack_at(before, _before(u))]
    assert gone.status == GONE and gone.box_after[1] == 0 and gone.box_after[3] > 100
    assert unseen.status == NOT_SEEN and unseen.box_after[1] < 0
    assert by_before[_crack_at(before, _before(v))].status == GONE
    assert [c.status for c in changes if c.before is None] == [NEW]


def test_a_crack_cut_by_the_before_frame_is_not_longer_when_after_sees_it_whole():
    """BEFORE sees the crack from its own left edge on, 40 px short of its end; AFTER, 60 px further left, sees it whole."""
    crack = ([(100, -40), (110, 150)], 3)
    view = _similarity(0.0, 1.0, (60.0, 0.0))
    (change,) = match(_measure(_before(crack)), _measure(_after(crack, alignment=view)), view)
    assert abs(change.length_growth_px) < 10  # measured over what both see: not the 40 px the frame cut off
    assert change.status == UNCHANGED


def test_an_untouched_blob_is_unchanged():
    """Round blobs as long as the minimum length thin to a centreline of two to four pixels."""
    blobs = (((160, 100), 7.0), ((80, 200), 6.0))
    before = _measure(np.logical_or.reduce([_disc(centre, radius) for centre, radius in blobs]))
    after = _measure(np.logical_or.reduce([_disc(VIEW.map_points([centre])[0], radius * 1.04) for centre, radius in blobs]))
    assert len(before.cracks) == 2 and max(len(points) for points in before.points.values()) < 5
    assert [c.status for c in match(before, after, VIEW)] == [UNCHANGED, UNCHANGED]


@pytest.mark.parametrize("width_after, status", [(3.0, SHORTER), (7.0, WIDER)])
def test_a_crack_seen_shorter_is_shorter_unless_it_is_wider(width_after, status):
    """80 of 220 px lost at one end (a repaired stretch, or faint ends the segmentation lost); widening comes first."""
    whole, kept = ([(100, 40), (110, 260)], 3), [(100, 40), (103.6, 180)]
    (change,) = match(_measure(_before(whole)), _measure(_draw([(VIEW.map_points(kept), width_after)])), VIEW)
    assert change.status == status
    assert change.length_growth_px == pytest.approx(-80 * 1.04, abs=10)


def test_a_crack_repaired_in_part_is_shorter_however_its_masks_break_it():
    """Two pieces (14 px apart, beyond the join gap) of which the first was repaired, and a crack whose 40 px
    shrank to 8, below the minimum length: both shorter, as one unbroken crack that lost as much is."""
    view = _similarity(0.0, 1.0, (0.0, 0.0))
    pieces, rest = ([(96, 10), (96, 79)], 3), ([(96, 96), (96, 181)], 3)
    before, after = _measure(_before(pieces, rest)), _measure(_before(([(96, 40), (96, 181)], 3)))
    assert len(before.cracks) == 2 and len(after.cracks) == 1
    assert {c.status for c in match(before, after, view)} == {SHORTER}
    forty, eight, long = ([(60, 50), (60, 89)], 3), ([(60, 50), (60, 57)], 3), ([(140, 20), (140, 170)], 3)
    changes = match(_measure(_before(forty, long)), _measure(_before(eight, long)), view)
    assert sorted((c.status, c.after is None) for c in changes) == [(SHORTER, True), (UNCHANGED, False)]


def test_a_crack_cut_by_the_frame_that_grew_inside_the_view_is_longer():
    """The frame cuts one end on both dates; the other end grew 50 px inside the view both share."""
    view = _similarity(0.0, 1.0, (20.0, 0.0))
    before = _measure(_before(([(100, -40), (110, 150)], 3)))
    after = _measure(_after(([(100, -40), (110.3, 200)], 3), alignment=view))
    (change,) = match(before, after, view)
    assert change.status == LONGER and change.length_growth_px == pytest.approx(50, rel=0.15)


@pytest.mark.parametrize("scale", [0.8, 1.25, 1.5])
def test_a_faint_stretch_the_join_bridges_on_one_date_only_counts_on_both(scale):
    """A 9 px faint stretch (edge to edge) is bridged by the 10 px join gap in BEFORE's pixels, and is 11 px or more
    at 1.25x: the AFTER mask's two pieces are not shorter by the bridge, which predict's length of BEFORE includes."""
    pieces = ([(150, 60), (152, 140)], 3), ([(152.0, 152), (154, 200)], 3)
    view = _similarity(0.0, scale, (0.0, 0.0))
    before, after = _measure(_before(*pieces)), _measure(_after(*pieces, alignment=view))
    assert len(before.cracks) == 1 and len(after.cracks) == (1 if scale < 1 else 2)
    changes = match(before, after, view)
    assert {c.status for c in changes} == {UNCHANGED}
    assert abs(changes[0].length_growth_px) < LONGER_MIN_PX


def test_a_crack_shorter_than_the_minimum_length_on_one_date_is_compared_with_what_that_date_shows():
    """12 px at 0.8x is 9.6 px, below predict's 10 px: not gone. 9 px at 1.25x is 11 px: not new. A crack that grew
    from 9 px to 60 px is longer; short cracks on both dates get no row, and none of them gets an id of cracks.csv."""
    twelve, nine, grown = ([(60, 60), (60, 69)], 3), ([(100, 60), (100, 67)], 3), ([(200, 60), (200, 66)], 3)
    smaller = _similarity(0.0, 0.8, (0.0, 0.0))
    before, after = _measure(_before(twelve)), _measure(_after(twelve, alignment=smaller))
    assert [c.id for c in before.cracks] == [1] and after.cracks == [] and len(after.short) == 1 and not after.labels.any()
    (change,) = match(before, after, smaller)
    assert (change.status, change.before.id, change.after) == (UNCHANGED, 1, None)
    assert abs(change.length_growth_px) < 3 and change.box_after[0] <= smaller.map_points([(60, 64.5)])[0, 0] <= change.box_after[2]

    larger = _similarity(0.0, 1.25, (0.0, 0.0))
    before = _measure(_before(nine, grown))
    after = _measure(_after(nine, alignment=larger) | _after(_extended(grown, 50.0), alignment=larger))
    assert before.cracks == [] and [c.id for c in before.short] == [1, 2] and [c.id for c in after.cracks] == [1, 2]
    changes = match(before, after, larger)
    assert [(c.status, c.before, c.after.id) for c in changes] == [(LONGER, None, 1), (UNCHANGED, None, 2)]
    assert changes[0].length_growth_px == pytest.approx(50 * 1.25, rel=0.15) and changes[0].scale == pytest.approx(1.25)

    assert match(_measure(_before(nine)), _measure(_after(nine, alignment=smaller)), smaller) == []


@pytest.mark.parametrize("scale, shift, crack", [
    (1.25, (-0.31, -2.12), ([(313.3, 278.7), (319.6, 324.5)], 2)),  # runs out of the frame by a corner
    (0.8, (1.37, 2.21), ([(129.7, -11.2), (280.1, 8.0)], 3)),  # enters at a shallow angle
    (1.5, (1.81, -0.33), ([(236.6, 0.4), (182.4, 2.7)], 2)),  # hugs the edge
    (1.238, (1.09, 0.31), ([(209.1, -1.9), (109.8, 10.0)], 3)),  # leaves the edge at 7 degrees: the cut is 16 px uncertain
    (1.121, (1.89, -1.01), ([(317.1, 152.3), (314.1, 92.4)], 2)),  # runs along the edge, half out of the frame
    (1.331, (1.3, 1.37), ([(-1.6, 167.4), (0.8, 205.2)], 4)),  # all of it within the margin: nothing to compare
])
def test_a_crack_at_the_frame_edge_seen_again_at_another_pixel_size_is_unchanged(scale, shift, crack):
    """The same view photographed at 0.8x to 1.5x the pixels: both dates' centrelines are cut by one line, the
    shared view's edge less the largest margin of the group, so the parts compared are the same stretch of crack."""
    global SIZE
    matrix = np.eye(3)
    matrix[:2, :2] *= scale
    matrix[:2, 2] = (scale - 1) * 0.5 + np.array(shift)  # pixel centres: BEFORE (col, row) -> AFTER
    view = Alignment(matrix=matrix, method="orb-similarity")
    before = _measure(_before(crack))
    size, SIZE = SIZE, (round(SIZE[0] * scale), round(SIZE[1] * scale))
    try:
        after = _measure(_after(crack, alignment=view))
    finally:
        SIZE = size
    assert [c.status for c in match(before, after, view)] == [UNCHANGED]


@pytest.mark.parametrize("width, offset", [(w, o) for w in (3, 4, 5, 6, 7, 8) for o in (0, 1)])
def test_a_crack_photographed_before_at_half_the_resolution_is_unchanged(width, offset):
    """BEFORE is AFTER's mask seen by pixels twice as large: its edges are placed to within half of its own pixel,
    1 AFTER px, so a width reads up to 2 AFTER px apart (6 px at 45 degrees read 1.0002 px wider, and was wider)."""
    from scipy import ndimage
    from skimage.draw import line

    centre = np.zeros(SIZE, bool)
    centre[line(40 + offset, 40, 280 + offset, 280)] = True
    after = ndimage.distance_transform_edt(~centre) <= (width - 1) / 2
    before = after.reshape(SIZE[0] // 2, 2, SIZE[1] // 2, 2).mean(axis=(1, 3)) >= 0.5
    matrix = np.eye(3)
    matrix[:2, :2] *= 1.9999  # a registration by features is a little off 2
    matrix[:2, 2] = 0.5
    assert [c.status for c in match(_measure(before), _measure(after), Alignment(matrix=matrix, method="orb-similarity"))] == [UNCHANGED]

