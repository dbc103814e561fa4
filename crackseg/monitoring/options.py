"""The options of ``crackseg compare``, as the CLI gives them to the run (:mod:`crackseg.monitoring.compare`) and the
run to each pair (:mod:`crackseg.monitoring.pair`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CompareOptions:
    px_size: float | None = None  # mm per pixel of the AFTER photos (rasters: their own georeferencing where it has a scale)
    width_classes: str | None = None
    pairs: Path | None = None  # CSV of before,after paths
    vectors: str | None = None  # geojson or gpkg
    report: bool = False
    register: Path | None = None  # the site's GeoPackage
    dates: tuple[str | None, str | None] = (None, None)  # --before-date, --after-date
    transform: str = "similarity"  # the model photos are registered with
    overwrite: bool = False
