"""Large rasters by windows: TIFF / GeoTIFF inputs of any size in (outputs: :mod:`crackseg.data.raster_sink`).

Reading goes through rasterio (GDAL) a window at a time, so a gigapixel orthomosaic is never whole in memory. What
predict needs from a raster:

- **pixels** as (3, rows, cols) uint8 RGB: grey rasters are repeated to three bands, a palette band is looked up in its
  colour table, a fourth band (alpha) is not fed to the model, and 16-bit data is scaled from its bit depth (the
  smallest of 8 to 16 bits that holds the raster's largest value, from GDAL's approximate statistics) to 8 bits;
- **valid pixels**: GDAL's dataset mask (nodata value, alpha band or mask band); invalid pixels reach the model as
  :data:`OUTSIDE_GREY`, whatever they hold, are not measured, and are masked in the outputs;
- **georeferencing**: CRS and geotransform, copied to every raster output; in a projected CRS the pixel size in
  millimetres comes from the geotransform, measured on the ground where the projection stretches lengths by more than
  1% (:mod:`crackseg.data.ground_scale`). Whether a TIFF lies on a map at all is :func:`open_on_map`'s to say (rasterio
  decides; without the geo extra, the GeoTIFF tags of its header), and :func:`map_facts` gives what a reader needs of one.

A raster in object storage (:class:`crackseg.core.storage.RemoteFile`) is read the same way, by windows through
GDAL's ``/vsis3/`` and ``/vsicurl/`` (:func:`open_raster`), never downloaded whole; :func:`gdal_settings` gives GDAL
the endpoint and retries that :mod:`crackseg.core.storage` uses.

Needs the geo extra: ``pip install 'crackseg[geo]'``.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from PIL import Image

from crackseg.core.errors import InputError, require
from crackseg.core.options import PX_SIZE
from crackseg.core.storage import RemoteFile, StorageError, gdal_options, gdal_path
from crackseg.core.urls import scrubbed
from crackseg.data.ground_scale import ground_scale
from crackseg.data.images import DECODE_ERRORS, eight_bit_factor
from crackseg.data.options import MAX_PIXELS, STREAM_ABOVE

if TYPE_CHECKING:
    import torch

OUTSIDE_GREY = 128  # what the model sees outside the survey: black or white there drew cracks along its edge
READ_AHEAD = 4096  # px: columns read from a raster at once (a run of 1024 rows holds 16 MB)
GEOTIFF_TAGS = frozenset({33550, 33922, 34264, 34735})  # ModelPixelScale, ModelTiepoint, ModelTransformation, GeoKeyDirectory
_UNDECODABLE = ("not recognized as being in a supported file format", "TIFF header", "Not a TIFF")  # GDAL read the bytes
_MAP_SCALE_KEPT = 0.01  # a map within 1% of the ground keeps its pixel size (UTM's 0.9996 stays 0.1 m, not 99.96 mm)
_READDIR = "GDAL_DISABLE_READDIR_ON_OPEN"  # its EMPTY_DIR keeps GDAL from looking for sidecar files in a store


def rasterio():
    """rasterio, or a one-line error naming the extra that installs it."""
    return require("rasterio", "geo", "reading and writing GeoTIFFs")


def on_map(raster) -> bool:
    """Whether a raster (a rasterio dataset or a RasterSource) is georeferenced: a CRS, and a geotransform other
    than the identity GDAL gives a plain TIFF."""
    return raster.crs is not None and not raster.transform.is_identity


def gdal_reason(error: Exception) -> str:
    """GDAL's own words for a failure, without credentials: rasterio raises "See previous exception" and chains the cause."""
    error = _gdal_cause(error)
    return scrubbed(str(error).splitlines()[0][:300]) if str(error) else type(error).__name__


def raster_tag(path: Path, name: str) -> str | None:
    """The metadata item ``name`` of the local GeoTIFF ``path`` (GDAL's default domain); None when it has none or cannot
    be opened."""
    rio = rasterio()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", rio.errors.NotGeoreferencedWarning)  # a mask of a raster without a CRS
            with rio.open(path) as raster:
                return raster.tags().get(name)
    except (rio.errors.RasterioError, OSError):
        return None


