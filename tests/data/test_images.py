"""Photos and masks as viewers show them: EXIF orientation, 0/1 masks, photos beyond 16 bits, Pillow's size limit."""

from __future__ import annotations

import csv
import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import pavement, predict_tiled
from PIL import Image, ImageOps

from crackseg.cli.main import main
from crackseg.data.datasets import open_dataset
from crackseg.data.images import PixelValueError, displayed_size, load_image, load_mask, read_probability, stored_size
from crackseg.evaluation.evaluate import evaluate_files
from crackseg.prediction.pictures import write_png
from crackseg.training.loader import CrackDataset


def _rotated_jpeg(path: Path, shown: np.ndarray, orientation: int = 6) -> None:
    """Store ``shown`` (H, W, 3) so that a viewer applying the EXIF tag shows exactly it (a JPEG, or by ``path``'s
    suffix a TIFF, which Pillow reports at its displayed size)."""
    stored = Image.fromarray(shown).transpose(Image.Transpose.ROTATE_90)  # undone by orientation 6
    exif = Image.Exif()
    exif[0x0112] = orientation
    stored.save(path, exif=exif, **({"quality": 98} if path.suffix == ".jpg" else {}))


def _photo_with_line(height: int, width: int, row: int) -> np.ndarray:
    photo = np.full((height, width, 3), 200, np.uint8)
    photo[row, :] = 20
    return photo


@pytest.mark.parametrize("suffix", [".jpg", ".tif"])
def test_phone_jpeg_is_read_as_viewers_show_it(tmp_path, suffix):
    shown = _photo_with_line(64, 32, row=10)  # displayed 32 wide, 64 high
    _rotated_jpeg(tmp_path / f"phone{suffix}", shown)
    with Image.open(tmp_path / f"phone{suffix}") as image:
        assert stored_size(image) == (64, 32) and displayed_size(image) == (32, 64)  # stored landscape, shown portrait
        expected = np.asarray(ImageOps.exif_transpose(image))
        assert displayed_size(image) == (32, 64)  # once decoded too
    loaded = load_image(tmp_path / f"phone{suffix}")
    assert loaded.shape == (3, 64, 32)
    assert np.array_equal(loaded.permute(1, 2, 0).numpy(), expected)
    assert loaded[:, 10].float().mean() < 60 < loaded[:, 30].float().mean()  # the dark line where it is seen


@pytest.mark.parametrize("mode", ["L", "I;16", "RGBA", "P"])
def test_an_uncompressed_turned_tiff_of_any_mode_is_read_as_shown(tmp_path, mode):
    """Pillow 13 maps such a TIFF's stored pixels from the file at its turned size: stripes, where an RGB one is right."""
    from crackseg.data.images import image_pixels, mask_levels

    stored = np.zeros((32, 64), np.uint8)
    stored[:, :8] = 255  # a band at the stored left: the top once turned by orientation 6
    picture = Image.fromarray(stored.astype(np.uint16) * 257 if mode == "I;16" else stored)
    picture = picture if mode in ("L", "I;16") else picture.convert(mode)
    exif = picture.getexif()
    exif[0x0112] = 6
    picture.save(tmp_path / "a.tif", exif=exif)
    shown = np.rot90(stored, -1) > 127
    assert np.array_equal(image_pixels(tmp_path / "a.tif")[..., 0] > 127, shown)
    assert np.array_equal(mask_levels(tmp_path / "a.tif") > 127, shown)


def test_a_mask_traced_on_the_shown_photo_lines_up_in_training(tmp_path):
    for sub in ("images", "masks"):
        (tmp_path / sub).mkdir()
    shown = _photo_with_line(48, 48, row=7)  # square: the sizes cannot tell the orientation apart
    _rotated_jpeg(tmp_path / "images" / "a.jpg", shown)
    mask = np.zeros((48, 48), np.uint8)
    mask[7] = 255
    Image.fromarray(mask).save(tmp_path / "masks" / "a.png")
    found = open_dataset(tmp_path)
    assert not found.problems
    image, truth = CrackDataset(found.samples)[0]
    on_crack = image[:, truth[0].bool()].float().mean()
    off_crack = image[:, ~truth[0].bool()].float().mean()
    assert on_crack < 60 and off_crack > 150


