"""Registration: known warps recovered at full resolution, unreliable pairs refused, map alignment exact, photos
read upright and reduced by the factor they report."""

from __future__ import annotations

import time

import numpy as np
import pytest
from PIL import Image
from skimage.transform import AffineTransform, ProjectiveTransform, SimilarityTransform, rescale, warp

from crackseg.core.errors import InputError
from crackseg.monitoring.registration import _implausible, align_by_map, read_grey, register_photo_files, register_photos
from crackseg.data.synth import make_sample

TRUTHS = {  # BEFORE (col, row) -> AFTER (col, row)
    "similarity": SimilarityTransform(scale=1.04, rotation=np.radians(3), translation=(15, -10)),
    "affine": AffineTransform(matrix=np.array([[1.03, 0.04, 12.0], [-0.02, 0.98, -8.0], [0.0, 0.0, 1.0]])),
    "homography": ProjectiveTransform(np.array([[1.02, 0.03, 10.0], [-0.02, 1.0, -6.0], [4e-5, -3e-5, 1.0]])),
}


def _pavement(seed: int, height: int = 384, width: int = 512) -> np.ndarray:
    """(H, W) float grey in [0, 1]: a synthetic pavement photo."""
    return make_sample(np.random.default_rng(seed), height, width).image.mean(axis=2) / 255.0


@pytest.fixture(scope="module")
def pavement() -> np.ndarray:
    return _pavement(3)


def _seen_through(grey: np.ndarray, truth, seed: int = 0) -> np.ndarray:
    """The AFTER photo of ``grey`` when ``truth`` maps BEFORE to AFTER, with sensor noise."""
    after = warp(grey, truth.inverse, output_shape=grey.shape, mode="reflect")
    return np.clip(after + np.random.default_rng(seed).normal(0.0, 0.02, after.shape), 0.0, 1.0)


