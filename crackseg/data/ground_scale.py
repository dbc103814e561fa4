"""How long a map's units are on the ground where a raster lies.

A projection keeps lengths only along its true lines: UTM is within 0.1% of them across its zone, while Web Mercator
(EPSG:3857, web-map tiles and many orthomosaic exports) stretches them by 1 / cos(latitude), 1.6 times at 52 degrees.
A crack measured in map units would then be that much longer and wider than on the structure.
"""

from __future__ import annotations

import math

_WGS84_A, _WGS84_E2 = 6378137.0, 6.69437999014e-3  # semi-major axis (m), first eccentricity squared
_STEP_M = 1.0  # the short lines measured: small beside the projection's curvature, large beside rounding


def ground_scale(crs, transform, width: int, height: int) -> tuple[float, float] | None:
    """(ground / map length along the rows, along the columns) at the centre of a north-up raster in a projected
    ``crs`` (a rasterio CRS, ``transform`` its affine geotransform); None where PROJ cannot place it on the ground."""
    from rasterio.warp import transform as to_crs

    a, _, c, _, e, f = tuple(transform)[:6]
    x, y = c + a * width / 2, f + e * height / 2
    metres = crs.linear_units_factor[1]
    dx, dy = math.copysign(_STEP_M / metres, a), math.copysign(_STEP_M / metres, e)
    try:
        lons, lats = to_crs(crs, "EPSG:4326", [x, x + dx, x], [y, y, y + dy])
    except Exception:  # rasterio's CRS and PROJ errors have no common base; the map's own units are kept
        return None
    if not all(map(math.isfinite, (*lons, *lats))):
        return None
    return (_ground_metres(lons[0], lats[0], lons[1], lats[1]) / abs(dx * metres),
            _ground_metres(lons[0], lats[0], lons[2], lats[2]) / abs(dy * metres))


def _ground_metres(lon0: float, lat0: float, lon1: float, lat1: float) -> float:
    """The length on the WGS84 ellipsoid of a short line between two points in degrees (its local radii of curvature)."""
    phi = math.radians((lat0 + lat1) / 2)
    w = 1 - _WGS84_E2 * math.sin(phi) ** 2
    meridian, prime_vertical = _WGS84_A * (1 - _WGS84_E2) / w**1.5, _WGS84_A / math.sqrt(w)
    return math.hypot(meridian * math.radians(lat1 - lat0), prime_vertical * math.cos(phi) * math.radians((lon1 - lon0 + 180) % 360 - 180))