@pytest.mark.parametrize("suffix", [".jpg", ".tif"])
def test_inspect_names_the_orientation_tag_when_only_the_stored_size_matches(tmp_path, capsys, suffix):
    for sub in ("images", "masks"):
        (tmp_path / sub).mkdir()
    _rotated_jpeg(tmp_path / "images" / f"a{suffix}", _photo_with_line(64, 32, row=3))
    Image.fromarray(np.zeros((32, 64), np.uint8)).save(tmp_path / "masks" / "a.png")  # traced on the stored pixels
    assert main(["inspect", str(tmp_path)]) == 1
    output = capsys.readouterr().out
    assert "a.png: mask is 64x32 px but its image is 32x64 as shown" in output
    assert "EXIF orientation tag (6)" in output
    Image.fromarray(np.zeros((64, 32), np.uint8)).save(tmp_path / "masks" / "a.png")  # traced on the photo as shown
    assert main(["inspect", str(tmp_path)]) == 0


def test_predicted_masks_and_overlays_have_the_displayed_size(tmp_path):
    import crackseg
    from crackseg.model.checkpoint import save_model

    torch.manual_seed(0)
    save_model(crackseg.build_model("mobilenet_v2"), tmp_path / "model.pt")
    (tmp_path / "in").mkdir()
    _rotated_jpeg(tmp_path / "in" / "phone.jpg", _photo_with_line(64, 32, row=5))
    assert main(["predict", str(tmp_path / "in"), "--checkpoint", str(tmp_path / "model.pt"), "--out", str(tmp_path / "out"),
                 "--overlay", "--device", "cpu"]) == 0
    assert Image.open(tmp_path / "out" / "masks" / "phone.png").size == (32, 64)
    assert Image.open(tmp_path / "out" / "overlays" / "phone.jpg").size == (32, 64)


def test_zero_one_masks_and_predictions_read_like_zero_255(tmp_path):
    levels = np.zeros((6, 8), np.uint8)
    levels[2, 1:7] = 1
    Image.fromarray(levels).save(tmp_path / "zero_one.png")
    Image.fromarray(levels * 255).save(tmp_path / "zero_255.png")
    assert torch.equal(load_mask(tmp_path / "zero_one.png"), load_mask(tmp_path / "zero_255.png"))
    assert torch.equal(read_probability(tmp_path / "zero_one.png"), read_probability(tmp_path / "zero_255.png"))
    Image.fromarray(np.zeros((6, 8), np.uint8)).save(tmp_path / "empty.png")
    assert load_mask(tmp_path / "empty.png").sum() == 0


@pytest.mark.parametrize("top", [1, 255, 1023, 4095, 32767, 65535])  # 0/1, 0/255, and full scale of 10 to 16 bits
def test_sixteen_bit_zero_one_and_zero_255_masks_read_like_eight_bit_ones(tmp_path, top):
    levels = np.zeros((6, 8), np.uint16)
    levels[2, 1:7] = top
    Image.fromarray(levels).save(tmp_path / "wide.png")
    Image.fromarray((levels > 0).astype(np.uint8) * 255).save(tmp_path / "narrow.png")
    assert Image.open(tmp_path / "wide.png").mode.startswith("I")
    assert load_mask(tmp_path / "wide.png").sum() == 6
    assert torch.equal(load_mask(tmp_path / "wide.png"), load_mask(tmp_path / "narrow.png"))


@pytest.mark.parametrize("levels", [[2], [1, 2, 3], [7, 9]])
def test_sixteen_bit_class_numbers_are_refused_as_eight_bit_ones_are(tmp_path, levels):
    """Divided by 257 they read as a crack-free mask."""
    for dtype in (np.uint8, np.uint16):
        mask = np.zeros((8, 8), dtype)
        for row, level in enumerate(levels):
            mask[row] = level
        Image.fromarray(mask).save(tmp_path / "classes.png")
        with pytest.raises(PixelValueError, match=f"a mask whose brightest level is {max(levels)}: neither 0/255 nor 0/1"):
            load_mask(tmp_path / "classes.png")