def unreadable_raster(path: Path) -> str | None:
    """Why the local GeoTIFF ``path`` cannot be read whole (GDAL's words), block by block; None when it can."""
    rio = rasterio()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", rio.errors.NotGeoreferencedWarning)  # a mask of a raster without a CRS
            with rio.open(path) as raster:
                for _, window in raster.block_windows(1):
                    raster.read(1, window=window)
    except (rio.errors.RasterioError, OSError) as error:
        return gdal_reason(error)
    return None


def _gdal_cause(error: Exception) -> Exception:
    while error.__cause__ is not None or error.__context__ is not None:
        error = error.__cause__ or error.__context__
    return error


def open_raster(path: Path | RemoteFile):
    """``path`` open in rasterio; a remote file through GDAL's virtual file systems (read by windows, never whole), its
    tiles decoded by one thread: GDAL's multi-threaded decoding fetches a window's bytes again even where its blocks are
    cached (2.8 times the file over HTTP, measured on a 600 x 700 px GeoTIFF), one thread fetches each byte once."""
    if isinstance(path, RemoteFile):  # no sidecar files looked for (a listing of the prefix, or a request for each)
        with rasterio().Env(**({} if _READDIR in os.environ else {_READDIR: "EMPTY_DIR"})):  # one set in the environment is kept
            return rasterio().open(gdal_path(path.url), NUM_THREADS="1")
    return rasterio().open(path)


def unreadable_in_store(path: Path | RemoteFile, error: Exception) -> StorageError | None:
    """Why GDAL could not open the remote file ``path`` (``error``: rasterio's) when the store is the cause: its answer
    (missing, denied, unreachable) as :mod:`crackseg.core.storage` says it, or GDAL's words where GDAL cannot fetch what
    the store serves (a server without range requests); None for a local file, or one whose bytes GDAL read and cannot
    decode (the photo reader says why). Any other failure is an error: a GeoTIFF read whole would lose its map."""
    if not isinstance(path, RemoteFile):
        return None
    path.check_readable()
    if any(words in str(_gdal_cause(error)) for words in _UNDECODABLE):
        return None
    return StorageError(path.url, f"cannot read: {gdal_reason(error)}")


def open_on_map(path: Path | None):
    """``path`` open in rasterio when it is a TIFF placed on a map (:func:`on_map`), else None; the caller closes it.

    One open tells it and serves the reading that follows. As predict tells rasters from photos: rasterio decides;
    without the geo extra a plain TIFF is simply not on a map (Pillow reads its header, nothing else), and one whose
    header holds GeoTIFF tags is a one-line error naming the extra. A TIFF that GDAL cannot open is not on a map
    unless its header says it is (then GDAL's error is raised).
    """
    if path is None or Path(path).suffix.lower() not in (".tif", ".tiff") or not Path(path).exists():
        return None
    try:
        rio = rasterio()
    except InputError:
        if _geotiff_header(path) is False:
            return None
        raise
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", rio.errors.NotGeoreferencedWarning)  # a plain TIFF: not on a map
            dataset = rio.open(path)
    except rio.errors.RasterioIOError:
        if _geotiff_header(path) is False:
            return None  # a plain TIFF GDAL does not read: the image reader reads it, or says why not
        raise
    if on_map(dataset):
        return dataset
    dataset.close()
    return None


