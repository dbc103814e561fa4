"""data: images and rasters on disk, datasets (pairing, checks, splits), synthetic data.

The one reader of photos, masks and GeoTIFFs; no torch at import (tensors are made where asked for).
May import crackseg.core.
"""