def test_sixteen_bit_probabilities_are_scaled_from_the_full_range(tmp_path):
    levels = np.array([[0, 256, 32768, 65535]], np.uint16)
    Image.fromarray(levels).save(tmp_path / "prob.png")
    assert torch.allclose(read_probability(tmp_path / "prob.png"), torch.tensor([[0.0, 256 / 65535, 32768 / 65535, 1.0]]))
    assert load_mask(tmp_path / "prob.png").tolist() == [[[0, 0, 1, 1]]]


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_a_probability_map_predict_marked_is_never_read_as_a_zero_one_mask(tmp_path, dtype):
    """A sure crack-free photo's 8-bit map holds only levels 0 and 1: probabilities under 0.006, not cracks."""
    levels = np.zeros((6, 8), dtype)
    levels[2, 1:7] = 1
    write_png(tmp_path / "prob.png", levels, probabilities=True)
    assert read_probability(tmp_path / "prob.png").max() == pytest.approx(1 / np.iinfo(dtype).max)
    Image.fromarray(levels).save(tmp_path / "unmarked.png")  # another tool's 0/1 mask; in 16 bits, a faint map
    assert read_probability(tmp_path / "unmarked.png").max() == pytest.approx(1.0 if dtype == np.uint8 else 1 / 65535)
    levels[2, 1:7] = 255
    Image.fromarray(levels).save(tmp_path / "mask.png")  # another tool's 0/255 mask, in 8 or 16 bits
    assert torch.equal(read_probability(tmp_path / "mask.png"), load_mask(tmp_path / "mask.png")[0].float())
    write_png(tmp_path / "prob.png", levels, probabilities=True)
    assert read_probability(tmp_path / "prob.png").max() == pytest.approx(255 / np.iinfo(dtype).max)


def test_a_raster_probability_map_predict_wrote_is_marked_too(tmp_path, checkpoint):
    """A raster's map, written by bands and joined from torchrun's parts, carries the mark as a GDAL metadata item."""
    pytest.importorskip("rasterio")
    from conftest import pavement, write_geotiff

    (tmp_path / "in").mkdir()
    write_geotiff(tmp_path / "in" / "ortho.tif", pavement(64, 96))
    assert main(["predict", "--checkpoint", str(checkpoint), str(tmp_path / "in"), "--out", str(tmp_path / "out"),
                 "--save-prob", "8", "--device", "cpu", "--workers", "0", "--no-measure"]) == 0
    assert Image.open(tmp_path / "out" / "probs" / "ortho.tif").tag_v2.get(42112, "").count('<Item name="crackseg">probabilities</Item>') == 1
    assert "probabilities" not in Image.open(tmp_path / "out" / "masks" / "ortho.tif").tag_v2.get(42112, "")


def test_a_sure_crack_free_prediction_scores_no_false_alarm(tmp_path):
    for folder in ("pred", "gt"):
        (tmp_path / folder).mkdir()
    levels = np.zeros((16, 16), np.uint8)
    levels[4:12, 4:12] = 1  # p = 1/255 where predict saw the most of a crack
    write_png(tmp_path / "pred" / "wall.png", levels, probabilities=True)
    Image.fromarray(np.zeros((16, 16), np.uint8)).save(tmp_path / "gt" / "wall.png")
    report = evaluate_files(tmp_path / "pred", tmp_path / "gt")
    assert report["crack_free"]["with_predicted_cracks"] == 0 and report["false_alarms"]["far_pixels"] == 0


@pytest.mark.parametrize("mode", ["RGBA", "LA", "P"])
def test_a_mask_painted_on_a_transparent_layer_is_read_as_shown_over_black(tmp_path, mode):
    alpha = np.zeros((6, 8), np.uint8)
    alpha[2, 1:7] = 255
    layer = Image.fromarray(np.dstack([np.full((6, 8, 3), 255, np.uint8), alpha]), "RGBA")  # white everywhere, opaque on the crack
    if mode == "P":
        layer = layer.convert("P", palette=Image.Palette.ADAPTIVE)
        layer.info["transparency"] = layer.getpixel((0, 0))
        layer.putpalette(layer.getpalette())
    else:
        layer = layer.convert(mode)
    layer.save(tmp_path / "layer.png", **({"transparency": layer.info["transparency"]} if mode == "P" else {}))
    Image.fromarray(alpha).save(tmp_path / "plain.png")
    assert Image.open(tmp_path / "layer.png").mode == mode
    assert torch.equal(load_mask(tmp_path / "layer.png"), load_mask(tmp_path / "plain.png"))
    assert torch.equal(read_probability(tmp_path / "layer.png"), read_probability(tmp_path / "plain.png"))