def _geotiff_header(path: Path) -> bool | None:
    """Whether the TIFF's header holds GeoTIFF tags (Pillow, nothing decoded); None when Pillow cannot read it."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # only the header is read here
            with Image.open(path) as image:
                return bool(GEOTIFF_TAGS & set(getattr(image, "tag_v2", {})))
    except DECODE_ERRORS:
        return None


class _Run(NamedTuple):
    """Columns read at once by :meth:`RasterSource.read`: (3, rows, n) uint8 pixels from column ``left``, and their valid mask."""

    top: int
    rows: int
    left: int
    pixels: np.ndarray
    valid: np.ndarray

    @property
    def right(self) -> int:
        return self.left + self.valid.shape[1]


class RasterSource:
    """An open raster read by windows; use as a context manager."""

    def __init__(self, path: Path | RemoteFile, max_pixels: int = MAX_PIXELS, dataset=None):
        """Open ``path``, or take over ``dataset``, its rasterio dataset already open."""
        rio = rasterio()
        self.path = path if isinstance(path, RemoteFile) else Path(path)
        if dataset is None:
            try:
                dataset = open_raster(self.path)
            except rio.errors.RasterioIOError as error:
                raise InputError(f"{path}: not a readable raster ({gdal_reason(error)})") from None
        self._dataset = dataset
        self.height, self.width = dataset.height, dataset.width
        if self.height * self.width > max_pixels:
            self.close()
            raise InputError(f"{path}: {self.height * self.width / 1e6:,.0f} megapixels, over --max-pixels "
                             f"{max_pixels / 1e6:,.0f} megapixels; pass a larger --max-pixels to predict it")
        if dataset.dtypes[0] not in ("uint8", "uint16"):
            self.close()
            raise InputError(f"{path}: {dataset.dtypes[0]} pixels; crackseg reads 8- and 16-bit rasters (convert with gdal_translate -ot Byte -scale)")
        self._indexes = [1] if dataset.count < 3 else _rgb_bands(dataset)
        self._order = [0, 0, 0] if dataset.count < 3 else [0, 1, 2]  # grey is repeated to RGB; a 4th band is not fed
        self._palette = _palette(dataset) if dataset.count < 3 else None  # (entries, 3) RGB of a palette band's values
        if self._palette is not None:
            self._order = [0]
        self._scale = 1.0 if self._palette is not None else self._to_8_bits()
        self.crs = dataset.crs
        self.transform = dataset.transform
        self._run = None  # the columns last read, see read()

    def __enter__(self) -> RasterSource:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if not self._dataset.closed:
            self._dataset.close()

    @property
    def georeferenced(self) -> bool:
        return on_map(self)

    def px_size_mm(self) -> tuple[float | None, str | None]:
        """(millimetres per pixel on the ground, None or a note when that is not the map's pixel size), or (None, why not:
        the file and the reason) when the georeferencing gives no usable scale."""
        if self.crs is None and not self.transform.is_identity:
            return None, f"{self.path}: a geotransform without a CRS, so its units are unknown"
        if not self.georeferenced:
            return None, None
        if not self.crs.is_projected:
            return None, f"{self.path}: CRS {self.crs.to_string()} is not projected, so its pixels have no size in mm"
        a, b, _, d, e, _ = self.transform[:6]
        if b or d:
            return None, f"{self.path}: a rotated or sheared geotransform"
        if not math.isclose(abs(a), abs(e), rel_tol=0.01):
            return None, f"{self.path}: pixels are not square ({abs(a):g} x {abs(e):g})"
        on_map_mm = math.sqrt(abs(a * e)) * self.crs.linear_units_factor[1] * 1000.0  # within 1% of square: their mean side
        if PX_SIZE.problem(on_map_mm):
            return None, f"{self.path}: its georeferenced pixel size {on_map_mm:g} mm is not {PX_SIZE.describe()} mm"
        mm, note = on_map_mm, None
        scales = ground_scale(self.crs, self.transform, self.width, self.height)
        if scales is not None and max(abs(scale - 1) for scale in scales) > _MAP_SCALE_KEPT:
            if not math.isclose(*scales, rel_tol=0.01):
                return None, (f"{self.path}: CRS {self.crs.to_string()} does not keep its pixels square on the ground here "
                              f"({scales[0]:.3g} x {scales[1]:.3g} of their size on the map)")
            mm = on_map_mm * math.sqrt(scales[0] * scales[1])
            note = (f"{self.path}: CRS {self.crs.to_string()} stretches lengths by {on_map_mm / mm:.3g} here; its pixels are "
                    f"measured on the ground, {mm:.4g} mm ({on_map_mm:g} mm on the map)")
        if PX_SIZE.problem(mm):
            return None, f"{self.path}: its pixel size on the ground {mm:g} mm is not {PX_SIZE.describe()} mm"
        return mm, note

    def read(self, top: int, left: int, rows: int, cols: int) -> tuple[torch.Tensor, np.ndarray]:
        """A window: ((3, rows, cols) uint8 RGB, (rows, cols) bool valid pixels).

        Windows come from a run of READ_AHEAD columns read at once from a block boundary, and
        the next run keeps the columns two runs share: overlapping tiles read left to right
        then decode each GeoTIFF block of their rows once, in few calls.
        """
        run = self._run
        if run is None or (run.top, run.rows) != (top, rows) or not run.left <= left <= left + cols <= run.right:
            self._run = run = self._read_run(top, rows, left, cols)
        import torch  # here, so that what only opens rasters (compare) starts without loading torch

        start = left - run.left
        return torch.from_numpy(run.pixels[:, :, start : start + cols]), run.valid[:, start : start + cols]

    def _read_run(self, top: int, rows: int, left: int, cols: int) -> _Run:
        block = self._dataset.block_shapes[0][1]
        first = left // block * block
        end = min(self.width, max(first + READ_AHEAD, -(-(left + cols) // block) * block))
        old = self._run
        kept = old is not None and (old.top, old.rows) == (top, rows) and old.left <= first < old.right
        start = old.right if kept else first
        rio = rasterio()
        window = rio.windows.Window(start, top, end - start, rows)
        try:
            pixels = self._dataset.read(self._indexes, window=window)[self._order]
            valid = self._dataset.dataset_mask(window=window) > 0
        except rio.errors.RasterioIOError as error:
            cause = "the store stopped answering?" if isinstance(self.path, RemoteFile) else "a damaged file?"
            raise InputError(f"{self.path}: rows {top}-{top + rows}, columns {start}-{end} cannot be decoded "
                             f"({cause}): {gdal_reason(error)}") from None
        if self._palette is not None:
            pixels = self._palette[pixels[0]].transpose(2, 0, 1)
        elif self._scale != 1:
            pixels = np.minimum(pixels.astype(np.float32) * self._scale + 0.5, 255).astype(np.uint8)
        pixels = np.where(valid, pixels, np.uint8(OUTSIDE_GREY))
        if kept:
            pixels = np.concatenate([old.pixels[:, :, first - old.left :], pixels], axis=2)
            valid = np.concatenate([old.valid[:, first - old.left :], valid], axis=1)
        return _Run(top, rows, first, np.ascontiguousarray(pixels, dtype=np.uint8), valid)

    def _to_8_bits(self) -> float:
        """The factor from the raster's values to 0..255: its bit depth, from GDAL's approximate statistics."""
        if self._dataset.dtypes[0] == "uint8":
            return 1.0
        with rasterio().Env(GDAL_PAM_ENABLED="NO"), open_raster(self.path) as apart:  # statistics never written beside it
            return eight_bit_factor(max(stats.max for stats in apart.stats(indexes=self._indexes, approx=True)))


def _rgb_bands(dataset) -> list[int]:
    """The red, green and blue bands by their colour interpretation (a BGR export, a multispectral ortho), else 1-3."""
    named = [interp.name for interp in dataset.colorinterp]
    if all(colour in named for colour in ("red", "green", "blue")):
        return [named.index(colour) + 1 for colour in ("red", "green", "blue")]
    return [1, 2, 3]


def _palette(dataset) -> np.ndarray | None:
    """The RGB of each value of a palette (colour-mapped) first band, as a lookup table; None for other rasters."""
    if dataset.colorinterp[0] != rasterio().enums.ColorInterp.palette:
        return None
    colours = dataset.colormap(1)
    table = np.zeros((np.iinfo(dataset.dtypes[0]).max + 1, 3), np.uint8)
    for value, colour in colours.items():
        table[value] = colour[:3]
    return table


@dataclass(frozen=True)
class MapFacts:
    """Where a raster's pixels lie on the map, from its header."""

    width: int
    height: int
    transform: tuple[float, ...]  # GDAL's a, b, c, d, e, f: pixel (col, row) edges -> map (x, y)
    crs: str
    px_size_mm: float | None  # None where the georeferencing gives no size in mm (RasterSource.px_size_mm says why)


