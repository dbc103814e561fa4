"""One pair of inspections: the cracks of both dates matched by their centrelines, and what changed.

Each date is measured as ``predict`` measures it (:func:`crackseg.cracks.measure.find_cracks`, same
join gap and minimum length, so crack ids are those of cracks.csv). The BEFORE centrelines are
mapped into the AFTER image by the pair's :class:`~crackseg.monitoring.registration.Alignment`; a BEFORE and
an AFTER crack are linked when most of the shorter one's centreline lies along the other's.
Connected groups of links give the statuses: ``unchanged``, ``longer``, ``wider`` or
``longer+wider`` from the group's totals; several BEFORE cracks joined by growth into one AFTER
crack are ``merged``; one BEFORE crack that lost a stretch and is seen as several is ``split``;
one crack seen as one shorter crack is ``shorter`` (a repaired stretch, or faint ends the
segmentation lost); an unlinked BEFORE crack is ``gone``, an unlinked AFTER one ``new``.

Only the view both dates share can tell: the BEFORE frame mapped into the AFTER image, cut by
the AFTER frame. An unlinked crack that lies outside the other date's frame, or inside it by too
little to have been seen there (fewer than ``MATCH_MIN_POINTS`` centreline pixels away from its
edge), is ``not seen``, never ``gone`` or ``new``. A group of linked cracks that reaches the
shared view's edge is cut there on one date or both: its lengths are compared over the parts of
it both dates see (each crack's length times the share of its centreline well inside that view, by one margin
for every crack of the group on both dates, so that both are cut by the same line), a change in length must
exceed how far along the cracks that line may fall (far, where it meets them at a shallow angle), it is wider
by its mean width only (its widest place may lie where one date does not look), and it is unchanged when
either date sees fewer than ``MATCH_MIN_POINTS`` of its centreline pixels inside that view.

Sizes are compared in AFTER pixels: BEFORE lengths and widths are multiplied by the mapping's
local scale at the crack. What predict's measurement decides in each date's own pixels is kept out of
the comparison, so that a visit photographed at another pixel size compares as one photographed at
the same. Its join gap: a faint stretch that one date bridged (9 px) and the other leaves as a gap
between pieces of the crack (11 px at 1.25x) counts on both (see :func:`_growth`). Its minimum length:
a crack shorter than it on one date (absent from that date's cracks.csv) is still measured there: it
links and counts in its group's totals like any crack, gets no row of its own, and a crack linked to
such cracks only gets a row with that date's side empty and the group's status.

What a measurement can tell apart, and so the thresholds below:

- **width**: an edge is placed to within half a pixel, so a width (two edges) is uncertain
  by about 1 px. The mean width (area / length) averages that along the crack, but a
  segmentation that moves both edges by half a pixel still shifts it by up to 1 px; the
  maximum width is one place on the crack, two quantised edges on each date: up to 2 px.
  A crack is wider when its mean width grows by more than ``WIDER_MEAN_PX`` (1 px) or its
  maximum width by more than ``WIDER_MAX_PX`` (2 px). A BEFORE photographed coarser places its
  edges to within half of its own pixel: there these are BEFORE px (2 AFTER px each at half the
  resolution), and so is ``LONGER_MIN_PX``.
- **length**: the skeleton's ends lie within about half a width of the crack's real ends
  (both ends: one mean width per date), the corner-count estimator is within about 2% at any
  angle, so a crack seen at another angle may read up to 4% apart, and the mapping's scale
  adds its own error (about 1% for a registration by features). A crack is longer when it
  grows by more than ``max(LONGER_MIN_PX, LONGER_SHARE x length + mean width)``: 5 px, or 5%
  of the BEFORE length plus the larger mean width of the two dates; shorter when it shrinks by
  as much.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from scipy.cluster.hierarchy import DisjointSet
from scipy.sparse.csgraph import minimum_spanning_tree
from scipy.spatial import cKDTree

from crackseg.cracks.measure import CrackMeasure
from crackseg.monitoring.date_cracks import DateCracks
from crackseg.monitoring.registration import Alignment

UNCHANGED, LONGER, WIDER, LONGER_WIDER, SHORTER = "unchanged", "longer", "wider", "longer+wider", "shorter"
NEW, GONE, MERGED, SPLIT, NOT_SEEN = "new", "gone", "merged", "split", "not seen"
STATUSES = (UNCHANGED, SHORTER, LONGER, WIDER, LONGER_WIDER, MERGED, SPLIT, NEW, GONE, NOT_SEEN)  # as tables and summaries list them

# In AFTER px, and BEFORE px where BEFORE is the coarser date (these times its pixel's size in AFTER px):
WIDER_MEAN_PX = 1.0  # mean width: two edges, each within half a pixel
WIDER_MAX_PX = 2.0  # maximum width: one place, two quantised edges on each date
LONGER_MIN_PX = 5.0  # below this no length change is told apart, however short the crack
LONGER_SHARE = 0.05  # estimator (2% at any angle, so 4% between two angles) plus the mapping's scale

MATCH_TOLERANCE_PX = 3.0
"""How far apart (AFTER px) the two dates' centrelines of one crack may lie, besides half the larger
mean width (see :func:`match`): skeletons placed within half a pixel on each date (1 px), a
mapped BEFORE pixel up to 0.7 px from the nearest AFTER pixel centre, and an edge segmented a
pixel differently moving the centreline by half a pixel: 2.2 px, rounded up. The registration's
own error is not included: callers add the alignment's ``error_px`` (how far the mapping may
misplace a point), not its residual (how far single features lie from it). The same distance,
plus half a crack's maximum width, is how near the shared view's edge a crack counts as cut by it."""
MATCH_SHARE = 0.5  # the shorter centreline's share that must lie along the other one
# Fewer shared centreline pixels say nothing about where a crack went (a blob, whose centreline is a few pixels,
# needs no more than it has); an unlinked crack with fewer inside the other date's frame is not seen.
MATCH_MIN_POINTS = 5


@dataclass(frozen=True)
class Change:
    """One row of a pair's changes. Growths are AFTER px (AFTER minus scaled BEFORE); for merged and
    split rows they are the whole group's (total lengths, length-weighted mean widths, largest
    maximum widths), for a group cut by the shared view's edge those of the parts each date sees;
    None for new, gone and not seen cracks."""

    status: str
    before: CrackMeasure | None
    after: CrackMeasure | None
    scale: float  # AFTER px per BEFORE px at this crack
    # top, left, bottom, right (exclusive) in the AFTER image; a not seen BEFORE crack's box, as mapped, lies partly or
    # wholly outside it (a gone crack's is clipped to it)
    box_after: tuple[int, int, int, int]
    length_growth_px: float | None
    mean_width_growth_px: float | None
    max_width_growth_px: float | None
    overlap: float  # share of the shorter centreline (inside the other date's frame) lying along the other one; 0 when unlinked


def count_statuses(statuses: Iterable[str]) -> dict[str, int]:
    """Cracks per status: each of STATUSES (zero included), then any other status that occurs."""
    counts = Counter(statuses)
    return {status: counts[status] for status in [*STATUSES, *sorted(set(counts) - set(STATUSES))]}


def groups_of(changes: list[Change]) -> list[list[int]]:
    """The rows of each group of linked cracks (rows sharing a crack of either date), as indices into ``changes``."""
    groups = DisjointSet(range(len(changes)))
    first: dict[tuple[str, int], int] = {}
    for index, change in enumerate(changes):
        for key in (("before", change.before.id) if change.before else None, ("after", change.after.id) if change.after else None):
            if key is not None:
                groups.merge(first.setdefault(key, index), index)
    return sorted(sorted(members) for members in groups.subsets())


def length_growth(changes: list[Change]) -> float:
    """How much longer (AFTER px) a pair's cracks got: each group of linked cracks' growth once (its rows repeat it),
    plus the new cracks' lengths, less the gone ones' (scaled); cracks not seen count nothing."""
    total = 0.0
    for members in groups_of(changes):
        change = changes[members[0]]
        if change.length_growth_px is not None:
            total += change.length_growth_px
        elif change.status == NEW:
            total += change.after.length_px
        elif change.status == GONE:
            total -= change.before.length_px * change.scale
    return total


def match(before: DateCracks, after: DateCracks, alignment: Alignment, tolerance_px: float = MATCH_TOLERANCE_PX) -> list[Change]:
    """The changes from ``before`` to ``after``: one row per linked pair, gone, new or not seen crack.

    A BEFORE and an AFTER crack are linked when at least ``MATCH_SHARE`` (half) of one's
    centreline pixels inside the other date's frame, and at least ``MATCH_MIN_POINTS`` of them
    (or all of the shorter centreline's, for a blob), lie within ``tolerance_px`` plus half the
    larger mean width of the other's centreline (each pixel counted for the crack whose
    centreline is nearest to it). In practice the shorter one decides, as it should:
    growth, merges and splits make the other longer, and a crack that grew keeps all of its old
    centreline under the new one, while a crack that only crosses another shares a few pixels
    of its length. Half a width is added because a crack that opens on one side moves its
    centreline by half the widening, and a wide crack's skeleton cuts its corners.
    Rows come ordered by AFTER id, then BEFORE id; unlinked BEFORE cracks last.
    """
    every_before, every_after = before.cracks + before.short, after.cracks + after.short
    scales = {crack.id: float(alignment.scale_at(before.points[crack.id]).mean()) for crack in every_before}
    mapped = {crack.id: alignment.map_points(before.points[crack.id]) for crack in every_before}
    view = _shared_view(before.labels.shape, after.labels.shape, alignment)
    centrelines = {("before", number): points for number, points in mapped.items()}
    centrelines |= {("after", number): points for number, points in after.points.items()}
    # how far (AFTER px) each centreline pixel lies inside the other date's frame: where that date looked
    insets = {key: _inset(points, view[:4] if key[0] == "before" else view[4:]) for key, points in centrelines.items()}
    # a crack cut by a frame's edge keeps its centreline half a width short of it, and BEFORE's edge lies where
    # the alignment puts it
    margins = {("before", c.id): tolerance_px + 0.5 * c.max_width_px * scales[c.id] for c in every_before}
    margins |= {("after", c.id): tolerance_px + 0.5 * c.max_width_px for c in every_after}
    seen = {key: np.count_nonzero(inset >= margins[key]) >= min(MATCH_MIN_POINTS, len(inset)) for key, inset in insets.items()}
    inset_shared = {key: _inset(points, view) for key, points in centrelines.items()}  # inside the view both share
    overlaps = _links(every_before, every_after, mapped, after.points, insets, scales, tolerance_px)
    groups = DisjointSet([("before", c.id) for c in every_before] + [("after", c.id) for c in every_after])
    for b, a in overlaps:
        groups.merge(("before", b), ("after", a))
    by_id = {("before", crack.id): crack for crack in every_before} | {("after", crack.id): crack for crack in every_after}
    listed = {("before", crack.id) for crack in before.cracks} | {("after", crack.id) for crack in after.cracks}
    changes = []
    for group in groups.subsets():
        olds = sorted((by_id[key] for key in group if key[0] == "before"), key=lambda c: c.id)
        news = sorted((by_id[key] for key in group if key[0] == "after"), key=lambda c: c.id)
        if not group & listed:
            continue  # short cracks alone: not cracks on either date
        if not news:
            changes.append(_gone(olds[0], scales[olds[0].id], alignment, after.labels.shape, seen["before", olds[0].id]))
        elif not olds:
            changes.append(_new(news[0], after.points[news[0].id], alignment, seen["after", news[0].id]))
        else:
            # a group cut by the view's edge is measured on the parts both dates see: its lengths times the share of
            # its centreline well inside that view, one line for every crack of the group on both dates
            shared, cut_px = _cut_by_view(group, inset_shared, max(margins[key] for key in group), scales)
            seen_share = {key: float(shared[key].mean()) if cut_px is not None and len(shared[key]) else 1.0 for key in group}
            growth = _growth(olds, news, scales, seen_share, centrelines)
            counted = sum(("before", c.id) in listed for c in olds), sum(("after", c.id) in listed for c in news)
            status = UNCHANGED if cut_px == math.inf else _growth_status(olds, news, scales, growth, seen_share, cut_px, counted)
            changes += _group_rows(status, [c for c in olds if ("before", c.id) in listed], [c for c in news if ("after", c.id) in listed],
                                   overlaps, scales, growth, lambda old: _mapped_box(old, alignment, after.labels.shape, True))
    return sorted(changes, key=lambda c: (c.after.id if c.after else math.inf, c.before.id if c.before else 0))


def _shared_view(before_shape: tuple, after_shape: tuple, alignment: Alignment) -> np.ndarray:
    """(8, 3) half-planes (a, b, c) bounding the view both dates share, in AFTER (row, col): a row + b col + c is how
    far (AFTER px) a point lies inside an edge, negative outside. The first four are the AFTER frame's edges, the
    last four the BEFORE frame's mapped into AFTER: a homography maps lines to lines (the registration keeps the
    horizon out of the frame), so the mapped frame is the quadrilateral of its mapped corners. Frames run from
    -0.5 to size - 0.5."""
    height, width = before_shape[:2]
    corners = alignment.map_points([(-0.5, -0.5), (-0.5, width - 0.5), (height - 0.5, width - 0.5), (height - 0.5, -0.5)])
    along = np.roll(corners, -1, axis=0) - corners
    normals = np.column_stack([-along[:, 1], along[:, 0]]) / np.linalg.norm(along, axis=1)[:, None]
    mapped = np.column_stack([normals, -np.sum(normals * corners, axis=1)])
    mapped *= np.sign(mapped[:, :2] @ corners.mean(axis=0) + mapped[:, 2])[:, None]  # the corners' mean lies inside
    height, width = after_shape[:2]
    frame = np.array([[1.0, 0.0, 0.5], [-1.0, 0.0, height - 0.5], [0.0, 1.0, 0.5], [0.0, -1.0, width - 0.5]])
    return np.vstack([frame, mapped])


def _cut_by_view(group: set[tuple[str, int]], insets: dict[tuple[str, int], np.ndarray], margin: float,
                 scales: dict[int, float]) -> tuple[dict[tuple[str, int], np.ndarray], float | None]:
    """Where the shared view's edge, less ``margin`` (one line for every crack of the group on both dates), cuts a
    group of linked cracks: which centreline pixels of each lie inside it, and how far along the cracks (AFTER px)
    that line may fall. None: it cuts none of them; infinite: a date sees fewer than ``MATCH_MIN_POINTS`` pixels
    inside, too little to tell any change. Otherwise the centreline within 1 px of the line, on the date with more:
    each date places its centrelines within half a pixel, so a crack crossing the line square on has 2 px there,
    and one running along the view's edge at a shallow angle many, its seen length that uncertain."""
    shared = {key: insets[key] >= margin for key in group}
    if all(inside.all() for inside in shared.values()):
        return shared, None
    seen, near = Counter(), Counter()
    for date, number in group:
        seen[date] += int(np.count_nonzero(shared[date, number]))
        near[date] += np.count_nonzero(np.abs(insets[date, number] - margin) < 1.0) * (scales[number] if date == "before" else 1.0)
    return shared, math.inf if min(seen.values()) < MATCH_MIN_POINTS else float(max(near.values()))