def _png_header_only(path: Path, width: int, height: int) -> None:
    """A PNG whose header claims ``width`` x ``height`` px: enough for Pillow's size guard to fire."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))


@pytest.mark.parametrize("command", ["inspect", "train", "evaluate"])
def test_an_image_over_pillows_limit_is_one_line_naming_it(tmp_path, command, capsys):
    for sub in ("images", "masks"):
        (tmp_path / sub).mkdir()
    _png_header_only(tmp_path / "images" / "huge.png", 20000, 20000)
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(tmp_path / "masks" / "huge.png")
    args = {
        "inspect": ["inspect", str(tmp_path)],
        "train": ["train", "--data", str(tmp_path), "--run", str(tmp_path / "run"), "--device", "cpu"],
        "evaluate": ["evaluate", "--pred", str(tmp_path / "images"), "--gt", str(tmp_path / "masks")],
    }[command]
    try:
        code = main(args)
    except SystemExit as exit:
        code = exit.code
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert code in (1, 2) and "Traceback" not in text
    line = next(line for line in text.splitlines() if "huge.png" in line)
    assert "over the limit of" in line and "megapixels" in line and "GeoTIFF" in line


def test_a_photo_too_large_to_decode_whole_says_how_to_convert_it(tmp_path, dark_checkpoint, monkeypatch, capsys):
    (tmp_path / "in").mkdir()
    Image.fromarray(pavement(200, 300).transpose(1, 2, 0)).save(tmp_path / "in" / "huge.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 20_000)  # Pillow refuses images over twice this
    assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--no-measure") == 1
    (row,) = csv.DictReader(open(tmp_path / "out" / "errors.csv"))
    assert row["path"].endswith("huge.png") and "tiled GeoTIFF" in row["error"] and "gdal_translate" in row["error"]
    assert "gdal_translate" in capsys.readouterr().err


@pytest.mark.parametrize("pixels, reason", [
    (np.linspace(0, 1, 40 * 60, dtype=np.float32).reshape(40, 60), "floating-point pixels"),  # Pillow would clip it black
    (np.arange(40 * 60, dtype=np.int32).reshape(40, 60) * 1000, "32-bit pixels from 0 to 2399000"),  # it would clip it white
])
def test_a_photo_beyond_16_bits_is_refused_naming_its_pixels_not_read_clipped(tmp_path, dark_checkpoint, pixels, reason):
    (tmp_path / "in").mkdir()
    Image.fromarray(pixels).save(tmp_path / "in" / "deep.tif")
    Image.fromarray(_photo_with_line(40, 60, 20)).save(tmp_path / "in" / "plain.png")
    assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--no-measure") == 1
    (row,) = csv.DictReader(open(tmp_path / "out" / "errors.csv"))
    assert row["path"].endswith("deep.tif") and row["error"].startswith(reason) and "8- and 16-bit photos" in row["error"]
    assert (tmp_path / "out" / "masks" / "plain.png").is_file() and not (tmp_path / "out" / "masks" / "deep.png").exists()


def test_a_dataset_photo_of_floating_point_pixels_is_a_problem_before_training(tmp_path, capsys):
    """Not a failure in some later epoch, when the loader first draws it, blamed on a file changed since the check."""
    for sub in ("images", "masks"):
        (tmp_path / sub).mkdir()
    photo = _photo_with_line(32, 32, 16)
    for stem in ("a", "b", "c"):
        Image.fromarray(np.where(photo[..., 0] < 100, 255, 0).astype(np.uint8)).save(tmp_path / "masks" / f"{stem}.png")
    for stem in ("a", "b"):
        Image.fromarray(photo).save(tmp_path / "images" / f"{stem}.png")
    Image.fromarray(np.full((32, 32), 0.8, np.float32)).save(tmp_path / "images" / "c.tif")
    assert main(["inspect", str(tmp_path)]) == 1
    assert f"problem: {tmp_path / 'images' / 'c.tif'}: floating-point pixels" in capsys.readouterr().out
    with pytest.raises(SystemExit) as stopped:
        main(["train", "--data", str(tmp_path), "--run", str(tmp_path / "run"), "--device", "cpu", "--epochs", "1"])
    assert stopped.value.code == 2 and "c.tif: floating-point pixels" in capsys.readouterr().err
    assert not (tmp_path / "run" / "last.pt").exists()


def test_a_32_bit_photo_within_16_bits_is_read_as_the_16_bit_photo():
    values = np.array([[0, 4095, 2048, 1]], np.uint16)
    wide, narrow = (Image.fromarray(values.astype(dtype)) for dtype in (np.int32, np.uint16))
    assert wide.mode == "I"
    assert torch.equal(load_image(_saved(wide)), load_image(_saved(narrow)))
    assert load_image(_saved(wide))[:, 0, 1].tolist() == [255, 255, 255]  # 12 bits at full scale


def _saved(image: Image.Image) -> io.BytesIO:
    data = io.BytesIO()
    image.save(data, format="TIFF")
    data.seek(0)
    return data
