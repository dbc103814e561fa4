"""How one image's prediction is drawn: the overlay people look at, probability maps and masks as PNG files."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont
from PIL.PngImagePlugin import PngInfo

from crackseg.core.files import write_atomic
from crackseg.cracks.measure import CrackMeasure
from crackseg.data.images import PROBABILITY_MARK

MADE_WITH = "crackseg_made_with"  # the PNG text (GeoTIFF tag) of a mask saying what made it: model, threshold, tiling

_TINT = np.array([255.0, 30.0, 30.0], np.float32)


def overlay_jpeg(photo: np.ndarray, cracks_mask: np.ndarray, cracks: list[CrackMeasure]) -> bytes:
    """The (H, W, 3) photo with crack pixels tinted red and each crack's id written at it, for people to look at."""
    photo = photo.astype(np.float32)
    photo[cracks_mask] = 0.35 * photo[cracks_mask] + 0.65 * _TINT
    picture = Image.fromarray(photo.round().astype(np.uint8))
    if cracks:
        draw = ImageDraw.Draw(picture)
        font = ImageFont.load_default(size=max(10, min(picture.size) // 40))
        for crack in cracks:
            row, col = crack.anchor
            left, top, right, bottom = draw.textbbox((0, 0), str(crack.id), font=font)
            # beside the crack, moved inside the picture where the crack runs near its right or bottom edge
            x = max(2 - left, min(col + 3, picture.width - 3 - right))
            y = max(1 - top, min(row + 3, picture.height - 2 - bottom))
            draw.rectangle((x + left - 2, y + top - 1, x + right + 2, y + bottom + 1), fill=(255, 255, 255))
            draw.text((x, y), str(crack.id), fill=(180, 0, 0), font=font)
    buffer = io.BytesIO()
    picture.save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def probability_levels(prob: np.ndarray, bits: int) -> np.ndarray:
    """Probabilities (float32) as 8- or 16-bit grey levels (0 = 0, the top level = 1)."""
    if bits == 8:
        return np.round(prob * 255).astype(np.uint8)
    return np.round(prob.astype(np.float64) * 65535).astype(np.uint16)


def write_png(path: Path, array: np.ndarray, probabilities: bool = False, made_with: str = "") -> None:
    """``probabilities``: marked as a probability map, which readers never take for a 0/1 mask. ``made_with``: what
    made a mask, as :data:`MADE_WITH` (see :func:`crackseg.prediction.outputs.saved_made_with`)."""
    info = PngInfo()
    if probabilities:
        info.add_text(*PROBABILITY_MARK)
    if made_with:
        info.add_text(MADE_WITH, made_with)
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, "PNG", compress_level=1, pnginfo=info)
    write_atomic(path, buffer.getvalue())
