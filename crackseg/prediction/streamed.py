"""Prediction of rasters too large to hold (orthomosaics, stitched facades), block by block.

The raster is read a tile at a time (:class:`crackseg.data.rasters.RasterSource`), its
probabilities come from :meth:`crackseg.model.inference.Predictor.blocks`, and each finished
block is thresholded and written to tiled, compressed GeoTIFFs as soon as a whole row of
their tiles is complete. Memory does not grow with the raster's area, and grows with its
width only through the overlap rows and one row of output tiles. Outputs carry the input's CRS and
geotransform; pixels outside the surveyed area (nodata, alpha 0) are masked in them and
left out of the counts. Under torchrun every process predicts a share of each raster's
tile rows and rank 0 joins the parts (:func:`join_raster`), then measures the mask a band of rows at
a time; with ``--engine ray`` each band is an actor's item and the driver joins them alike.

Each input raster is opened once per process, by :func:`crackseg.data.rasters.open_if_streamed` when the run is
planned, and that source serves predicting and joining.
"""

from __future__ import annotations

import dataclasses
import math
import resource
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from scipy.cluster.hierarchy import DisjointSet
from tqdm import tqdm

from crackseg.core.errors import InputError
from crackseg.core.files import temp_path
from crackseg.core.storage import RemoteFile
from crackseg.cracks.measure import CrackMeasure, crack_measure, crack_parts
from crackseg.cracks.vectors import centrelines, skeleton_links, write_vectors
from crackseg.data.images import CRACK_THRESHOLD, PROBABILITY_MARK
from crackseg.data.raster_sink import BLOCK, RasterSink
from crackseg.data.rasters import RasterSource, gdal_settings, rasterio
from crackseg.model import distributed
from crackseg.model.inference import Predictor, part_rows
from crackseg.prediction.outputs import OutputSpec, PredictionsFolder, Records
from crackseg.prediction.pictures import MADE_WITH, probability_levels
from crackseg.prediction.tables import table_rows

if TYPE_CHECKING:
    from crackseg.core.staging import StagedFolder

HALO = 64  # px above and below each measured band: cracks narrower than this are measured as on the whole mask


def allow_open_rasters(count: int) -> None:
    """Raise this process's limit of open files (to the hard limit at most) so ``count`` rasters can stay open."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = count + 256  # and room for the photos, loader workers and outputs
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted if hard == resource.RLIM_INFINITY else min(hard, wanted), hard))


@dataclass(frozen=True)
class Raster:
    """One input raster of a run: its key (row order in predictions.csv), path, output name, open source and spec."""

    key: int
    path: Path | RemoteFile
    name: str
    source: RasterSource
    spec: OutputSpec


@dataclass(frozen=True)
class RasterRun:
    """What every raster of a run is predicted with."""

    predictor: Predictor
    threshold: float
    folder: PredictionsFolder
    save_prob: int | None = None  # 8 or 16 bits
    overviews: bool = False
    made_with: str = ""  # the masks' tag MADE_WITH: what made them (OutputSpec.made_with)


def predict_rasters(rasters: list[Raster], run: RasterRun, env: distributed.Environment, records: Records,
                    kept: set[int] = frozenset(), finished: Callable[[int], None] | None = None,
                    carrier: StagedFolder | None = None) -> None:
    """Predict each raster (every process its share of the tile rows), join the parts on rank 0 and measure them there;
    rank 0's ``records`` get the rows, and the errors of rasters that failed. ``kept``: the keys of rasters whose outputs
    an earlier run wrote (``--skip-existing``); ``finished`` is called on rank 0 with the key of each raster predicted;
    ``carrier``, the run's staged folder, takes the parts to rank 0 where the processes write into folders of their own
    (an --out in object storage)."""
    for raster in rasters:
        try:
            _predict_one(raster, run, env, records, raster.key in kept, carrier)
        finally:
            raster.source.close()
        if finished and env.is_main and raster.key in records.rows and raster.key not in kept:
            finished(raster.key)


def _predict_one(raster: Raster, run: RasterRun, env: distributed.Environment, records: Records, kept: bool,
                 carrier: StagedFolder | None) -> None:
    parts = None
    if not kept:
        written = raster_outputs(run.folder, raster.name, run.save_prob)
        part = _predict_part(raster.source, written, run, env)
        if carrier and env.distributed and not env.is_main and part[0] is None:
            try:
                carrier.hand_over(part_paths(written, env.rank))
            except (InputError, OSError) as error:  # a StorageError is an InputError
                part = (f"sending the part of process {env.rank}: {error}", (0, 0))
        parts = distributed.gather_objects(part, env)
        if carrier and env.distributed and env.is_main:
            carrier.take_over([path for index, (error, _) in enumerate(parts) if index and error is None
                                 for path in part_paths(written, index)])
    if env.is_main:
        join_raster(raster, run, parts, records)


def raster_outputs(folder: PredictionsFolder, name: str, save_prob: int | None) -> list[Path]:
    """The files a raster's prediction by windows writes: the mask, and with ``save_prob`` the probabilities."""
    return [folder.mask(name, raster=True)] + ([folder.probabilities(name, raster=True)] if save_prob else [])


