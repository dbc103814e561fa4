"""The options of ``crackseg synth``, and the limits of the rasters every command reads; no numpy, so the command line
starts without it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from crackseg.core.options import AT_LEAST_ONE, FRACTION, NON_NEGATIVE, REQUIRED, Options, group, option, parse_size

CRACK_FREE_FRACTION = 0.15  # of synthetic images, the demo data's default
MAX_PIXELS = 20_000_000_000  # predict's default --max-pixels: rasters larger than this are refused
STREAM_ABOVE = 64_000_000  # px: TIFFs larger than this (or georeferenced) are read by windows


@dataclass(frozen=True)
class SynthOptions(Options):
    """What a synthetic dataset holds besides its count, size and seed; the defaults give the demo data."""

    truth: bool = option(False, "also write truth.json (each crack's nominal length and width in px) and truth/<stem>.png (each "
                                "crack pixel labelled with its crack's number)")
    crack_free: float = option(CRACK_FREE_FRACTION, "share of images with no crack, in [0, 1]", valid=FRACTION, metavar="FRACTION")
    hard_negatives: bool = option(False, "draw 1-4 unlabelled crack look-alikes of random kinds on every image: paving-stone and "
                                         "tile joints, cast shadows and dark openings, road paint, stains, plant stems and "
                                         "leaves, dark frame edges, watermark bars and vignetting; masks still label crack "
                                         "pixels only")


@dataclass(frozen=True)
class SynthCommand(Options):
    """``crackseg synth``: a synthetic dataset, or a later visit of one."""

    out: Path = option(REQUIRED, "output folder (created if missing)", positional=True)
    count: int = option(64, "number of images", valid=AT_LEAST_ONE)
    size: tuple[int, int] = option((256, 256), "image size in px: N or HxW (height x width)", unit="px", parse=parse_size,
                                   shown="256")
    seed: int = option(0, "random seed", valid=NON_NEGATIVE)
    options: SynthOptions = group(SynthOptions)
    workers: int = option(1, "processes generating images in parallel", valid=AT_LEAST_ONE)
    overwrite: bool = option(False, "replace files already in OUT")
    later_visit: Path | None = option(
        None, "instead, write a later inspection of the spots of EARLIER (a dataset written by crackseg synth) under the same "
        "names: the camera moved a little, some cracks grew wider or longer, some were repaired, now and then a new one "
        "appeared; OUT/truth.json lists these true changes per image (--count, --size, --truth, --crack-free and "
        "--hard-negatives do not apply)", metavar="EARLIER")