def _inset(rows_cols: np.ndarray, view: np.ndarray) -> np.ndarray:
    """(N,) how far (AFTER px) each AFTER (row, col) lies inside all of ``view``'s half-planes (see :func:`_shared_view`)."""
    return (np.asarray(rows_cols, np.float64) @ view[:, :2].T + view[:, 2]).min(axis=1)


def _links(before: list[CrackMeasure], after: list[CrackMeasure], mapped: dict[int, np.ndarray], drawn: dict[int, np.ndarray],
           insets: dict[tuple[str, int], np.ndarray], scales: dict[int, float], tolerance_px: float) -> dict[tuple[int, int], float]:
    """{(BEFORE id, AFTER id): share of the shorter centreline along the other} for the linked pairs of ``before``
    and ``after`` cracks (``mapped``: BEFORE centrelines in AFTER px, ``drawn``: AFTER's), counting the centreline pixels inside the
    other date's frame (``insets`` >= 0): the rest has nothing to lie along."""
    if not before or not after:
        return {}
    before_width = np.zeros(max(mapped) + 1)
    after_width = np.zeros(max(drawn) + 1)
    for crack in before:
        before_width[crack.id] = crack.mean_width_px * scales[crack.id]
    for crack in after:
        after_width[crack.id] = crack.mean_width_px
    before_points, before_owner = _stacked(mapped)
    after_points, after_owner = _stacked(drawn)
    before_inside = np.concatenate([insets["before", number] for number in mapped]) >= 0
    after_inside = np.concatenate([insets["after", number] for number in drawn]) >= 0
    inside = {key: int(np.count_nonzero(inset >= 0)) for key, inset in insets.items()}
    reach = tolerance_px + 0.5 * max(before_width.max(), after_width.max())

    def shared(points, owner, other_points, other_owner, owner_is_before):
        """{(BEFORE id, AFTER id): pixels of ``points`` whose nearest pixel of ``other_points`` is close enough}."""
        distance, index = cKDTree(other_points).query(points, distance_upper_bound=reach)
        near = np.isfinite(distance)
        mine, theirs = owner[near], other_owner[index[near]]
        b, a = (mine, theirs) if owner_is_before else (theirs, mine)
        close = distance[near] <= tolerance_px + 0.5 * np.maximum(before_width[b], after_width[a])
        pairs, counts = np.unique(np.stack([b[close], a[close]], axis=1), axis=0, return_counts=True)
        return {(int(p[0]), int(p[1])): int(n) for p, n in zip(pairs, counts)}

    from_before = shared(before_points[before_inside], before_owner[before_inside], after_points, after_owner, True)
    from_after = shared(after_points[after_inside], after_owner[after_inside], before_points, before_owner, False)
    links = {}
    for b, a in from_before.keys() | from_after.keys():
        needed = min(MATCH_MIN_POINTS, len(mapped[b]), len(drawn[a]))
        counted = ((from_before.get((b, a), 0), inside["before", b]), (from_after.get((b, a), 0), inside["after", a]))
        shares = [count / total for count, total in counted if count and count >= needed]
        if shares and max(shares) >= MATCH_SHARE:
            links[b, a] = max(shares)
    return links