def join_raster(raster: Raster, run: RasterRun, parts: list[tuple[str | None, tuple[int, int]]] | None,
                records: Records) -> None:
    """After every band of a raster was predicted: join the bands' files (:func:`merge_parts`), measure the mask and
    add its rows to ``records``, or its error. ``parts``: each band's (what went wrong or None, its (crack, valid)
    pixel counts), in band order; None: the outputs are an earlier run's, kept (``--skip-existing``)."""
    written = raster_outputs(run.folder, raster.name, run.save_prob)
    try:
        failure = next((error for error, _ in parts or [] if error), None)
        if failure:
            raise InputError(failure)
        if parts and len(parts) > 1:
            try:
                merge_parts(raster.source, written, run.predictor.tile, run.predictor.overlap, len(parts), run.overviews)
            except (InputError, OSError) as error:
                raise InputError(f"joining the processes' parts: {error}") from None
        pixels = tuple(map(sum, zip(*(counts for _, counts in parts)))) if parts else None
        row, cracks = _raster_rows(raster, run.folder, "ok" if parts else "skipped: exists", pixels)
    except (InputError, OSError) as error:  # rasterio's read errors are OSErrors
        discard_parts(written, len(parts or []))
        records.fail(raster.key, raster.path, raster.name, str(error))
        return
    records.add(raster.key, row, cracks)


def _predict_part(source: RasterSource, outputs: list[Path], run: RasterRun,
                  env: distributed.Environment) -> tuple[str | None, tuple[int, int]]:
    """This process's part of a raster: (what went wrong or None, its (crack, valid) pixel counts)."""
    try:
        return None, predict_raster(source, outputs, run, (env.rank, env.world_size), progress=env.is_main)
    except (InputError, OSError) as error:  # rasterio's read errors are OSErrors
        return str(error), (0, 0)


def _raster_rows(raster: Raster, folder: PredictionsFolder, status: str,
                 pixels: tuple[int, int] | None) -> tuple[dict, list[dict]]:
    """The table rows of a raster predicted by windows, with the pixel size of its spec; writes its vectors."""
    spec, mask_path = raster.spec, folder.mask(raster.name, raster=True)
    counts, cracks, links = summarize_raster(mask_path, spec.measure, spec.join_gap_px, spec.min_length_px, pixels=pixels,
                                             links=bool(spec.vectors))
    transform = counts.pop("transform")
    counts["px_size_mm"] = spec.px_size
    row, crack_rows = table_rows(raster.path, mask_path, counts, cracks, spec, status)
    if transform is not None:
        for item in crack_rows:  # the bounding box in map coordinates too
            xs, ys = zip(*(transform @ (col, row) for row in (item["top"], item["bottom"]) for col in (item["left"], item["right"])))
            item |= {"x_min": min(xs), "y_min": min(ys), "x_max": max(xs), "y_max": max(ys)}
    if spec.vectors:
        write_vectors(folder.vectors(raster.name, spec.vectors), crack_rows, centrelines(links, transform),
                      counts["crs"] or None, spec.width_classes)
    return row, crack_rows


