"""The options of ``crackseg compare``, as the CLI gives them to the run (:mod:`crackseg.monitoring.compare`) and the
run to each pair (:mod:`crackseg.monitoring.pair`), and the registration transforms it offers; no torch, no
scikit-image."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from crackseg.core.errors import InputError
from crackseg.core.options import REQUIRED, Options, group, option
from crackseg.cracks import options as measurement


@dataclass(frozen=True)
class Transform:
    """How BEFORE photos may differ from AFTER ones: scikit-image's ``skimage_class`` (in skimage.transform), fitted
    from at least ``samples`` matches."""

    help: str | None
    skimage_class: str
    samples: int


TRANSFORMS = {
    "similarity": Transform("shift, rotation, scale", "SimilarityTransform", 2),
    "affine": Transform(None, "AffineTransform", 3),
    "homography": Transform("another viewpoint on a plane", "ProjectiveTransform", 4),
}
_TRANSFORMS_HELP = [f"{name} ({transform.help})" if transform.help else name for name, transform in TRANSFORMS.items()]


@dataclass(frozen=True)
class CompareOptions(Options):
    before: str = option(REQUIRED, "the earlier inspection: a predictions folder or a dataset folder (or its s3:// prefix)",
                         positional=True)
    after: str = option(REQUIRED, "the later inspection, the same kinds", positional=True)
    out: str = option(REQUIRED, "folder (or s3:// prefix) for changes.csv, pairs.csv, summary.json (created if missing)")
    scale: measurement.Scale = group(measurement.Scale, helps={
        "px_size": "mm per pixel of the AFTER photos: widths and lengths also in mm (BEFORE photos through the "
                   "registration's scale); georeferenced rasters use their own pixel size",
        "width_classes": measurement.width_classes_help(
            "report each crack's class before and after and whether it changed, by the width the standard grades "
            "(changes.csv: max_width_class_before/after, or mean_width_class_before/after for a standard grading mean "
            "width)")})
    pairs: Path | None = option(None, "CSV with a header 'before,after': the photo paths (or names) to pair")
    transform: str = option("similarity", f"how photos may differ: {', '.join(_TRANSFORMS_HELP[:-1])}, or {_TRANSFORMS_HELP[-1]}",
                            choices=TRANSFORMS)
    vectors: str | None = measurement.vectors(
        "also write OUT/vectors/<name>.geojson|gpkg: each crack's centreline with its status (gone cracks: their BEFORE "
        "centreline), in map coordinates for rasters, else the AFTER image's pixels")
    report: bool = option(False, "also write OUT/report.html: each pair side by side, cracks coloured by status")
    register: Path | None = option(None, "a GeoPackage crack register of the site (created if missing): adds both surveys, "
                                         "their cracks and the links between a crack and its successor (see docs/compare.md)")
    before_date: str | None = option(None, "date of the BEFORE survey, YYYY-MM-DD (default: the EXIF DateTimeOriginal of its "
                                           "photos)")
    after_date: str | None = option(None, "date of the AFTER survey, YYYY-MM-DD (default: from EXIF, as for BEFORE)")
    overwrite: bool = option(False, "replace the tables of an earlier compare in --out")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.register is None and (self.before_date or self.after_date):
            raise InputError("--before-date and --after-date date the surveys of --register SITE.gpkg; give --register too")

    @property
    def dates(self) -> tuple[str | None, str | None]:
        return self.before_date, self.after_date