def _stacked(points: dict[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """All cracks' (row, col) in one (N, 2) array, and the crack id of each."""
    ids = list(points)
    return np.concatenate([points[i] for i in ids]).astype(np.float64), np.repeat(ids, [len(points[i]) for i in ids])


def _gap_between(pieces: list[tuple[np.ndarray, float]]) -> float:
    """px of the gaps that would join ``pieces`` ((N, 2) centreline, mean width) into one crack: the shortest tree of
    edge-to-edge distances between them (centrelines apart less half of each one's width), as the join measures a gap."""
    if len(pieces) < 2:
        return 0.0
    gaps = np.zeros((len(pieces), len(pieces)))
    for i, (points, width) in enumerate(pieces):
        tree = cKDTree(points)
        for j in range(i + 1, len(pieces)):
            apart = float(tree.query(pieces[j][0])[0].min())
            gaps[i, j] = max(apart - 0.5 * (width + pieces[j][1]), 1e-9)  # 0 is no edge to minimum_spanning_tree
    return float(minimum_spanning_tree(gaps).sum())


def _growth(olds: list[CrackMeasure], news: list[CrackMeasure], scales: dict[int, float], seen_share: dict[tuple[str, int], float],
            centrelines: dict[tuple[str, int], np.ndarray]) -> tuple[float, float, float]:
    """(length, mean width, max width) growth in AFTER px from the BEFORE cracks of a group to its AFTER cracks;
    lengths counted over the ``seen_share`` of each crack that both dates see.

    Lengths are predict's, faint stretches that the join bridged included. The join gap is in each date's own
    px, so one date may bridge a stretch (9 px) that the other, photographed at another pixel size, leaves as a
    gap between pieces of the group (11 px at 1.25x): such a gap counts on that date too, up to what the other
    date bridged (``centrelines``: each crack's, in AFTER px). A gap no date bridged is a stretch lost or grown.
    """
    old_lengths = np.array([c.length_px * scales[c.id] * seen_share["before", c.id] for c in olds])
    old_widths = np.array([c.mean_width_px * scales[c.id] for c in olds])
    new_lengths = np.array([c.length_px * seen_share["after", c.id] for c in news])
    new_widths = np.array([c.mean_width_px for c in news])
    bridged_before, bridged_after = sum(c.gap_px * scales[c.id] for c in olds), sum(c.gap_px for c in news)
    unjoined_before = min(_gap_between([(centrelines["before", c.id], c.mean_width_px * scales[c.id]) for c in olds]), bridged_after)
    unjoined_after = min(_gap_between([(centrelines["after", c.id], c.mean_width_px) for c in news]), bridged_before)
    return (float(new_lengths.sum() + unjoined_after - old_lengths.sum() - unjoined_before),
            float(np.average(new_widths, weights=new_lengths + 1e-9) - np.average(old_widths, weights=old_lengths + 1e-9)),
            float(max(c.max_width_px for c in news) - max(c.max_width_px * scales[c.id] for c in olds)))


def _growth_status(olds: list[CrackMeasure], news: list[CrackMeasure], scales: dict[int, float], growth: tuple[float, float, float],
                   seen_share: dict[tuple[str, int], float], cut_px: float | None, counted: tuple[int, int]) -> str:
    """The status of a group of linked cracks (see the module's thresholds), from the group's totals.

    Several BEFORE cracks in one AFTER crack are ``merged`` only when the group grew longer: cracks joined
    by growth. One BEFORE crack seen as several is ``split`` only when the group got shorter by as much: a
    stretch repaired or closed. Otherwise the pieces are one crack that the two dates' masks break at
    other places (a faint stretch above or below the threshold), and the group gets its growth status.
    A group that got as much shorter and is one crack at the later date (its pieces joined, or short ones only
    left) is ``shorter``, unless it is wider: widening is the change to act on, and its length growth says that
    it got shorter. A group cut by the shared view's edge (``cut_px``
    not None) is measured on the parts of it both dates see, and is wider by its mean width only: its widest
    place may lie where one date does not look; its length must change by ``cut_px`` more, how far along it
    the cut may fall (:func:`_cut_by_view`). ``counted``: the group's BEFORE and AFTER cracks that are cracks of
    their date (not short ones), which alone make it merged or split.
    """
    length, mean_width, max_width = growth
    before_lengths = [c.length_px * scales[c.id] * seen_share["before", c.id] for c in olds]
    larger_mean_width = np.average([c.mean_width_px * scales[c.id] for c in olds], weights=np.add(before_lengths, 1e-9)) \
        + max(mean_width, 0.0)
    coarse = max(1.0, *(scales[c.id] for c in olds))  # AFTER px per BEFORE px: a coarser BEFORE's edges are that unsure
    beyond = max(LONGER_MIN_PX * coarse, LONGER_SHARE * sum(before_lengths) + larger_mean_width + (cut_px or 0.0))
    longer, shorter = length > beyond, -length > beyond
    wider = mean_width > WIDER_MEAN_PX * coarse or (max_width > WIDER_MAX_PX * coarse and cut_px is None)
    if counted[0] > 1 and longer:
        return MERGED
    if counted[1] > 1 and shorter:
        return SPLIT
    if counted[1] <= 1 and shorter and not wider:
        return SHORTER
    return LONGER_WIDER if longer and wider else LONGER if longer else WIDER if wider else UNCHANGED


def _group_rows(status: str, olds: list[CrackMeasure], news: list[CrackMeasure], overlaps: dict[tuple[int, int], float],
                scales: dict[int, float], growth: tuple[float, float, float], box_of) -> list[Change]:
    """A group's rows: one per link between cracks of both dates (``olds``, ``news``: the group's cracks that are
    not short), and one for each such crack linked to short cracks of the other date only, that side left empty
    (a BEFORE crack boxed where ``box_of`` maps it)."""
    rows = [Change(status, old, new, scales[old.id], new.bbox, *growth, overlaps[old.id, new.id])
            for old in olds for new in news if (old.id, new.id) in overlaps]
    for old in olds:
        if not any(row.before is old for row in rows):
            share = max(overlap for (b, _), overlap in overlaps.items() if b == old.id)
            rows.append(Change(status, old, None, scales[old.id], box_of(old), *growth, share))
    for new in news:
        if not any(row.after is new for row in rows):
            linked = [(scales[b], overlap) for (b, a), overlap in overlaps.items() if a == new.id]
            rows.append(Change(status, None, new, float(np.mean([scale for scale, _ in linked])), new.bbox, *growth,
                               max(overlap for _, overlap in linked)))
    return rows


def _mapped_box(crack: CrackMeasure, alignment: Alignment, after_shape: tuple, clip: bool) -> tuple[int, int, int, int]:
    """A BEFORE crack's box where the alignment puts it in the AFTER image; ``clip``: cut to that image."""
    top, left, bottom, right = crack.bbox
    corners = alignment.map_points([(top - 0.5, left - 0.5), (top - 0.5, right - 0.5), (bottom - 0.5, left - 0.5), (bottom - 0.5, right - 0.5)])
    low, high = np.floor(corners.min(axis=0) + 0.5).astype(int), np.ceil(corners.max(axis=0) + 0.5).astype(int)
    if clip:
        low, high = np.maximum(low, 0), np.minimum(high, after_shape[:2])
    return int(low[0]), int(low[1]), int(high[0]), int(high[1])


def _gone(old: CrackMeasure, scale: float, alignment: Alignment, after_shape: tuple, seen: bool) -> Change:
    """A BEFORE crack with no successor, boxed where it would lie in the AFTER image: ``gone``, its box clipped to
    the AFTER image, when enough of it lies inside that image (``seen``); else ``not seen``, its box as mapped, in
    part or wholly outside the AFTER image."""
    return Change(GONE if seen else NOT_SEEN, old, None, scale, _mapped_box(old, alignment, after_shape, seen), None, None, None, 0.0)


def _new(new: CrackMeasure, points: np.ndarray, alignment: Alignment, seen: bool) -> Change:
    """An AFTER crack with no predecessor: ``new`` when enough of it lies inside the mapped BEFORE frame (``seen``),
    else ``not seen``; its scale from the inverse mapping at its centreline."""
    inverse = Alignment(matrix=np.linalg.inv(alignment.matrix), method=alignment.method)
    return Change(NEW if seen else NOT_SEEN, None, new, float(1.0 / inverse.scale_at(points).mean()), new.bbox, None, None, None, 0.0)
