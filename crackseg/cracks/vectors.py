"""Crack centrelines for GIS and CAD: one (multi)line feature per crack, as GeoJSON or GeoPackage.

A crack's centreline is its skeleton: links between 8-connected skeleton pixels (a diagonal
only where no orthogonal path joins the pair, as the length estimator counts them), merged
into lines by shapely. Coordinates are pixel centres, (col + 0.5, row + 0.5), mapped by the
raster's geotransform when it has one (with or without a CRS, as its mask GeoTIFF is placed), else left in pixels
(x right, y down). The
attributes are those of the crack's row in cracks.csv. Files are written by pyogrio (GDAL), each
with its default QGIS style (:mod:`crackseg.cracks.styles`): a GeoPackage in its ``layer_styles``
table, a GeoJSON as the ``.qml`` of its name beside it. For GeoPackages extended by SQL (the crack
register): geometry blobs as GDAL writes them, and the SQL functions its R-tree triggers call.

Needs the geo extra: ``pip install 'crackseg[geo]'``.
"""

from __future__ import annotations

import shutil
import sqlite3
import struct
import sys
import warnings
from pathlib import Path

import numpy as np

from crackseg.core.errors import require
from crackseg.core.files import PendingFile, readable, write_atomic
from crackseg.cracks.styles import layer_styles_columns, width_class_style
from crackseg.cracks.widths import WidthClasses

FORMATS = {"geojson": ("GeoJSON", ".geojson"), "gpkg": ("GPKG", ".gpkg")}
_DRIVERS = {suffix: driver for driver, suffix in FORMATS.values()}
_GP_EMPTY, _GP_ENVELOPE_XY = 0x11, 0x03  # GeoPackage blob flags, little-endian: an empty geometry / a geometry with its x, y box


def require_geo() -> None:
    """A one-line error before any work when the libraries that write vectors are missing."""
    _require("shapely")
    _require("pyogrio")


def _require(module: str):
    return require(module, "geo", "--vectors")


def skeleton_links(skeleton: np.ndarray, labels: np.ndarray, counted: slice = slice(None)) -> np.ndarray:
    """(N, 5) int64 rows (row0, col0, row1, col1, label) for the links whose first pixel lies in the ``counted`` rows."""
    s = skeleton
    rows = np.zeros(s.shape[0], bool)
    rows[counted] = True
    found = []
    for (dr, dc), present in [
        ((0, 1), s[:, :-1] & s[:, 1:]),
        ((1, 0), s[:-1, :] & s[1:, :]),
        ((1, 1), s[:-1, :-1] & s[1:, 1:] & ~s[:-1, 1:] & ~s[1:, :-1]),
        ((1, -1), s[:-1, 1:] & s[1:, :-1] & ~s[:-1, :-1] & ~s[1:, 1:]),
    ]:
        r, c = np.nonzero(present)
        c = c + (1 if dc < 0 else 0)  # the SW link's first pixel is the upper right one
        keep = rows[r]
        r, c = r[keep], c[keep]
        found.append(np.stack([r, c, r + dr, c + dc, labels[r, c]], axis=1))
    links = np.concatenate(found).astype(np.int64)
    return links[links[:, 4] > 0]


def centrelines(links: np.ndarray, transform=None) -> dict[int, object]:
    """{crack id: shapely (Multi)LineString} from links whose last column is the crack id."""
    shapely = _require("shapely")
    lines = {}
    order = np.argsort(links[:, 4], kind="stable")
    links = links[order]
    ids, starts = np.unique(links[:, 4], return_index=True)
    for crack, start, stop in zip(ids, starts, [*starts[1:], len(links)]):
        part = links[start:stop].astype(np.float64)
        segments = np.stack([part[:, [1, 0]] + 0.5, part[:, [3, 2]] + 0.5], axis=1)  # (x, y) = (col, row) centres
        if transform is not None:
            a, b, c, d, e, f = transform[:6]
            x, y = segments[..., 0].copy(), segments[..., 1].copy()
            segments[..., 0], segments[..., 1] = a * x + b * y + c, d * x + e * y + f
        lines[int(crack)] = shapely.line_merge(shapely.multilinestrings(segments))
    return lines


