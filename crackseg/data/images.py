"""Photos and masks read as viewers show them: the one reader for training, prediction and evaluation.

- **Orientation**: a JPEG's EXIF Orientation tag is applied on load, so a phone photo
  stored 64x32 with Orientation 6 is read as the 32x64 image every viewer (and every
  labelling tool) shows, and masks traced on it line up.
- **Mask values**: 0 = background, grey levels above 127 = crack; a mask whose only
  values are 0 and 1 (with some 1) is a 0/1 mask and is read as 0/255, also in 16 bits, where
  0/255 is a mask as well. Other 16-bit masks and probability maps are scaled to 8 bits
  first, floating-point ones (TIFFs) hold values in [0, 1]; predict's probability maps are
  marked as such. A mask in colour (channels more than COLOUR_SPREAD apart) is refused,
  naming its colours, rather than read as grey levels that would hide a red or green crack.
  A mask with transparency is read as shown over black (a crack painted on a transparent layer).
- **Photo depth**: 8- and 16-bit photos are read; floating-point ones and 32-bit ones beyond 16 bits are refused naming
  their pixels, as rasters of them are, rather than clipped by Pillow's conversion to black or white.
- **Size limit**: Pillow refuses images over its decompression-bomb limit
  (twice ``Image.MAX_IMAGE_PIXELS``, past which it only warns); that is reported as a one-line error naming the file and
  how to convert it for prediction (large TIFFs are read by windows, crackseg.data.rasters).
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from crackseg.core.storage import RemoteFile

if TYPE_CHECKING:
    import torch

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff")
# photo formats a folder may hold that crackseg does not read: said, so that no photo is left out unnoticed
OTHER_PHOTO_SUFFIXES = (".gif", ".webp", ".avif", ".heic", ".heif", ".jp2", ".j2k", ".jfif", ".jpe", ".jxl", ".pgm", ".ppm",
                        ".pnm", ".tga", ".psd", ".dng", ".cr2", ".cr3", ".nef", ".arw", ".orf", ".rw2", ".raf")
PROBABILITY_MARK = ("crackseg", "probabilities")  # predict's probability maps: a PNG text chunk, a GeoTIFF metadata item
# How the files of those kinds begin: JPEG, PNG, BMP, TIFF and BigTIFF in either byte order
_PICTURE_SIGNATURES = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"BM", b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")
_HEADER_BYTES = 64 * 1024
CRACK_THRESHOLD = 127  # mask grey levels above this are crack
FAINT_LEVELS = 16  # a mask brightest below this, yet above 1, is a lossy 0/1 mask or class numbers, not 0/255
COLOUR_SPREAD = 32  # levels between a pixel's channels beyond which a mask is in colour (JPEG noise stays below)
_TRANSPOSED = (5, 6, 7, 8)  # EXIF orientations that swap width and height
_CONVERT = "(convert with gdal_translate -ot Byte -scale IN OUT.tif)"
_TIFF_WIDTH, _TIFF_LENGTH = 256, 257  # the TIFF tags of the stored pixels' size
# What Pillow raises for a file it cannot decode; SyntaxError is its "broken PNG file" and the like
DECODE_ERRORS = (OSError, UnidentifiedImageError, ValueError, SyntaxError, Image.DecompressionBombError)


def describe_error(error: Exception) -> str:
    """A short reason for a file that cannot be read, for one-line messages."""
    if isinstance(error, UnidentifiedImageError):
        return "not a readable image (empty, or another kind of file)"
    if isinstance(error, FileNotFoundError):
        return "file not found"
    if isinstance(error, Image.DecompressionBombError):
        limit = 2 * (Image.MAX_IMAGE_PIXELS or 0) / 1e6  # where Pillow raises
        return (f"over the limit of {limit:.0f} megapixels for an image decoded whole (to predict it, convert it to a tiled "
                "GeoTIFF, which predict reads by windows: gdal_translate -co TILED=YES -co COMPRESS=DEFLATE IN OUT.tif)")
    if isinstance(error, PixelValueError):
        return str(error)
    return f"cannot decode: {error}"


def orientation(image: Image.Image) -> int:
    """The EXIF Orientation tag (1 = as stored)."""
    try:
        return int(image.getexif().get(0x0112, 1))
    except (ValueError, TypeError, SyntaxError):  # a malformed EXIF block: use the stored pixels
        return 1


def stored_size(image: Image.Image) -> tuple[int, int]:
    """(width, height) of the pixels as the file stores them: a TIFF's from its tags, since Pillow reports an oriented
    TIFF at its displayed size (and turns it as it loads)."""
    tags = getattr(image, "tag_v2", None)
    if image.format == "TIFF" and tags is not None and _TIFF_WIDTH in tags and _TIFF_LENGTH in tags:
        return int(tags[_TIFF_WIDTH]), int(tags[_TIFF_LENGTH])
    return image.size


def displayed_size(image: Image.Image) -> tuple[int, int]:
    """(width, height) as viewers show the image, from its header (nothing decoded)."""
    width, height = image.size
    turned = (width, height) == stored_size(image) and orientation(image) in _TRANSPOSED  # not yet reported turned
    return (height, width) if turned else (width, height)


def open_picture(path: Path | RemoteFile | BinaryIO) -> Image.Image:
    """``Image.open`` of a file on disk, an open binary file, or a file in object storage (downloaded whole into memory,
    never to disk), so that every reader decodes a stored photo or mask exactly as the same file on disk. A stored file
    is first read for its header alone: one that is no picture is refused before the rest is downloaded."""
    if isinstance(path, (str, Path)):
        image = Image.open(path)
        if image.format == "TIFF" and orientation(image) in _TRANSPOSED:  # Pillow 13 maps such a TIFF's stored pixels
            image.close()  # from the file at its turned size (uncompressed grey, 16-bit, RGBA, palette): stripes
            return Image.open(io.BytesIO(Path(path).read_bytes()))
        return image
    if not isinstance(path, RemoteFile):
        return Image.open(path)
    return Image.open(io.BytesIO(picture_bytes(path)))


def picture_bytes(path: Path | RemoteFile) -> bytes:
    """The whole file; one in object storage read for its header first, and refused there if it is no picture."""
    if not isinstance(path, RemoteFile):
        return Path(path).read_bytes()
    head = path.read_head(_HEADER_BYTES)
    if not head.startswith(_PICTURE_SIGNATURES):
        raise UnidentifiedImageError(f"cannot identify image file {path}")
    return head if len(head) < _HEADER_BYTES else path.read_bytes()


def _upright(image: Image.Image) -> Image.Image:
    return ImageOps.exif_transpose(image) if orientation(image) != 1 else image


class PixelValueError(ValueError):
    """A photo, mask or probability map whose values crackseg will not guess at (a photo's floats, a mask's colours,
    probabilities out of [0, 1])."""


def _grey_levels(image: Image.Image) -> np.ndarray:
    """(H, W) uint8 grey levels; 16-bit images are scaled to 8 bits from their bit depth (:func:`eight_bit_factor`, as
    photos are: a 12-bit 0/4095 mask is 0/255, and class numbers stay small enough to be refused), floating-point ones
    from [0, 1]."""
    if image.mode == "F":
        return (_unit_floats(image) * 255.0).round().astype(np.uint8)
    if image.mode.startswith("I"):
        values = np.asarray(image, dtype=np.float64)
        return (values * eight_bit_factor(values.max(initial=0))).round().clip(0, 255).astype(np.uint8)
    return np.asarray(image.convert("L"))


def _unit_floats(image: Image.Image) -> np.ndarray:
    """A floating-point image's values, which must be probabilities in [0, 1] (what segmentation tools write)."""
    values = np.asarray(image, dtype=np.float32)
    low, high = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
    if not (np.isfinite(low) and np.isfinite(high)) or low < 0.0 or high > 1.0:
        raise PixelValueError(f"floating-point values from {low:g} to {high:g}; crackseg reads them as probabilities in [0, 1]")
    return values