def map_facts(path: Path, dataset, max_pixels: int = MAX_PIXELS) -> MapFacts:
    """The facts of ``path``, open on the map as ``dataset`` (from :func:`open_on_map`; closed here), once it passes
    RasterSource's checks (at most ``max_pixels``, 8- or 16-bit pixels)."""
    with RasterSource(path, max_pixels, dataset) as source:
        return MapFacts(source.width, source.height, tuple(source.transform)[:6], source.crs.to_string(), source.px_size_mm()[0])


def gdal_settings():
    """GDAL as predict uses it: mask bands inside the GeoTIFF, a block cache of fixed size (GDAL's default, 5% of RAM,
    would let memory grow with the raster up to that), tiles decoded by as many threads as torch computes with (reading
    and the model take turns, so the cores would idle otherwise), and the store's endpoint, retries and cache
    (:func:`crackseg.core.storage.gdal_options`). Files beside an input are read (a world file, ``.aux.xml``, ``.msk``)."""
    import torch

    return rasterio().Env(GDAL_TIFF_INTERNAL_MASK=True, GDAL_CACHEMAX=64,
                          GDAL_NUM_THREADS=str(torch.get_num_threads()), **gdal_options())


def open_if_streamed(path: Path | RemoteFile, max_pixels: int = MAX_PIXELS) -> tuple[RasterSource | None, str | None]:
    """The open source of ``path`` when it is predicted by windows: a TIFF that is georeferenced (a
    CRS or a geotransform), has pixels outside the survey (a nodata value, alpha or a mask band, which a photo would
    predict and count) or is larger than STREAM_ABOVE; None for other images, which are decoded whole, as photos.
    A TIFF in object storage is told apart by GDAL reading its header there (run under ``gdal_settings``).
    With it, a note when the TIFF is placed on the map by ground control points alone, which no output carries.

    Without the geo extra, such a TIFF is a one-line error naming it: read whole it would lose its georeferencing, or
    its size. Too many pixels or an unsupported pixel type is one too, as is a remote TIFF the store does not serve.
    """
    if path.suffix.lower() not in (".tif", ".tiff"):
        return None, None
    try:
        rio = rasterio()
    except InputError as error:
        if isinstance(path, RemoteFile) or _geotiff_or_large(path):
            raise InputError(f"{path}: a GeoTIFF or a TIFF over {STREAM_ABOVE / 1e6:.0f} megapixels is read by windows "
                             f"(and a TIFF in object storage is told apart by GDAL); {error}") from None
        return None, None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", rio.errors.NotGeoreferencedWarning)  # a plain TIFF: read as a photo
            dataset = open_raster(path)
    except rio.errors.RasterioIOError as error:
        failure = unreadable_in_store(path, error)
        if failure:
            raise failure from None
        return None, None  # not a TIFF GDAL reads: the photo path reports what is wrong with it
    placed = dataset.crs is not None or not dataset.transform.is_identity  # a CRS, or a geotransform without one
    note = None
    if not placed and dataset.gcps[0]:
        note = (f"{path}: placed on the map by ground control points only, which crackseg does not carry: its outputs "
                "are not on the map (gdalwarp it onto a geotransform first)")
    outside = any(flags != [rio.enums.MaskFlags.all_valid] for flags in dataset.mask_flag_enums)  # nodata, alpha or mask band
    if not (placed or outside or dataset.width * dataset.height > STREAM_ABOVE):
        dataset.close()
        return None, note
    return RasterSource(path, max_pixels, dataset), note


def _geotiff_or_large(path: Path) -> bool:
    """From the TIFF header alone (Pillow, nothing decoded): georeferencing tags, or more pixels than STREAM_ABOVE."""
    try:
        with Image.open(path) as image:
            return bool(GEOTIFF_TAGS & set(getattr(image, "tag_v2", {}))) or image.width * image.height > STREAM_ABOVE
    except (OSError, ValueError):  # not a TIFF Pillow reads: the photo path reports what is wrong with it
        return False