def write_vectors(path: Path, rows: list[dict], lines: dict[int, object], crs: str | None, classes: WidthClasses | None) -> None:
    """One feature per row of ``rows`` (cracks.csv rows of one image) with its centreline; replaces ``path`` whole.
    Styled by ``classes`` (the run's width classes) when the rows carry the class they grade, else as plain lines."""
    shapely = _require("shapely")
    empty = shapely.from_wkt("MULTILINESTRING EMPTY")
    features = [{**{k: v for k, v in row.items() if k != "path"}, "source": readable(row["path"])} for row in rows]
    graded = classes is not None and all(classes.graded_column in row for row in rows)
    write_features(path, features, [lines.get(row["crack"], empty) for row in rows], crs, "cracks",
                   width_class_style(classes if graded else None))


def write_features(path: Path, rows: list[dict], geometries: list, crs: str | None, layer: str, style: str) -> None:
    """One (multi)line feature per row, its attributes the row's values, in the format of ``path``'s suffix, with ``style``
    (QML) as its default QGIS style; replaces ``path`` (and its .qml: see :func:`layer_files`) whole."""
    shapely = _require("shapely")
    if crs and Path(path).suffix.lower() == ".geojson" and not crs.upper().startswith(("EPSG:", "OGC:")):
        print(f"crackseg: warning: {path}: GeoJSON names a CRS only by its EPSG code and this one has none ({crs[:60]}), so GIS "
              "tools will take its lines for WGS84 degrees; use --vectors gpkg, which keeps any CRS", file=sys.stderr)
    columns = list(rows[0]) if rows else ["crack"]
    data = [_field([row.get(column) for row in rows]) for column in columns]
    geometry = shapely.to_wkb([shapely.force_2d(line) for line in geometries]) if rows else np.array([], dtype=object)
    with PendingFile(Path(path), suffix=Path(path).suffix) as pending:  # GDAL picks the driver by the suffix
        pending.temp.unlink()  # GDAL creates the file itself
        write_layer(pending.temp, layer, dict(zip(columns, data)), np.asarray(geometry, dtype=object), crs, named=path)
        if _DRIVERS[Path(path).suffix.lower()] == "GPKG":
            write_styles(pending.temp, {layer: style}, named=path)
            for log in sqlite_logs(Path(path)):  # SQLite would replay the log of the file replaced onto this one
                log.unlink(missing_ok=True)
    for qml in layer_files(path)[1:]:  # a GeoJSON's style, beside it once it is whole
        write_atomic(qml, style)


def _field(values: list) -> np.ndarray:
    """A column as its layer field: text, whole numbers (ids, pixel counts, boxes: Integer, as cracks.csv joins them),
    or real numbers (a missing value is NaN)."""
    if any(isinstance(value, str) for value in values):
        return np.array(values, dtype=object)
    if all(isinstance(value, (int, np.integer)) and not isinstance(value, bool) for value in values):
        return np.array(values, dtype=np.int64)
    return np.array(values, dtype=np.float64)


def layer_files(path: Path) -> list[Path]:
    """The files :func:`write_features` writes for ``path``: itself, and for a GeoJSON the ``.qml`` of its name beside it
    (QGIS reads a file's default style there; a GeoPackage keeps its style inside)."""
    path = Path(path)
    return [path] if _DRIVERS[path.suffix.lower()] == "GPKG" else [path, path.with_suffix(".qml")]


def sqlite_logs(path: Path) -> list[Path]:
    """The files SQLite keeps beside a GeoPackage a program has open (QGIS editing it: ``-wal`` and ``-shm``; a
    rollback ``-journal``): left beside a file replaced or removed, a log would be replayed onto its successor."""
    return [path.with_name(path.name + suffix) for suffix in ("-wal", "-shm", "-journal")]


def write_styles(path: Path, styles: dict[str, str], named: Path | None = None) -> None:
    """Add QGIS's ``layer_styles`` table to the GeoPackage ``path`` (which has none yet): ``styles`` (QML by layer name) as
    each layer's default style, so that QGIS opens it styled. An attribute table keyed ``id``, as QGIS makes it."""
    pyogrio = require("pyogrio", "geo")
    rows = [(layer, pyogrio.read_info(path, layer=layer)["geometry_name"], qml) for layer, qml in styles.items()]
    _write(path, "layer_styles", layer_styles_columns(rows), named or path, append=True, layer_options={"FID": "id"})