def _over_black(image: Image.Image) -> Image.Image:
    """A mask with transparency as shown over black: a crack painted on a transparent layer is the crack, whatever
    colour the transparent pixels hold."""
    if image.mode not in ("RGBA", "LA", "PA", "RGBa", "La") and not (image.mode == "P" and "transparency" in image.info):
        return image
    rgba = image.convert("RGBA")
    return Image.alpha_composite(Image.new("RGBA", rgba.size, (0, 0, 0, 255)), rgba).convert("RGB")


def _refuse_colours(image: Image.Image) -> None:
    """A mask drawn in colour (a red crack on black) is not guessed at: its grey level would hide the crack."""
    if image.mode in ("1", "L", "LA", "F") or image.mode.startswith("I"):
        return
    rgb = np.asarray(image.convert("RGB")).reshape(-1, 3).astype(np.int16)
    coloured = rgb.max(axis=1) - rgb.min(axis=1) > COLOUR_SPREAD
    if coloured.any():
        found = ", ".join(f"rgb{tuple(int(v) for v in colour)}" for colour in np.unique(rgb[coloured], axis=0)[:4])
        raise PixelValueError(f"a colour mask (colours {found}); crackseg reads grey masks (0 = background, above "
                              f"{CRACK_THRESHOLD} = crack): save the crack colour as white on black")


