"""Crack probabilities for a stream of images of any size: tiling, cross-image batching, blending, TTA.

Images are never resized by default. One that fits in a tile runs whole (padded by the
model to its size divisor); a larger one runs as overlapping tiles blended with weights
that ramp down across the overlap, so no seam shows. Tiles of the same shape from
different images share batches, and only tiles of one shape are ever batched together,
so an image's result does not depend on what it was batched with. Tiles are cut lazily
and each image holds two float maps (weighted sum, weights), so a huge photo never has
all its tiles in memory. Used by ``predict``, ``evaluate`` and training's validation,
so all three score an image the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from crackseg.model.options import InferenceOptions
from crackseg.core.errors import InputError


@dataclass
class _Job:
    """One image in flight: its tiles still to run and the maps they blend into."""

    key: int
    height: int
    width: int
    tiles: list = field(default_factory=list)  # (top, left, height, width)
    remaining: int = 0
    total: torch.Tensor | None = None
    weights: torch.Tensor | None = None
    prob: torch.Tensor | None = None


def tile_starts(length: int, tile: int, overlap: int) -> list[int]:
    """Tile origins along one axis: the fewest tiles that overlap by at least ``overlap``, spread
    evenly from 0 to flush with the end. Even spacing keeps every overlap close to ``overlap``
    (a fixed stride leaves the last two tiles sharing up to a whole tile), which is what a
    raster predicted by windows holds across its width."""
    if length <= tile:
        return [0]
    count = math.ceil((length - tile) / (tile - overlap)) + 1
    return [index * (length - tile) // (count - 1) for index in range(count)]


def part_rows(height: int, tile: int, overlap: int, part: tuple[int, int]) -> tuple[int, int]:
    """The rows [start, stop) that ``part`` (index, count) of :meth:`Predictor.blocks` yields: a share of
    whole tile rows, each tile row owning the rows from its top to the next one's."""
    tops = tile_starts(height, tile, overlap)
    index, count = part
    first, last = len(tops) * index // count, len(tops) * (index + 1) // count
    bounds = tops + [height]
    return bounds[first], bounds[last]


def blend_weights(height: int, width: int, overlap: int) -> torch.Tensor:
    """(H, W) weights: 1 inside, ramping linearly to a small positive value over ``overlap`` px."""
    def ramp(n: int) -> torch.Tensor:
        position = torch.arange(n, dtype=torch.float32)
        edge = torch.minimum(position + 0.5, n - position - 0.5)
        return (edge / max(overlap, 1)).clamp(0.01, 1.0)

    return ramp(height)[:, None] * ramp(width)[None, :]


