"""Crack look-alikes for ``crackseg synth --hard-negatives``: what a pavement model must learn to leave alone.

Six kinds, each in a few variants:

- ``stain``: dark blotches, water marks with a darker tide line, oil spots
- ``joints``: paving stones in running bond (each stone its own tone), tile grids of straight dark lines
- ``paint``: road markings, light or dark, thin or wide, straight or curved, solid or dashed, with worn edges
- ``plant``: thin curved stems (mostly dark, now and then light like straw), with or without leaves
- ``shadow``: hard and soft cast shadows (an edge, a pole's band), the dark mouth of a tunnel or drain
- ``border``: dark frame edges, a watermark bar of text along an edge, strong vignetting

Every drawer takes ``(rng, texture, shade, marks)``: ``texture`` (H, W) float32 grey levels and
``shade`` (H, W) float32 factors, whose product is the photo, are changed in place, and ``marks``
(H, W) bool gains the look-alike's pixels. They are drawn before the cracks, whose darkening then
multiplies whatever lies below: a crack across a look-alike stays a crack, and no crack mask is touched.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image, ImageDraw, ImageFont
from scipy import ndimage, special

from crackseg.data.noise import smooth_noise

KINDS = ("stain", "joints", "paint", "plant", "shadow", "border")  # in drawing order: the surface first, the photo's frame last


def add_look_alikes(rng: np.random.Generator, texture: np.ndarray, shade: np.ndarray, marks: np.ndarray) -> list[str]:
    """Draw 1-4 look-alikes of kinds picked at random (a kind may repeat); return their kinds in drawing order."""
    picks = np.sort(rng.integers(0, len(KINDS), int(rng.integers(1, 5))))
    kinds = [KINDS[pick] for pick in picks]
    for kind in kinds:
        draw_look_alike(kind, rng, texture, shade, marks)
    return kinds


def draw_look_alike(kind: str, rng: np.random.Generator, texture: np.ndarray, shade: np.ndarray, marks: np.ndarray) -> None:
    """Draw one look-alike of ``kind`` (one of :data:`KINDS`), its variant picked by ``rng``."""
    _DRAWERS[kind](rng, texture, shade, marks)


def _grid(shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    height, width = shape
    return np.mgrid[0:height, 0:width].astype(np.float32)


def _stroke(shape: tuple[int, int], ys: np.ndarray, xs: np.ndarray, half: np.ndarray) -> np.ndarray:
    """Coverage in [0, 1] of a line through the points (ys, xs) of half-width ``half`` px (per point)."""
    rows, cols = np.rint(ys).astype(int), np.rint(xs).astype(int)
    inside = (rows >= 0) & (rows < shape[0]) & (cols >= 0) & (cols < shape[1])
    if not inside.any():
        return np.zeros(shape, np.float32)
    centre = np.zeros(shape, bool)
    centre[rows[inside], cols[inside]] = True
    local = np.zeros(shape, np.float32)
    np.maximum.at(local, (rows[inside], cols[inside]), half[inside].astype(np.float32))
    distance, (near_y, near_x) = ndimage.distance_transform_edt(~centre, return_indices=True)
    return np.clip(local[near_y, near_x] + 0.5 - distance, 0.0, 1.0).astype(np.float32)


def _stain(rng, texture, shade, marks) -> None:
    """A dark blotch, a water mark (faint inside, a darker tide line at its rim) or an oil spot."""
    y, x = _grid(shade.shape)
    size = max(shade.shape)
    radius = rng.uniform(0.08, 0.3) * size
    cy, cx = rng.uniform((0, 0), shade.shape)
    turn, stretch = rng.uniform(0, math.pi), rng.uniform(0.5, 1.0)
    along = ((y - cy) * math.cos(turn) + (x - cx) * math.sin(turn)) / radius
    across = ((x - cx) * math.cos(turn) - (y - cy) * math.sin(turn)) / (radius * stretch)
    field = 1.0 - np.hypot(along, across) + rng.uniform(0.15, 0.4) * smooth_noise(rng, shade.shape, max(2.0, 0.4 * radius))
    variant = rng.choice(("blotch", "water", "oil"))
    edge_px = {"blotch": rng.uniform(1.5, 6.0), "water": rng.uniform(0.7, 2.0), "oil": rng.uniform(1.0, 4.0)}[variant]
    cover = special.expit(field * radius / edge_px)
    if variant == "water":  # what shows is the tide line, not the faint inside
        tide = np.exp(-((field * radius / rng.uniform(1.0, 3.0)) ** 2))
        darkening = rng.uniform(0.05, 0.15) * cover + rng.uniform(0.2, 0.4) * tide
        marks |= tide > 0.5
    else:
        depth = rng.uniform(0.25, 0.5) if variant == "blotch" else rng.uniform(0.35, 0.6)
        darkening = depth * cover * (1.0 + 0.15 * smooth_noise(rng, shade.shape, max(2.0, 0.3 * radius)))
        marks |= cover > 0.5
    shade *= 1.0 - np.clip(darkening, 0.0, 0.9)


def _joints(rng, texture, shade, marks) -> None:
    """Paving stones in running bond or a tile grid: straight dark joints, each stone or tile its own tone."""
    y, x = _grid(shade.shape)
    size = max(shade.shape)
    angle = rng.normal(0.0, 0.04) + (rng.uniform(0, math.pi / 2) if rng.random() < 0.25 else 0.0)
    u = x * math.cos(angle) + y * math.sin(angle) + rng.uniform(0, size)
    v = y * math.cos(angle) - x * math.sin(angle) + rng.uniform(0, size)
    pavers = rng.random() < 0.5
    period_v = max(10.0, rng.uniform(0.12, 0.35) * size)
    period_u = period_v * (rng.uniform(1.4, 2.2) if pavers else 1.0)
    row = np.floor(v / period_v)
    u = u + (row % 2) * (0.5 * period_u if pavers else 0.0)
    column = np.floor(u / period_u)
    distance = np.minimum(np.abs(v - period_v * np.round(v / period_v)), np.abs(u - period_u * np.round(u / period_u)))
    half = np.maximum(0.5, rng.uniform(0.8, 3.0) * (1.0 + 0.15 * smooth_noise(rng, shade.shape, 15.0)))
    band = np.clip(half + 0.5 - distance, 0.0, 1.0)
    tones = rng.normal(0.0, 0.05, (17, 19))
    stone = 1.0 + tones[(row % 17).astype(int), (column % 19).astype(int)]
    bevel = 1.0 - rng.uniform(0.0, 0.12) * np.exp(-distance / 2.5)
    joint = 1.0 - rng.uniform(0.3, 0.6) * band if rng.random() < 0.85 else 1.0 + rng.uniform(0.2, 0.4) * band  # light grout now and then
    shade *= stone * bevel * joint
    marks |= band > 0.5


def _paint(rng, texture, shade, marks) -> None:
    """A road marking: light or dark paint, a thin line or a wide band, straight or curved, sometimes dashed, worn."""
    y, x = _grid(shade.shape)
    size = max(shade.shape)
    half = rng.uniform(1.0, 2.5) if rng.random() < 0.4 else max(2.0, rng.uniform(0.02, 0.06) * size)
    py, px = rng.uniform((0, 0), shade.shape)
    heading = rng.uniform(0, 2 * math.pi)
    if rng.random() < 0.6:
        distance = np.abs((y - py) * math.cos(heading) - (x - px) * math.sin(heading))
        along = (y - py) * math.sin(heading) + (x - px) * math.cos(heading)
    else:
        bend = rng.uniform(0.5, 2.0) * size
        cy, cx = py + bend * math.sin(heading), px + bend * math.cos(heading)
        reach = np.hypot(y - cy, x - cx)
        distance, along = np.abs(reach - bend), bend * np.arctan2(y - cy, x - cx)
    worn_edge = half + 0.6 * smooth_noise(rng, shade.shape, 3.0) + 0.5 * smooth_noise(rng, shade.shape, 12.0)
    alpha = np.clip(worn_edge + 0.5 - distance, 0.0, 1.0)
    if rng.random() < 0.3:
        dash, gap = rng.uniform(0.15, 0.35) * size, rng.uniform(0.1, 0.3) * size
        phase = np.mod(along + rng.uniform(0, dash + gap), dash + gap)
        alpha *= np.clip(np.minimum(phase, dash - phase) + 0.5, 0.0, 1.0)
    wear = special.expit(3.0 * (smooth_noise(rng, shade.shape, 2.5) + rng.uniform(0.8, 2.5)))
    alpha *= rng.uniform(0.8, 0.97) * wear
    surface = float(texture.mean())
    level = min(245.0, surface + rng.uniform(50, 110)) if rng.random() < 0.65 else max(20.0, surface - rng.uniform(45, 90))
    paint = level + 0.3 * (texture - surface)  # the paint follows the surface's relief
    texture[:] = texture * (1.0 - alpha) + paint * alpha
    marks |= alpha > 0.5


def _plant(rng, texture, shade, marks) -> None:
    """One to three thin, smoothly curving stems, tapering to the tip, some with side shoots and leaves."""
    height, width = shade.shape
    size = max(height, width)
    cover = np.zeros(shade.shape, np.float32)
    for _ in range(int(rng.integers(1, 4))):
        stems = [(rng.uniform((0, 0), shade.shape), rng.uniform(0, 2 * math.pi), rng.uniform(0.2, 0.7) * size, rng.uniform(0.5, 1.5))]
        for start, heading, length, thickness in stems:  # side shoots join the list as it is walked
            steps = max(int(length), 8)
            curl = rng.normal(0.0, 1.2 / steps)
            angles = heading + curl * np.arange(steps) + 0.25 * smooth_noise(rng, (steps,), max(4.0, steps / 3))
            ys, xs = start[0] + np.cumsum(np.sin(angles)), start[1] + np.cumsum(np.cos(angles))
            cover = np.maximum(cover, _stroke(shade.shape, ys, xs, thickness * np.linspace(1.0, 0.45, steps)))
            if len(stems) < 4 and rng.random() < 0.4:
                fork = int(rng.integers(0, steps))
                stems.append(((ys[fork], xs[fork]), angles[fork] + rng.choice((-1, 1)) * rng.uniform(0.3, 0.9),
                              length * rng.uniform(0.2, 0.5), max(0.5, thickness * 0.7)))
            for _ in range(rng.poisson(1.2)):
                at = int(rng.integers(0, steps))
                cover = np.maximum(cover, _leaf(rng, shade.shape, (ys[at], xs[at]), angles[at] + rng.choice((-1, 1)) * rng.uniform(0.4, 1.2)))
    casting = ndimage.shift(ndimage.gaussian_filter(cover, 1.0), rng.uniform(-2.0, 2.0, 2), order=1)
    shade *= 1.0 - rng.uniform(0.1, 0.25) * casting
    if rng.random() < 0.8:
        shade *= 1.0 - rng.uniform(0.35, 0.65) * cover
    else:  # dry grass, straw
        texture += rng.uniform(40, 70) * cover
    marks |= cover > 0.5


def _leaf(rng, shape: tuple[int, int], base: tuple[float, float], heading: float) -> np.ndarray:
    """Coverage of a pointed leaf from ``base`` along ``heading``: widest in the middle, tapering to both ends."""
    size = max(shape)
    length = rng.uniform(0.04, 0.12) * size + 3.0
    half_width = length * rng.uniform(0.12, 0.25)
    y, x = _grid(shape)
    along = ((y - base[0]) * math.sin(heading) + (x - base[1]) * math.cos(heading)) / length
    across = np.abs((x - base[1]) * math.sin(heading) - (y - base[0]) * math.cos(heading))
    outline = half_width * np.sin(math.pi * np.clip(along, 0.0, 1.0)) ** 0.7
    return np.where((along >= 0) & (along <= 1), np.clip(outline + 0.5 - across, 0.0, 1.0), 0.0).astype(np.float32)


def _shadow(rng, texture, shade, marks) -> None:
    """A cast shadow (a hard or soft edge, or a pole's band) or the dark mouth of a tunnel or drain."""
    y, x = _grid(shade.shape)
    height, width = shade.shape
    size = max(height, width)
    variant = rng.choice(("edge", "pole", "opening"))
    if variant == "opening":
        side = int(rng.integers(0, 4))
        depth_from = (y, x, height - 1 - y, width - 1 - x)[side]
        along = (x, y, x, y)[side] - rng.uniform(0.2, 0.8) * (width if side % 2 == 0 else height)
        reach, half_span = rng.uniform(0.25, 0.7) * size, rng.uniform(0.12, 0.35) * size
        inside = 1.0 - np.sqrt((along / half_span) ** 4 + (depth_from / reach) ** 2)  # > 0 inside: upright walls, a round top
        cover = special.expit(inside * min(reach, half_span) / rng.uniform(0.6, 2.5))
        darkening = rng.uniform(0.75, 0.93) * cover * (0.85 + 0.15 * np.clip(inside * 3.0, 0.0, 1.0))
    else:
        turn = rng.uniform(0, 2 * math.pi)
        signed = (y - rng.uniform(0, height)) * math.cos(turn) - (x - rng.uniform(0, width)) * math.sin(turn)
        signed = signed + rng.uniform(0.0, 2.5) * smooth_noise(rng, shade.shape, 25.0)
        softness = rng.uniform(0.4, 1.5) if rng.random() < 0.5 else rng.uniform(2.0, 8.0)
        if variant == "pole":
            half_width = rng.uniform(0.015, 0.08) * size
            signed, softness = half_width - np.abs(signed), min(softness, 0.5 * half_width)
        cover = special.expit(signed / softness)
        darkening = rng.uniform(0.3, 0.6) * cover
    shade *= 1.0 - darkening
    marks |= cover > 0.5


def _border(rng, texture, shade, marks) -> None:
    """Dark frame edges, a watermark bar of text along an edge, or vignetting that darkens the corners strongly."""
    y, x = _grid(shade.shape)
    height, width = shade.shape
    variant = rng.choice(("frame", "bar", "vignette"))
    if variant == "vignette":
        radius = np.hypot(y / max(height - 1, 1) - 0.5, x / max(width - 1, 1) - 0.5) / math.sqrt(0.5)  # 1 in the corners
        start = rng.uniform(0.55, 0.85)
        ramp = np.clip((radius - start) / rng.uniform(0.1, 0.35), 0.0, 1.0)
        darkening = rng.uniform(0.6, 0.95) * ramp * ramp * (3.0 - 2.0 * ramp)
        shade *= 1.0 - darkening
        marks |= darkening > 0.4
        return
    if variant == "frame":
        sides = [side for side in range(4) if rng.random() < 0.5] or [int(rng.integers(0, 4))]
    else:
        sides = [int(rng.choice((0, 2, 2, 1, 3)))]  # mostly along the bottom
    cover = np.zeros(shade.shape, np.float32)
    for side in sides:
        across = height if side % 2 == 0 else width  # the image's extent across this side's band
        if variant == "bar":
            thickness = max(6.0, rng.uniform(0.06, 0.14) * across)
        else:  # a thin dark line now and then, mostly a band
            thickness = rng.uniform(1.0, 3.0) if rng.random() < 0.3 else max(2.0, rng.uniform(0.02, 0.12) * across)
        depth_from = (y, x, height - 1 - y, width - 1 - x)[side]
        along = (x, y, x, y)[side] - (width if side % 2 == 0 else height) / 2
        edge = thickness + rng.normal(0.0, 0.015) * along  # a frame slightly askew
        cover = np.maximum(cover, special.expit((edge - depth_from) / rng.uniform(0.3, 1.2)))
    if variant == "frame":
        shade *= 1.0 - rng.uniform(0.8, 0.97) * cover
    else:
        light_text = rng.random() < 0.75
        shade *= 1.0 - (rng.uniform(0.45, 0.8) if light_text else -0.35) * cover
        glyphs = _text_line(rng, cover > 0.5, sides[0] % 2 == 1)
        level = rng.uniform(200, 240) if light_text else rng.uniform(20, 50)
        shade[:] = shade * (1.0 - glyphs) + glyphs
        texture[:] = texture * (1.0 - glyphs) + level * glyphs
    marks |= cover > 0.5


def _text_line(rng, bar: np.ndarray, upright: bool) -> np.ndarray:
    """Coverage of a line of watermark text (a date, an image number, letters), centred across the band ``bar``."""
    along_rows = np.rot90(bar) if upright else bar  # a rotation, not a transpose: text must not read mirrored
    rows, cols = np.nonzero(along_rows)
    if rows.size == 0:
        return np.zeros(bar.shape, np.float32)
    top, bottom, left, right = rows.min(), rows.max() + 1, cols.min(), cols.max() + 1
    letters = "ABCDEFGHIJKLMNOPRSTUVWYZ"
    words = [
        f"{rng.integers(2008, 2025)}-{rng.integers(1, 13):02d}-{rng.integers(1, 29):02d} {rng.integers(0, 24):02d}:{rng.integers(0, 60):02d}",
        f"IMG_{rng.integers(0, 10000):04d}",
        "".join(rng.choice(list(letters), int(rng.integers(3, 9)))),
        "(c) " + "".join(rng.choice(list(letters), int(rng.integers(4, 10)))),
    ]
    text = "  ".join(words[i] for i in sorted(rng.choice(4, int(rng.integers(1, 4)), replace=False)))
    font = ImageFont.load_default(size=max(6, round(0.65 * (bottom - top))))
    canvas = Image.new("L", (right - left, bottom - top))
    drawing = ImageDraw.Draw(canvas)
    text_width = drawing.textlength(text, font=font)
    drawing.text((rng.uniform(0.02, 0.98) * max(0.0, canvas.width - text_width), canvas.height / 2), text, fill=255, font=font, anchor="lm")
    full = np.zeros(along_rows.shape, np.float32)
    full[top:bottom, left:right] = np.asarray(canvas, np.float32) / 255.0
    return np.rot90(full, -1) if upright else full


_DRAWERS = {"stain": _stain, "joints": _joints, "paint": _paint, "plant": _plant, "shadow": _shadow, "border": _border}