def image_pixels(path: Path | RemoteFile | BinaryIO) -> np.ndarray:
    """(H, W, 3) uint8 RGB as displayed; grey, palette, RGBA, CMYK and 16-bit files are converted.

    ``path`` may be an open binary file or a file in object storage (:func:`open_picture`)."""
    with open_picture(path) as image:
        return picture_pixels(image)


def picture_pixels(image: Image.Image) -> np.ndarray:
    """:func:`image_pixels` of an image already opened (one an annotation tool hands over). 16-bit grey is scaled from
    its bit depth (:func:`eight_bit_factor`), as rasters are."""
    image = _upright(image)
    check_photo_pixels(image)
    if image.mode.startswith("I"):
        values = np.asarray(image).astype(np.float32)
        grey = np.clip(values * eight_bit_factor(float(values.max(initial=0))) + 0.5, 0, 255).astype(np.uint8)
        return np.repeat(grey[..., None], 3, axis=2)
    return np.asarray(image.convert("RGB")).copy()


def check_photo_pixels(image: Image.Image) -> None:
    """Refuse a photo of floating-point or 32-bit pixels beyond 16 bits, which Pillow's conversion would clip (a photo
    in [0, 1] to black), as the raster reader refuses them."""
    if image.mode == "F":
        raise PixelValueError(f"floating-point pixels; crackseg reads 8- and 16-bit photos {_CONVERT}")
    if image.mode.startswith("I"):
        low, high = image.getextrema()
        if low < 0 or high > 65535:
            raise PixelValueError(f"32-bit pixels from {low} to {high}; crackseg reads 8- and 16-bit photos {_CONVERT}")


def eight_bit_factor(largest: float) -> float:
    """The factor from 16-bit values to 0..255: that of the smallest bit depth from 8 to 16 that holds ``largest``, so
    that 12-bit data stored in 16 bits keeps its brightness."""
    bits = min(max(8, math.ceil(math.log2(max(largest, 0) + 1))), 16)
    return 255.0 / (2**bits - 1)


def load_image(path: Path | RemoteFile | BinaryIO) -> torch.Tensor:
    """:func:`image_pixels` as the (3, H, W) uint8 tensor a model takes."""
    import torch  # here, so that what reads images without a model (compare) starts without loading torch

    return torch.from_numpy(image_pixels(path)).permute(2, 0, 1)