class Predictor:
    """Crack probabilities for a stream of images, with tiling, cross-image batching and TTA."""

    def __init__(self, model, device: torch.device, options: InferenceOptions = InferenceOptions(),
                 amp_dtype: torch.dtype | None = None):
        """``model``: a CrackSegModel (logits) or a :class:`crackseg.model.runtimes.RuntimeModel` (probabilities),
        on ``device``; ``amp_dtype``: the autocast of a torch model (see :func:`crackseg.model.runtimes.load_runtime`)."""
        self.model = model
        self.device = device
        self.tile = options.tile
        self.overlap = options.overlap
        # On CPU one image per pass ran faster per image than batches (docs/benchmarks.md).
        self.batch_size = options.batch_size or (8 if device.type == "cuda" else 1)
        self.tta = options.tta
        self.amp_dtype = amp_dtype
        self.channels_last = options.channels_last
        self.resize = options.resize
        self._windows: dict[tuple[int, int], torch.Tensor] = {}
        # one shape for the compiler: a batch of whole tiles (a short one padded), so it compiles once
        self._compiled = torch.compile(model, dynamic=False) if options.compile else None
        self._compiled_shape = (self.batch_size, 3, self.tile, self.tile)

    def probabilities(self, images):
        """``images``: iterable of (key, (3, H, W) uint8). Yields (key, (H, W) float32 probabilities on CPU)."""
        return self._predict(images, None)

    def masks(self, images, threshold: float):
        """(key, (H, W) bool crack mask on CPU): :meth:`probabilities` ``>= threshold``, thresholded where the model
        runs for an image that is one tile at its own size, so a GPU sends back a quarter of the bytes."""
        return self._predict(images, threshold)

    def _predict(self, images, threshold: float | None):
        jobs: dict[int, _Job] = {}
        pending: dict[tuple[int, int], list] = {}  # tile shape -> [(job, tile, pixels)]
        for key, image in images:
            original = image.shape[-2:]
            if self.resize is not None:
                image = F.interpolate(image[None].float(), size=self.resize, mode="bilinear", antialias=True)[0].round().clamp(0, 255).byte()
            job = self._start(key, image, original)
            jobs[key] = job
            for tile in job.tiles:
                top, left, height, width = tile
                pending.setdefault((height, width), []).append((job, tile, image[:, top : top + height, left : left + width]))
                if len(pending[(height, width)]) == self.batch_size:
                    yield from self._run(pending.pop((height, width)), jobs, threshold)
            while len(jobs) > 2 * self.batch_size + 2 and pending:  # bound the images held: run partial batches
                yield from self._run(pending.pop(max(pending, key=lambda s: len(pending[s]))), jobs, threshold)
        for shape in list(pending):
            yield from self._run(pending.pop(shape), jobs, threshold)

    @torch.inference_mode()
    def blocks(self, read, height: int, width: int, part: tuple[int, int] = (0, 1)):
        """Probabilities of one image too large to hold, a finished block at a time.

        ``read(top, left, rows, cols)`` gives ((3, rows, cols) uint8, (rows, cols) bool valid
        pixels). Yields (top, left, (rows, cols) float32 probabilities, valid) for blocks in
        the tiles' row-major order, each as soon as no later tile covers it. The tiles, their
        blending and its order are those of :meth:`probabilities`, so the values are the same
        bits. Held meanwhile: one tile's maps, and for the whole width only the rows a tile
        row shares with the rows above and below (the overlap). ``floats_held`` records the
        peak count of floats. Tiles with no valid pixel are not run: their probability is 0.

        ``part`` (index, count) yields only the rows of :func:`part_rows`, for processes that
        share one image; the tile rows above them that reach into them are run too, unyielded,
        so each part has the same bits as the whole.
        """
        if self.resize is not None:
            raise InputError("--resize cannot be used with rasters predicted by windows; leave it out")
        tops, lefts = tile_starts(height, self.tile, self.overlap), tile_starts(width, self.tile, self.overlap)
        tile_height, tile_width = min(self.tile, height), min(self.tile, width)
        start, stop = part_rows(height, self.tile, self.overlap, part)
        # One tile: its probabilities as they are (0 + x * 1 == x, x / 1 == x), as probabilities() returns them.
        single = len(tops) == 1 and len(lefts) == 1
        window = torch.ones((tile_height, tile_width)) if single else self._window(tile_height, tile_width)
        carry = torch.zeros((2, 0, width))  # weighted sums and weights of the rows shared with the tile row above
        self.floats_held = 0
        for row, top in enumerate(tops):
            if top + tile_height <= start or top >= stop:
                continue
            done = (tops[row + 1] if row + 1 < len(tops) else height) - top
            own = top >= start  # a tile row above the part only adds to the part's first rows
            shared = carry.shape[1]
            below = torch.zeros((2, tile_height - done, width))
            band = torch.zeros((2, tile_height, tile_width))
            band[:, :shared] = carry[:, :, : tile_width]
            self.floats_held = max(self.floats_held, carry.numel() + below.numel() + band.numel())
            for first in range(0, len(lefts), self.batch_size):
                group = lefts[first : first + self.batch_size]
                reads = [read(top, left, tile_height, tile_width) for left in group]
                running = [k for k, (_, valid) in enumerate(reads) if valid.any()]
                probs = self._tta_probabilities(torch.stack([reads[k][0] for k in running]).to(self.device)).cpu() if running else []
                tile_probs = dict(zip(running, probs))
                for k, left in enumerate(group):
                    if k in tile_probs:
                        band[0] += tile_probs[k] * window
                        band[1] += window
                    index = first + k
                    end = lefts[index + 1] if index + 1 < len(lefts) else width
                    cols = end - left
                    if own:
                        total, weights = band[0, :done, :cols], band[1, :done, :cols]
                        covered = weights > 0
                        yield top, left, torch.where(covered, total / torch.where(covered, weights, 1.0), 0.0), reads[k][1][:done, :cols]
                    below[:, :, left:end] = band[:, done:, :cols]
                    if end < width:  # slide the band right by cols: the new columns start from the rows shared above
                        band = torch.cat([band[:, :, cols:], torch.zeros((2, tile_height, cols))], dim=2)
                        band[:, :shared, tile_width - cols :] = carry[:, :, left + tile_width : end + tile_width]
            carry = below

    def _start(self, key: int, image: torch.Tensor, original) -> _Job:
        height, width = image.shape[-2:]
        job = _Job(key, *original)
        job.tiles = [
            (top, left, min(self.tile, height), min(self.tile, width))
            for top in tile_starts(height, self.tile, self.overlap)
            for left in tile_starts(width, self.tile, self.overlap)
        ]
        job.remaining = len(job.tiles)
        if len(job.tiles) > 1:
            job.total = torch.zeros((height, width), dtype=torch.float32)
            job.weights = torch.zeros((height, width), dtype=torch.float32)
        return job

    @torch.inference_mode()
    def _run(self, batch: list, jobs: dict[int, _Job], threshold: float | None):
        pixels = torch.stack([tile_pixels for _, _, tile_pixels in batch]).to(self.device, non_blocking=True)
        probs = self._tta_probabilities(pixels)
        if threshold is not None and all(job.total is None and (job.height, job.width) == probs.shape[-2:] for job, _, _ in batch):
            probs = probs >= threshold  # nothing left to blend or resize: the mask is final here
        probs = probs.cpu()
        for (job, (top, left, height, width), _), prob in zip(batch, probs):
            if job.total is None:
                job.prob = prob
            else:
                window = self._window(height, width)
                job.total[top : top + height, left : left + width] += prob * window
                job.weights[top : top + height, left : left + width] += window
            job.remaining -= 1
            if job.remaining == 0:
                del jobs[job.key]
                yield job.key, self._finish(job, threshold)

    def _finish(self, job: _Job, threshold: float | None) -> torch.Tensor:
        prob = job.prob if job.total is None else job.total / job.weights
        if prob.dtype == torch.bool:  # thresholded on the device
            return prob
        if prob.shape != (job.height, job.width):
            prob = F.interpolate(prob[None, None], size=(job.height, job.width), mode="bilinear")[0, 0]
        return prob if threshold is None else prob >= threshold

    def _window(self, height: int, width: int) -> torch.Tensor:
        if (height, width) not in self._windows:
            self._windows[(height, width)] = blend_weights(height, width, self.overlap)
        return self._windows[(height, width)]

    def _forward(self, view: torch.Tensor) -> torch.Tensor:
        """The model's output for ``view``: compiled for a batch of whole tiles, as it is for any other shape."""
        count = len(view)
        if self._compiled is None or count > self.batch_size or tuple(view.shape[1:]) != self._compiled_shape[1:]:
            return self.model(view)
        if count < self.batch_size:  # each image's output depends on its own pixels alone (eval mode)
            view = torch.cat([view, view.new_zeros((self.batch_size - count, *view.shape[1:]))])
        return self._compiled(view)[:count]

    def _tta_probabilities(self, pixels: torch.Tensor) -> torch.Tensor:
        """(N, H, W) probabilities, averaged over the flips / rotations that ``tta`` names."""
        views = {"none": [(0, False)], "flip": [(0, False), (0, True)], "d4": [(k, f) for k in range(4) for f in (False, True)]}
        total = None
        for turns, flip in views[self.tta]:
            view = torch.rot90(pixels, turns, dims=(-2, -1)) if turns else pixels
            view = view.flip(-1) if flip else view
            if self.channels_last:
                view = view.contiguous(memory_format=torch.channels_last)
            with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
                output = self._forward(view)
            # Exported models (crackseg.model.runtimes.RuntimeModel) return probabilities, torch models logits.
            prob = (output.float() if getattr(self.model, "returns_probabilities", False) else torch.sigmoid(output.float()))[:, 0]
            prob = prob.flip(-1) if flip else prob
            prob = torch.rot90(prob, -turns, dims=(-2, -1)) if turns else prob
            total = prob if total is None else total + prob
        return total / len(views[self.tta])