def predict_raster(source: RasterSource, outputs: list[Path], run: RasterRun, part: tuple[int, int] = (0, 1),
                   progress: bool = True) -> tuple[int, int]:
    """Write the mask (uint8 0/255) and, with ``run.save_prob``, the probabilities of one raster
    to ``outputs``; returns its (crack, valid) pixel counts.

    ``part`` (index, count) of processes sharing the raster writes only its rows, to
    :func:`part_paths`; :func:`merge_parts` then makes the outputs. Nothing is left under
    the outputs' names unless the whole raster was predicted.
    """
    index, count = part
    save_prob, predictor, threshold = run.save_prob, run.predictor, run.threshold
    with gdal_settings():
        start, stop = part_rows(source.height, predictor.tile, predictor.overlap, part)
        if start == stop:
            return 0, 0
        crack_pixels = valid_pixels = 0
        sinks = []
        try:
            for target, dtype, tags in zip(band_paths(outputs, part), ["uint8", "uint8" if save_prob == 8 else "uint16"],
                                           [{MADE_WITH: run.made_with} if run.made_with else None, dict([PROBABILITY_MARK])]):
                sinks.append(RasterSink(target, source, dtype, (start, stop), tags))
            megapixels = round((stop - start) * source.width / 1e6, 1)
            with tqdm(total=megapixels, desc=f"predict {source.path.name}", unit="MP", disable=None if progress else True) as bar:
                for top, left, prob, valid in predictor.blocks(source.read, source.height, source.width, part):
                    cracks = (prob >= threshold).numpy() & valid
                    crack_pixels += int(np.count_nonzero(cracks))
                    valid_pixels += int(np.count_nonzero(valid))
                    sinks[0].write_block(top - start, left, cracks.astype(np.uint8) * 255, valid)
                    if save_prob:
                        sinks[1].write_block(top - start, left, np.where(valid, probability_levels(prob.numpy(), save_prob), 0), valid)
                    bar.update(round(prob.numel() / 1e6, 3))
            for sink in sinks:
                sink.commit(run.overviews and count == 1)
        except BaseException:
            for sink in sinks:
                sink.abort()
            raise
    return crack_pixels, valid_pixels


def band_paths(outputs: list[Path], part: tuple[int, int]) -> list[Path]:
    """Where :func:`predict_raster` writes ``part`` (index, count) of the raster ``outputs``: the outputs themselves
    when it is the whole raster."""
    return outputs if part[1] == 1 else part_paths(outputs, part[0])


def part_paths(outputs: list[Path], index: int) -> list[Path]:
    """Where process ``index`` writes its part of each raster output: hidden, and named as the
    temporary files that the next run removes if this one is cut short."""
    return [temp_path(path, f"part{index}", path.suffix) for path in outputs]


def merge_parts(source: RasterSource, outputs: list[Path], tile: int, overlap: int, count: int, overviews: bool = False) -> None:
    """Make the raster outputs of ``source`` from the parts that ``count`` processes wrote, top to
    bottom, and remove the parts. Reads and writes a band of rows at a time."""
    rio = rasterio()
    with gdal_settings():
        spans = [part_rows(source.height, tile, overlap, (index, count)) for index in range(count)]
        written = [index for index, (start, stop) in enumerate(spans) if start < stop]
        for output in outputs:
            parts = [part_paths([output], index)[0] for index in written]
            with rio.open(parts[0]) as first:
                dtype, tags = first.dtypes[0], first.tags()
            sink = RasterSink(output, source, dtype, tags=tags)
            try:
                for file in parts:
                    with rio.open(file) as raster:
                        for top in range(0, raster.height, BLOCK):
                            window = rio.windows.Window(0, top, raster.width, min(BLOCK, raster.height - top))
                            sink.write_block(top, 0, raster.read(1, window=window), raster.dataset_mask(window=window) > 0)
                sink.commit(overviews)
            except BaseException:
                sink.abort()
                raise
            for file in parts:
                file.unlink()


def discard_parts(outputs: list[Path], count: int) -> None:
    """Remove what processes wrote of a raster that failed."""
    for index in range(count):
        for file in part_paths(outputs, index):
            file.unlink(missing_ok=True)


def summarize_raster(mask_path: Path, measure: bool, join_gap: float = 0.0, min_length: float = 0.0,
                     band_pixels: int = 4_000_000, pixels: tuple[int, int] | None = None,
                     links: bool = False) -> tuple[dict, list[CrackMeasure], np.ndarray]:
    """A mask GeoTIFF's counts (predictions.csv's columns in px, the CRS and geotransform) and, when
    ``measure``, its cracks (longest first, ids from 1) and, with ``links``, their skeleton links
    (rows of :func:`crackseg.cracks.vectors.skeleton_links`, last column the crack id: held for the
    whole raster, so only asked for when drawing vectors). Read a band of rows at a time; not
    at all without ``measure`` when ``pixels`` (crack, valid), counted while predicting, is given.

    Each band is measured with HALO rows (plus the join gap) above and below it
    (:func:`crackseg.cracks.measure.crack_parts` counts only the band's own rows), and cracks that
    the shared rows show to be the same are merged (a disjoint set), so a crack crossing bands
    is one crack with its whole length. The figures equal the whole mask's where cracks are
    narrower than the halo, with two known exceptions: ``fragments`` counts a piece twice
    where its top lies in two places of one band (a V opening upwards), and a skeleton end
    in a halo, whose direction the band's edge distorts, can bridge a gap that the whole
    mask leaves open, merging two cracks into one.
    """
    with gdal_settings():  # GDAL's own block cache (5% of RAM) would fill with the mask's tiles
        return _summarize(mask_path, measure, join_gap, min_length, band_pixels, pixels, links)