def write_layer(path: Path, layer: str, columns: dict[str, np.ndarray], geometry: np.ndarray | None = None,
                crs: str | None = None, append: bool = False, named: Path | None = None) -> None:
    """Write one layer with pyogrio in the format of ``path``'s suffix (or add it to ``path`` with ``append``):
    (multi)line features, or an attribute table when ``geometry`` is None. GDAL's failures are the machine's,
    an OSError naming ``named`` (default ``path``)."""
    shape = {} if geometry is None else {"geometry_type": "MultiLineString", "promote_to_multi": True, "crs": crs}
    _write(path, layer, columns, named or path, geometry=geometry, append=append, **shape)


def _write(path: Path, layer: str, columns: dict[str, np.ndarray], named: Path, geometry: np.ndarray | None = None,
           **options) -> None:
    """pyogrio's write of one layer, read back.

    A full disk surfaces wherever SQLite or GDAL's buffers meet it: as any of pyogrio's errors (a GeoPackage:
    a feature, a table, a field that could not be written), or not at all (GeoJSON: the last buffered write
    fails as GDAL closes the file, and it says nothing). So the layer is read back: as many features as rows
    were written, or the file is not whole.
    """
    pyogrio = require("pyogrio", "geo")
    rows = len(next(iter(columns.values()), [])) if geometry is None else len(geometry)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "'crs' was not provided")  # photos: pixel coordinates have no CRS
        try:
            pyogrio.raw.write(path, geometry=geometry, field_data=list(columns.values()), fields=list(columns), layer=layer,
                              driver=_DRIVERS[Path(path).suffix.lower()], **options)
            found = pyogrio.read_info(path, layer=layer)["features"]
        except (pyogrio.errors.DataSourceError, pyogrio.errors.DataLayerError) as error:  # FeatureError, FieldError, ...
            said = str(error).splitlines()[0] if str(error) else type(error).__name__
            said = said if len(said) <= 200 else "..." + said[-200:]  # GDAL's reason ends the line, after its SQL
            raise OSError(f"{named}: {said}{_disk_full(path)}") from None
    if found != rows:
        raise OSError(f"{named}: {found} of {rows} features of layer {layer} were written{_disk_full(path)}")


def gpkg_geometry_blob(geometry, srs_id: int) -> bytes:
    """A MultiLineString as a GeoPackage geometry blob (as GDAL writes it): "GP", flags, srs_id, x, y box, then WKB;
    None or an empty line is the empty MultiLineString."""
    shapely = require("shapely", "geo")  # the register's too: not only --vectors
    line = shapely.MultiLineString() if geometry is None else shapely.force_2d(geometry)
    if line.geom_type == "LineString":
        line = shapely.MultiLineString([] if line.is_empty else [line])
    wkb = shapely.to_wkb(line, output_dimension=2, byte_order=1)
    if line.is_empty:
        return struct.pack("<2sBBi", b"GP", 0, _GP_EMPTY, srs_id) + wkb
    min_x, min_y, max_x, max_y = line.bounds
    return struct.pack("<2sBBi4d", b"GP", 0, _GP_ENVELOPE_XY, srs_id, min_x, max_x, min_y, max_y) + wkb


def gpkg_envelope(blob: bytes | None) -> tuple[float, float, float, float] | None:
    """(min x, max x, min y, max y) of a GeoPackage geometry blob, None when it is empty (or NULL)."""
    if blob is None or bytes(blob[:2]) != b"GP" or blob[3] & 0x10:
        return None
    if (blob[3] >> 1) & 0x07:  # the box is in the header
        return struct.unpack_from("<4d" if blob[3] & 1 else ">4d", blob, 8)
    geometry = require("shapely", "geo").from_wkb(bytes(blob[8:]))
    return None if geometry.is_empty else tuple(np.asarray(geometry.bounds)[[0, 2, 1, 3]])


def define_gpkg_functions(db: sqlite3.Connection) -> None:
    """The SQL functions a GeoPackage's R-tree triggers call (GDAL and QGIS define them; sqlite3 alone has none)."""
    for index, name in enumerate(("ST_MinX", "ST_MaxX", "ST_MinY", "ST_MaxY")):
        db.create_function(name, 1, lambda blob, i=index: (gpkg_envelope(blob) or (None,) * 4)[i], deterministic=True)
    db.create_function("ST_IsEmpty", 1, lambda blob: None if blob is None else int(gpkg_envelope(blob) is None), deterministic=True)


def _disk_full(path: Path) -> str:
    """'; its disk is full' when less than 1 MiB is left where ``path`` lies, else ''."""
    try:
        return "; its disk is full" if shutil.disk_usage(Path(path).parent).free < 2**20 else ""
    except OSError:
        return ""