def _worst_error(alignment, truth, shape: tuple[int, int], after_shape: tuple[int, int] | None = None) -> float:
    """Largest distance (AFTER px) between where the alignment and the truth put a grid of BEFORE points that land
    inside AFTER (outside it, a warped photo holds no data)."""
    height, width = shape
    after_height, after_width = after_shape or shape
    rows, cols = np.mgrid[0:height:height // 16, 0:width:width // 16]
    points = np.column_stack([rows.ravel(), cols.ravel()]).astype(float)
    true = truth(points[:, ::-1])[:, ::-1]
    inside = np.all((true >= 0) & (true <= [after_height - 1, after_width - 1]), axis=1)
    assert inside.sum() > 100
    return float(np.linalg.norm(alignment.map_points(points[inside]) - true[inside], axis=1).max())


def _save_grey(path, grey: np.ndarray, **options) -> None:
    Image.fromarray((np.clip(grey, 0, 1) * 255).round().astype(np.uint8)).save(path, **options)


@pytest.mark.parametrize("model", list(TRUTHS))
def test_a_known_warp_is_recovered(pavement, model):
    alignment = register_photos(pavement, _seen_through(pavement, TRUTHS[model]), model)
    assert alignment.registered, alignment.reason
    assert alignment.method == f"orb-{model}"
    assert alignment.inliers >= 20 and alignment.residual_px < 1.5
    assert _worst_error(alignment, TRUTHS[model], pavement.shape) < 1.5


def test_keypoints_of_coarse_levels_lie_where_their_level_puts_them(pavement):
    """AFTER is BEFORE reduced to 0.625x, so their features come from different pyramid levels. Each level is
    ceil(size / 1.3) px of the one before (512 -> 394, 304, 234 px, not 512 / 1.3**k), and a keypoint taken at
    level k times 1.3**k is up to 2 px off at BEFORE's far edge; mapped through the level's real size, it is not."""
    factor = 0.625
    after = rescale(pavement, factor, anti_aliasing=True)  # 240x320: pixel centre x of BEFORE is (x + 0.5) * factor - 0.5
    alignment = register_photos(pavement, after)
    assert alignment.registered, alignment.reason
    truth = AffineTransform(matrix=np.array([[factor, 0.0, factor / 2 - 0.5], [0.0, factor, factor / 2 - 0.5], [0.0, 0.0, 1.0]]))
    assert _worst_error(alignment, truth, pavement.shape, after.shape) < 0.5


@pytest.mark.parametrize("model", ["similarity", "homography"])
def test_files_register_on_reduced_copies_in_full_resolution_pixels(tmp_path, pavement, model):
    _save_grey(tmp_path / "before.png", pavement)
    _save_grey(tmp_path / "after.jpg", _seen_through(pavement, TRUTHS[model]), quality=95)
    alignment = register_photo_files(tmp_path / "before.png", tmp_path / "after.jpg", model, max_side=320)
    assert alignment.registered, alignment.reason
    assert _worst_error(alignment, TRUTHS[model], pavement.shape) < 1.5


def test_reduced_copies_of_different_sizes_scale_back_by_pixel_centres(tmp_path):
    """BEFORE at 2048 px and AFTER, the same view at 512 px, both read at 256 px: full-resolution pixel centre x of
    BEFORE is (x + 0.5) / 4 - 0.5 of AFTER. Taking pixel corners for centres anywhere would be 0.375 px off."""
    small = (_pavement(5, 192, 256) * 255).astype(np.uint8)
    before = Image.fromarray(small).resize((2048, 1536), Image.Resampling.BICUBIC)
    before.save(tmp_path / "before.jpg", quality=95)
    before.reduce(4).save(tmp_path / "after.png")
    alignment = register_photo_files(tmp_path / "before.jpg", tmp_path / "after.png", max_side=256)
    assert alignment.registered, alignment.reason
    truth = AffineTransform(matrix=np.array([[0.25, 0.0, 0.125 - 0.5], [0.0, 0.25, 0.125 - 0.5], [0.0, 0.0, 1.0]]))
    assert _worst_error(alignment, truth, (1536, 2048), (384, 512)) < 0.15


def test_a_blank_photo_is_unregistered(pavement):
    alignment = register_photos(np.full((256, 256), 0.5), pavement)
    assert not alignment.registered
    assert "texture" in alignment.reason
    np.testing.assert_array_equal(alignment.matrix, np.eye(3))


@pytest.mark.parametrize("model", list(TRUTHS))
def test_unrelated_photos_are_unregistered(pavement, model):
    alignment = register_photos(pavement, _pavement(11), model)
    assert not alignment.registered
    assert alignment.reason


def test_a_mirrored_photo_is_unregistered(pavement):
    assert not register_photos(pavement, pavement[:, ::-1], "homography").registered


@pytest.mark.parametrize("matrix, complaint", [
    ([[-1.0, 0.0, 511.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], "mirrors"),
    ([[2.5, 0.0, 0.0], [0.0, 2.5, 0.0], [0.0, 0.0, 1.0]], "scale"),
    ([[1.6, 0.0, 0.0], [0.0, 0.8, 0.0], [0.0, 0.0, 1.0]], "squeezes"),
    ([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [4e-4, 4e-4, 0.8208]], "scale varies"),
    ([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [-3e-3, 0.0, 1.0]], "horizon"),
    ([[1.1, -0.2, 30.0], [0.2, 1.1, -5.0], [0.0, 0.0, 1.0]], ""),
])
def test_implausible_mappings_are_named(matrix, complaint):
    found = _implausible(np.array(matrix), 512, 384)
    assert (complaint in found) if complaint else found == ""


@pytest.fixture(scope="module")
def large_pair(tmp_path_factory):
    """Two 4000x3000 JPEGs of one surface, AFTER shifted by (61, 37) px (col, row): the size of a phone photo."""
    folder = tmp_path_factory.mktemp("large")
    texture = Image.fromarray((_pavement(9, 780, 1040) * 255).astype(np.uint8))
    surface = np.asarray(texture.resize((4160, 3120), Image.Resampling.BICUBIC))
    Image.fromarray(surface[:3000, :4000]).save(folder / "before.jpg", quality=90)
    Image.fromarray(surface[37:3037, 61:4061]).save(folder / "after.jpg", quality=90)
    return folder / "before.jpg", folder / "after.jpg"


@pytest.mark.parametrize("max_side", [640, 1024])
def test_phone_sized_photos_register_in_a_fraction_of_a_second(large_pair, max_side):
    register_photo_files(*large_pair, max_side=max_side)  # first call: imports and caches warm
    started, cpu = time.perf_counter(), time.process_time()
    alignment = register_photo_files(*large_pair, max_side=max_side)
    print(f"\n4000x3000 JPEG pair at max_side {max_side}: {time.perf_counter() - started:.2f} s wall, "
          f"{time.process_time() - cpu:.2f} s CPU, {alignment.inliers} inliers")
    assert alignment.registered, alignment.reason
    truth = AffineTransform(translation=(-61, -37))
    assert _worst_error(alignment, truth, (3000, 4000)) < 3.0


def test_align_by_map_goes_through_map_coordinates():
    rasterio = pytest.importorskip("rasterio")
    from affine import Affine

    before = Affine(0.5, 0.0, 500_000.0, 0.0, -0.5, 4_000_000.0)  # 0.5 m pixels, north up
    after = Affine(0.2, 0.0, 500_010.25, 0.0, -0.25, 3_999_990.0)  # another origin, 0.2 x 0.25 m pixels
    alignment = align_by_map((before, "EPSG:32633"), (after, "EPSG:32633"))
    rows_cols = np.array([[0, 0], [10, 20], [123, 4], [500, 777]])
    xs, ys = rasterio.transform.xy(before, rows_cols[:, 0], rows_cols[:, 1], offset="center")
    # fractional (row, col) of pixel edges: the centre of pixel i lies at i + 0.5
    rows, cols = rasterio.transform.rowcol(after, xs, ys, op=lambda value: value)
    np.testing.assert_allclose(alignment.map_points(rows_cols), np.column_stack([rows, cols]) - 0.5, atol=1e-6)
    assert alignment.method == "map" and alignment.registered
    np.testing.assert_allclose(alignment.scale_at(rows_cols), np.sqrt(0.5 / 0.2 * 0.5 / 0.25))


def test_align_by_map_refuses_two_crs_and_accepts_one_written_two_ways():
    rasterio = pytest.importorskip("rasterio")
    transform = (1.0, 0.0, 0.0, 0.0, -1.0, 100.0)  # the six numbers are enough
    with pytest.raises(InputError) as raised:
        align_by_map((transform, "EPSG:32633"), (transform, "EPSG:4326"))
    assert "EPSG:32633" in str(raised.value) and "EPSG:4326" in str(raised.value)
    assert "\n" not in str(raised.value)
    same = rasterio.crs.CRS.from_epsg(32633).to_wkt()
    assert align_by_map((transform, "EPSG:32633"), (transform, same)).registered


_STORED = {  # EXIF orientation -> how to store an upright image so that the tag shows it upright
    1: None, 2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_90, 7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_270,
}


def _centroid(grey: np.ndarray) -> np.ndarray:
    weight = np.clip(grey - np.median(grey), 0, None)
    rows, cols = np.indices(grey.shape)
    return np.array([(weight * cols).sum(), (weight * rows).sum()]) / weight.sum()


@pytest.mark.parametrize("orientation", list(_STORED))
def test_read_grey_shows_the_photo_upright_and_reduced_by_pixel_centres(tmp_path, orientation):
    """A bright spot at (x, y) = (70.3, 140.6) of a 301x203 photo as displayed, stored turned, with its EXIF tag.
    Reduced to 120 px, the copy holds 80 rows: it covers the top 200.6 rows, whichever way the file is stored."""
    spot = np.array([70.3, 140.6])
    rows, cols = np.indices((203, 301))
    upright = 30 + 200 * np.exp(-((cols - spot[0]) ** 2 + (rows - spot[1]) ** 2) / (2 * 9.0**2))
    stored = Image.fromarray(upright.astype(np.uint8))
    if _STORED[orientation] is not None:
        stored = stored.transpose(_STORED[orientation])
    exif = Image.Exif()
    exif[0x0112] = orientation
    stored.save(tmp_path / "photo.jpg", quality=95, exif=exif)

    full, factor = read_grey(tmp_path / "photo.jpg", 1000)
    assert full.shape == (203, 301) and factor == 1.0 and full.dtype == np.float32
    np.testing.assert_allclose(_centroid(full), spot, atol=0.1)
    reduced, factor = read_grey(tmp_path / "photo.jpg", 120)  # decoded at half size (DCT), then resized
    assert reduced.shape == (80, 120) and factor == pytest.approx(120 / 301)
    np.testing.assert_allclose(_centroid(reduced), (spot + 0.5) * factor - 0.5, atol=0.05)
    assert 0.0 <= reduced.min() and reduced.max() <= 1.0


@pytest.mark.parametrize("size, max_side, expected", [
    ((4000, 3000), 1024, (768, 1024)),
    ((4032, 3024), 1000, (750, 1000)),
])
def test_read_grey_reduces_a_large_jpeg(tmp_path, size, max_side, expected):
    noise = np.random.default_rng(0).integers(0, 256, (size[1] // 8, size[0] // 8), dtype=np.uint8)
    Image.fromarray(noise).resize(size, Image.Resampling.BILINEAR).save(tmp_path / "large.jpg", quality=85)
    started = time.perf_counter()
    grey, factor = read_grey(tmp_path / "large.jpg", max_side)
    print(f"\nread_grey {size[0]}x{size[1]} -> {grey.shape[1]}x{grey.shape[0]}: {time.perf_counter() - started:.3f} s")
    assert grey.shape == expected
    assert factor == pytest.approx(max_side / max(size))


def test_read_grey_names_a_file_it_cannot_decode(tmp_path):
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not a photo")
    with pytest.raises(InputError, match="broken.jpg") as raised:
        read_grey(broken, 640)
    assert "\n" not in str(raised.value)
