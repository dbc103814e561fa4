"""Raster outputs: a georeferenced Cloud-Optimized GeoTIFF written by bands of rows, whatever the raster's size.

:class:`RasterSink` is the writing half of working by windows (:mod:`crackseg.data.rasters` reads): predict's output
rasters go out a band at a time, with the input's CRS, geotransform and valid pixels, and take their name only once
written whole. Needs the geo extra: ``pip install 'crackseg[geo]'``.
"""

from __future__ import annotations

import errno
from pathlib import Path

import numpy as np

from crackseg.core.errors import require
from crackseg.core.files import PendingFile
from crackseg.data.rasters import RasterSource, gdal_reason, rasterio

BLOCK = 512  # px: the side of an output GeoTIFF's tiles


class RasterSink:
    """A Cloud-Optimized GeoTIFF written by bands of rows: the whole of ``source``'s extent, or its ``rows`` (start, stop).

    The rows go to a tiled scratch GeoTIFF as they come; :meth:`commit` copies it into a COG (GDAL's COG driver) under
    a temporary name and moves that into place. A COG is read by windows over HTTP (object storage, GIS software), and
    its layout depends on the pixels alone, so outputs written in one pass, joined from parts (torchrun, Ray) or
    written from any band order are the same bytes. BigTIFF when the file may pass 4 GB; the CRS and geotransform of
    ``source``; invalid pixels in an internal mask band, so GIS software shows them as nodata; ``tags`` as GDAL
    metadata items.
    """

    def __init__(self, path: Path, source: RasterSource, dtype: str, rows: tuple[int, int] | None = None, tags: dict | None = None):
        rio = rasterio()
        start, stop = rows or (0, source.height)
        self.path = Path(path)
        self._file = PendingFile(self.path)
        self._scratch = PendingFile(self.path, ".tif")  # never committed: copied into the COG, then removed
        profile = dict(
            driver="GTiff", width=source.width, height=stop - start, count=1, dtype=dtype, crs=source.crs,
            transform=source.transform @ rio.Affine.translation(0, start), tiled=True, blockxsize=BLOCK, blockysize=BLOCK,
            compress="deflate", predictor=2, bigtiff="IF_SAFER",
        )
        self._dataset = rio.open(self._scratch.temp, "w", **profile)
        self._dataset.update_tags(**(tags or {}))  # GDAL metadata items, kept in the COG
        self._width = source.width
        self._written = 0  # rows in the file
        # Finished rows not yet a whole row of GeoTIFF tiles, then the band being filled block by block.
        self._values = np.zeros((0, source.width), dtype)
        self._valid = np.zeros((0, source.width), bool)
        self._held = 0  # finished rows

    def write_block(self, top: int, left: int, values: np.ndarray, valid: np.ndarray) -> None:
        """One block of a band of rows, in row-major order; whole rows of GeoTIFF tiles go to the file.

        Writing only complete tiles keeps each compressed tile written once. The rows wait in
        one buffer of fewer than BLOCK rows plus a band, so nothing of the width is copied twice.
        """
        rows, cols = values.shape
        if self._held + rows > len(self._values):
            self._values, self._valid = (np.concatenate([held[: self._held], np.zeros((BLOCK - 1 + rows - self._held, self._width), held.dtype)])
                                         for held in (self._values, self._valid))
        self._values[self._held : self._held + rows, left : left + cols] = values
        self._valid[self._held : self._held + rows, left : left + cols] = valid
        if left + cols == self._width:
            self._held += rows
            self._flush(whole_tiles=True)

    def _flush(self, whole_tiles: bool) -> None:
        rows = self._held // BLOCK * BLOCK if whole_tiles else self._held
        if rows:
            window = rasterio().windows.Window(0, self._written, self._width, rows)
            self._dataset.write(self._values[None, :rows], window=window)
            self._dataset.write_mask(self._valid[:rows], window=window)
            self._written += rows
            self._held -= rows
            self._values[: self._held] = self._values[rows : rows + self._held]
            self._valid[: self._held] = self._valid[rows : rows + self._held]

    def commit(self, overviews: bool = False) -> Path:
        """Finish the file as a COG (with overviews, halving down to one tile, if asked) and move it into place."""
        self._flush(whole_tiles=False)
        self._close()
        copy = require("rasterio.shutil", "geo", "writing GeoTIFFs").copy
        try:
            copy(self._scratch.temp, self._file.temp, driver="COG", BLOCKSIZE=BLOCK, COMPRESS="DEFLATE", PREDICTOR="YES",
                 BIGTIFF="IF_SAFER", OVERVIEWS="AUTO" if overviews else "NONE", RESAMPLING="NEAREST")
        except Exception as error:  # GDAL's CPLE_* errors, raised by the copy, have no public base class
            raise OSError(errno.EIO, f"{self.path}: the GeoTIFF was not written whole (is the disk full?): {gdal_reason(error)}") from None
        finally:
            self._scratch.abort()
        self._check_written()
        return self._file.commit()

    def _check_written(self) -> None:
        """Decode every tile of the closed file: libtiff reports a failed write (a full disk) on stderr
        only, and a torn GeoTIFF must never take the output's name."""
        rio = rasterio()
        try:
            with rio.open(self._file.temp) as written:
                for top in range(0, written.height, BLOCK):
                    window = rio.windows.Window(0, top, written.width, min(BLOCK, written.height - top))
                    written.read(1, window=window)
                    written.dataset_mask(window=window)
        except rio.errors.RasterioIOError as error:
            raise OSError(errno.EIO, f"{self.path}: the GeoTIFF was not written whole (is the disk full?): {gdal_reason(error)}") from None

    def abort(self) -> None:
        self._close()
        self._scratch.abort()
        self._file.abort()

    def _close(self) -> None:
        if not self._dataset.closed:
            self._dataset.close()