def _summarize(mask_path: Path, measure: bool, join_gap: float, min_length: float,
               band_pixels: int, pixels: tuple[int, int] | None, with_links: bool) -> tuple[dict, list[CrackMeasure], np.ndarray]:
    rio = rasterio()
    halo = HALO + math.ceil(join_gap)
    with rio.open(mask_path) as raster:
        transform = None if raster.transform.is_identity else raster.transform  # with or without a CRS, as the mask is placed
        crs = raster.crs.to_string() if raster.crs else ""
        height, width = raster.height, raster.width
        band = max(64, min(1024, band_pixels // width))
        crack_pixels = valid_pixels = 0
        nodes = DisjointSet()  # a crack's parts in each band; merged where shared rows show them to be one
        sums: list[np.ndarray] = []  # per band and label: length, gap, area, max width, fragments
        boxes: list[np.ndarray] = []
        links: list[np.ndarray] = []  # skeleton links in raster rows, last column the node
        previous = None  # (labels of the rows shared with the next window, the first node of their window)
        for top in range(0, height if measure or pixels is None else 0, band):
            bottom = min(top + band, height)
            start, stop = (max(0, top - halo), min(height, bottom + halo)) if measure else (top, bottom)
            mask = raster.read(1, window=rio.windows.Window(0, start, width, stop - start)) > CRACK_THRESHOLD  # predict's own 0 / 255 mask
            own = slice(top - start, bottom - start)
            crack_pixels += int(mask[own].sum())
            valid_pixels += int((raster.dataset_mask(window=rio.windows.Window(0, top, width, bottom - top)) > 0).sum())
            if not measure:
                continue
            parts = crack_parts(mask, join_gap, own)
            first = len(nodes)
            for node in range(first, first + len(parts.area) - 1):
                nodes.add(node)
            sums.append(np.stack([parts.length, parts.gap, parts.area, parts.max_width, parts.fragments], axis=1)[1:])
            boxes.append(parts.box[1:] + np.array([start, 0, start, 0]))
            if with_links:
                links.append(skeleton_links(parts.skeleton, parts.labels, own) + np.array([start, 0, start, 0, first - 1]))
            if previous is not None:
                shared, above = previous
                below = parts.labels[: len(shared)]
                both = (shared > 0) & (below > 0)
                for a, b in np.unique(np.stack([shared[both], below[both]], axis=1), axis=0):
                    nodes.merge(above + int(a) - 1, first + int(b) - 1)
            previous = (parts.labels[max(0, bottom - halo) - start :], first)
    crack_pixels, valid_pixels = (crack_pixels, valid_pixels) if pixels is None else pixels
    counts = {"width": width, "height": height, "crack_fraction": round(crack_pixels / max(valid_pixels, 1), 6),
              "area_px": crack_pixels, "valid_px": valid_pixels, "crs": crs, "transform": transform}
    cracks, crack_of_node = _merged_cracks(nodes, sums, boxes, min_length)
    all_links = np.concatenate(links) if links else np.zeros((0, 5), np.int64)
    all_links[:, 4] = crack_of_node[all_links[:, 4]] if len(all_links) else 0
    return counts, cracks, all_links[all_links[:, 4] > 0]


def _merged_cracks(nodes: DisjointSet, sums: list[np.ndarray], boxes: list[np.ndarray],
                   min_length: float) -> tuple[list[CrackMeasure], np.ndarray]:
    """The cracks of the merged nodes, longest first, and each node's crack id (0: dropped)."""
    if not len(nodes):
        return [], np.zeros(0, int)
    sums_all, boxes_all = np.concatenate(sums), np.concatenate(boxes)
    roots = np.array([nodes[node] for node in range(len(nodes))])
    found = []
    for root in np.unique(roots):
        members = roots == root
        length, gap, area, _, fragments = sums_all[members].sum(axis=0)
        if area == 0:
            continue
        counted = boxes_all[members & (sums_all[:, 2] > 0)]  # the bands where the crack has pixels of its own
        box = (int(counted[:, 0].min()), int(counted[:, 1].min()), int(counted[:, 2].max()), int(counted[:, 3].max()))
        crack = crack_measure(0, float(length), float(gap), int(area), float(sums_all[members, 3].max()), box, int(fragments))
        if crack.length_px >= min_length:
            found.append((crack, root))
    found.sort(key=lambda item: (-item[0].length_px, item[0].bbox))
    crack_of_root = np.zeros(len(nodes), int)
    for number, (_, root) in enumerate(found, 1):
        crack_of_root[root] = number
    return [dataclasses.replace(crack, id=number) for number, (crack, _) in enumerate(found, 1)], crack_of_root[roots]