def mask_levels(path: Path | RemoteFile) -> np.ndarray:
    """(H, W) uint8 grey levels of a mask as displayed, 0/1 masks already scaled to 0/255."""
    with open_picture(path) as image:
        image = _over_black(_upright(image))
        _refuse_colours(image)
        if image.mode.startswith("I") and _narrow_mask(raw := np.asarray(image)):
            return np.where(raw > 0, np.uint8(255), np.uint8(0))
        levels = _grey_levels(image)
    top = int(levels.max(initial=0))
    if 1 < top < FAINT_LEVELS:
        raise PixelValueError(f"a mask whose brightest level is {top}: neither 0/255 nor 0/1 (a 0/1 mask saved as JPEG, "
                              "or class numbers?), which would read as crack-free; save it as a 0/255 or 0/1 PNG")
    if is_zero_one(levels):
        levels = levels * np.uint8(255)
    return levels


def _marked_probabilities(image: Image.Image) -> bool:
    """Whether predict marked the file as probabilities: a PNG text chunk, or a GeoTIFF's GDAL metadata item (TIFF tag
    42112, GDAL_METADATA)."""
    key, value = PROBABILITY_MARK
    gdal = getattr(image, "tag_v2", {}).get(42112)
    return image.info.get(key) == value or (isinstance(gdal, str) and f'<Item name="{key}">{value}</Item>' in gdal)


def _narrow_mask(values: np.ndarray) -> bool:
    """A 16-bit file holding a 0/1 or 0/255 mask, as a mask array of a wider type is saved: read as that mask, since
    scaling its values to 8 bits would leave 0/1 empty."""
    top = values.max(initial=0)
    return bool(top in (1, 255) and not np.any((values != 0) & (values != top)))


def is_zero_one(levels: np.ndarray) -> bool:
    """Only the values 0 and 1, with at least one 1: a mask written as 0 = background, 1 = crack."""
    return bool(levels.max(initial=0) == 1)


def crack_pixels(levels: np.ndarray) -> np.ndarray:
    """(H, W) bool, True = crack, from a mask's grey levels: above CRACK_THRESHOLD, or 1 in a 0/1 mask. The rule every
    mask is read by, whether an image file (:func:`crack_mask`) or a raster's band."""
    return levels > 0 if is_zero_one(levels) else levels > CRACK_THRESHOLD


def crack_mask(path: Path | RemoteFile) -> np.ndarray:
    """(H, W) bool, True = crack: :func:`crack_pixels` of the mask as displayed."""
    return crack_pixels(mask_levels(path))


def load_mask(path: Path | RemoteFile) -> torch.Tensor:
    """(1, H, W) uint8, 1 = crack, 0 = background."""
    import torch

    return torch.from_numpy(crack_mask(path).astype(np.uint8))[None]


def read_probability(path: Path | RemoteFile) -> torch.Tensor:
    """(H, W) float32 in [0, 1] from a predicted mask (0/255 or 0/1 in 8 bits, 0/255 in 16), an 8- or 16-bit probability
    map, or a floating-point one (a TIFF of probabilities in [0, 1]). A map predict marked (:data:`PROBABILITY_MARK`) is
    read as probabilities whatever its values: a sure crack-free photo's 8-bit map holds only levels 0 and 1. An
    unmarked 16-bit map of levels 0 and 1 stays probabilities (an older run's map of a crack-free photo); 0 and 255
    alone are no plausible map."""
    import torch

    with open_picture(path) as image:
        marked = _marked_probabilities(image)
        image = _over_black(_upright(image))
        _refuse_colours(image)
        if image.mode == "F":
            return torch.from_numpy(_unit_floats(image).copy())
        if image.mode.startswith("I"):
            raw = np.asarray(image)
            if not marked and raw.max(initial=0) == 255 and _narrow_mask(raw):  # a 0/255 mask saved in 16 bits
                return torch.from_numpy((raw > 0).astype(np.float32))
            return torch.from_numpy(raw.astype(np.float32) / 65535.0)
        levels = np.asarray(image.convert("L"))
    if not marked and is_zero_one(levels):
        levels = levels * np.uint8(255)
    return torch.from_numpy(levels.astype(np.float32) / 255.0)
