from __future__ import annotations

import math
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from crackseg.cli.main import main
from crackseg.core.errors import InputError
from crackseg.data import datasets as data
from crackseg.data.datasets import crack_pixel_weight, open_dataset, usable_samples
from crackseg.data.images import load_image, load_mask, read_probability
from crackseg.data.pairing import find_samples
from crackseg.data.splits import load_split, make_split, save_split


def _dataset(root: Path, stems, size=(24, 32), mask_suffix=".png", mask_pattern="{stem}") -> Path:
    rng = np.random.default_rng(0)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "masks").mkdir(parents=True, exist_ok=True)
    for stem in stems:
        Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(root / "images" / f"{stem}.png")
        mask = np.zeros(size, np.uint8)
        mask[size[0] // 2, :] = 255
        Image.fromarray(mask).save(root / "masks" / (mask_pattern.format(stem=stem) + mask_suffix))
    return root


def test_pairs_by_stem_whatever_the_listing_order(tmp_path, monkeypatch):
    root = _dataset(tmp_path, ["b", "a", "c", "d"])
    original = Path.iterdir

    def shuffled(self):
        entries = list(original(self))
        random.Random(str(self)).shuffle(entries)
        return iter(entries)

    monkeypatch.setattr(Path, "iterdir", shuffled)
    samples, problems = find_samples(root / "images", root / "masks")
    assert not problems
    assert [(s.stem, s.image.stem, s.mask.stem) for s in samples] == [(k, k, k) for k in "abcd"]


def test_photos_and_masks_in_formats_crackseg_does_not_read_are_problems_not_left_out_in_silence(tmp_path):
    root = _dataset(tmp_path, ["a", "b", "c"])
    for folder, stem in (("images", "a"), ("masks", "a"), ("masks", "b")):
        Image.open(root / folder / f"{stem}.png").save(root / folder / f"{stem}.webp")
        (root / folder / f"{stem}.png").unlink()
    (root / "masks" / "notes.txt").write_text("not a photo")
    samples, problems = find_samples(root / "images", root / "masks")
    assert [sample.stem for sample in samples] == ["c"]
    assert sorted(str(problem) for problem in problems) == sorted([
        f"{root / 'images' / 'a.webp'}: a .webp file, a format crackseg does not read: convert it to PNG, JPEG or TIFF "
        "(.jpg, .jpeg, .png, .bmp, .tif, .tiff)",
        f"{root / 'masks' / 'a.webp'}: a .webp file, a format crackseg does not read: convert it to PNG, JPEG or TIFF "
        "(.jpg, .jpeg, .png, .bmp, .tif, .tiff)",
        f"{root / 'masks' / 'b.webp'}: a .webp file, a format crackseg does not read: convert it to PNG, JPEG or TIFF "
        "(.jpg, .jpeg, .png, .bmp, .tif, .tiff)",
        f"{root / 'images' / 'b.png'}: no mask for this image in {root / 'masks'}"])


def test_broken_links_are_problems_not_left_out_in_silence(tmp_path):
    root = _dataset(tmp_path, ["a", "b"])
    (root / "images" / "b.png").unlink()
    (root / "images" / "b.png").symlink_to(tmp_path / "moved" / "b.png")  # its mask real: "no image for this mask" alone misleads
    (root / "images" / "c.jpg").symlink_to(tmp_path / "moved" / "c.jpg")
    (root / "masks" / "c.png").symlink_to(tmp_path / "moved" / "c.png")
    samples, problems = find_samples(root / "images", root / "masks")
    assert [sample.stem for sample in samples] == ["a"]
    said = [str(problem) for problem in problems]
    for folder, name in (("images", "b.png"), ("images", "c.jpg"), ("masks", "c.png")):
        assert f"{root / folder / name}: a broken link (to {tmp_path / 'moved' / name}): its file is missing" in said, said


def test_mask_pattern_pairs_public_layouts(tmp_path):
    root = _dataset(tmp_path, ["001", "002"], mask_pattern="{stem}_mask")
    samples, problems = find_samples(root / "images", root / "masks", "{stem}_mask")
    assert not problems and [s.mask.name for s in samples] == ["001_mask.png", "002_mask.png"]


def test_unmatched_and_ambiguous_files_are_listed(tmp_path):
    root = _dataset(tmp_path, ["a", "b", "c"])
    (root / "masks" / "b.png").unlink()
    (root / "images" / "c.png").unlink()
    Image.new("RGB", (32, 24)).save(root / "images" / "a.jpg")
    (root / "masks" / "d.png").write_bytes((root / "masks" / "a.png").read_bytes())
    Image.new("RGB", (32, 24)).save(root / "images" / "d.bmp")
    Image.new("RGB", (32, 24)).save(root / "images" / "d.tif")
    samples, problems = find_samples(root / "images", root / "masks")
    assert samples == []  # a and d have two images each: neither is guessed
    messages = sorted(str(p) for p in problems)
    assert any("b.png: no mask" in m for m in messages)
    assert any("c.png: no image" in m for m in messages)
    assert any("a.jpg: shares its stem with a.png: cannot tell which to use" in m for m in messages)
    assert any("d.bmp: shares its stem with d.tif" in m for m in messages)
    assert len(messages) == 4  # the twins' masks are not also reported as unmatched


@pytest.mark.parametrize(
    "spoil, expected",
    [
        (lambda p: p.write_bytes(b""), "not a readable image"),
        (lambda p: p.write_text("hello, I am text"), "not a readable image"),
        ("truncate", "truncated"),
        ("resize", "mask is 32x24 px but its image is 16x16"),
    ],
    ids=["zero-byte", "text-named-jpg", "truncated-jpeg", "size-mismatch"],
)
def test_bad_files_are_reported_with_their_path(tmp_path, spoil, expected):
    root = _dataset(tmp_path, ["ok", "bad"])
    (root / "images" / "bad.png").unlink()
    target = root / "images" / "bad.jpg"
    rng = np.random.default_rng(1)
    Image.fromarray(rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)).save(target, quality=95)
    if spoil == "truncate":
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    elif spoil == "resize":
        Image.new("RGB", (16, 16)).save(target)
    else:
        spoil(target)
    found = open_dataset(root)
    assert [s.stem for s in found.samples] == ["ok"]
    assert len(found.problems) == 1
    assert str(found.problems[0]).startswith(str(target)) or str(found.problems[0]).startswith(str(root / "masks"))
    assert expected in str(found.problems[0])


def test_error_policy_lists_every_problem_and_skip_keeps_the_rest(tmp_path):
    root = _dataset(tmp_path, ["a", "b", "c"])
    (root / "images" / "b.png").write_bytes(b"")
    (root / "masks" / "c.png").unlink()
    found = open_dataset(root)
    with pytest.raises(InputError) as caught:
        usable_samples(found, "error")
    message = str(caught.value)
    assert message.startswith("2 problems in the dataset")
    assert "b.png: not a readable image" in message and "c.png: no mask" in message
    assert [s.stem for s in usable_samples(found, "skip")] == ["a"]


@pytest.mark.parametrize("mode", ["RGBA", "L", "P", "I;16"])
def test_image_modes_load_as_rgb(tmp_path, mode):
    grey = np.arange(24 * 32, dtype=np.uint16).reshape(24, 32) % 256
    if mode == "I;16":
        image = Image.fromarray((grey * 257).astype(np.uint16))
    else:
        image = Image.fromarray(grey.astype(np.uint8)).convert(mode)
    path = tmp_path / "x.png"
    image.save(path)
    loaded = load_image(path)
    assert loaded.shape == (3, 24, 32) and loaded.dtype == torch.uint8
    assert torch.equal(loaded[0], torch.from_numpy(grey.astype(np.uint8)))


def test_lossy_jpeg_mask_is_binarized_and_counted(tmp_path):
    root = _dataset(tmp_path, ["a", "b"])
    mask = np.zeros((24, 32), np.uint8)
    mask[8:16, 4:28] = 255
    Image.fromarray(mask).save(root / "masks" / "a.jpg", quality=60)
    (root / "masks" / "a.png").unlink()
    found = open_dataset(root)
    assert not found.problems and found.non_binary_masks == 1
    loaded = load_mask(root / "masks" / "a.jpg")
    assert set(loaded.unique().tolist()) == {0, 1}
    assert (loaded[0].numpy() == (mask > 127)).mean() > 0.97


def test_zero_one_masks_read_as_zero_255_everywhere(tmp_path):
    root = _dataset(tmp_path, ["a"])
    mask = np.zeros((24, 32), np.uint8)
    mask[3] = 1
    Image.fromarray(mask).save(root / "masks" / "a.png")
    found = open_dataset(root)
    assert not found.problems and found.masks["a"].crack_pixels == 32 and found.masks["a"].binary
    assert torch.equal(load_mask(root / "masks" / "a.png")[0], torch.from_numpy(mask))
    assert read_probability(root / "masks" / "a.png").max() == 1.0  # evaluate reads predictions the same way


def test_split_is_seeded_by_stem_saved_and_reloaded(tmp_path):
    stems = [f"{i:03d}" for i in range(50)]
    split = make_split(stems, 0.2, seed=3)
    assert len(split["val"]) == 10 and not set(split["val"]) & set(split["train"])
    assert make_split(list(reversed(stems)), 0.2, seed=3) == split
    assert make_split(stems, 0.2, seed=4) != split
    grown = make_split(stems + ["new1", "new2"], 0.2, seed=3)
    assert len(set(grown["val"]) & set(split["val"])) >= 8  # new files barely move the draw
    save_split(tmp_path / "split.json", split)
    assert load_split(tmp_path / "split.json") == split


def test_split_files_are_honoured_and_validation_carved_from_train(tmp_path):
    root = _dataset(tmp_path, [f"s{i}" for i in range(10)])
    (root / "train.txt").write_text("\n".join(f"s{i}" for i in range(7)) + "\n")
    (root / "test.txt").write_text("s7\ns8\ns9\nmissing\n")
    found = open_dataset(root)
    assert any("lists 'missing'" in str(p) for p in found.problems)
    split = make_split([s.stem for s in found.samples], 0.3, 0, found.listed)
    assert split["test"] == ["s7", "s8", "s9"]
    assert len(split["val"]) == 2 and set(split["train"]) | set(split["val"]) == {f"s{i}" for i in range(7)}


@pytest.mark.parametrize("line, meant", [("s8.jpg", "s8"), ("images/s8.png", "s8"), ("S8", "s8"), ("C:\\data\\S8.JPG", "s8")])
def test_a_split_line_naming_a_pair_in_another_form_is_refused_whatever_the_bad_sample_policy(tmp_path, line, meant):
    """Skipped as a bad line, the photo it holds out would be drawn into training."""
    root = _dataset(tmp_path, [f"s{i}" for i in range(10)])
    (root / "test.txt").write_text(f"s9\n{line}\n")
    with pytest.raises(InputError, match=rf"test.txt: lists {re.escape(repr(line))}, the pair '{meant}' in another form"):
        open_dataset(root)


def test_a_split_line_naming_a_pair_by_its_mask_or_in_another_unicode_form_is_refused(tmp_path):
    root = _dataset(tmp_path, ["s0", "s1", "fissure_\u00e9"], mask_pattern="{stem}_mask")
    for line, meant in (("s0_mask.png", "s0"), ("fissure_e\u0301", "fissure_\u00e9")):  # `ls masks`; macOS's NFD
        (root / "test.txt").write_text(f"s1\n{line}\n")
        with pytest.raises(InputError, match=rf"test.txt: lists {re.escape(repr(line))}, the pair '{meant}' in another form"):
            open_dataset(root, mask_pattern="{stem}_mask")


def test_a_mask_pattern_with_other_braces_is_taken_literally_when_checking_split_lines(tmp_path):
    root = _dataset(tmp_path, ["s0", "s1"], mask_pattern="{stem}_x")
    for mask in (root / "masks").iterdir():
        mask.rename(mask.with_name(mask.name.replace("_x", "_{v}")))
    (root / "test.txt").write_text("s1\ns0_{v}.png\n")
    with pytest.raises(InputError, match=r"test.txt: lists 's0_\{v\}.png', the pair 's0' in another form"):
        open_dataset(root, mask_pattern="{stem}_{v}")


@pytest.mark.parametrize("kind", ["broken link", "folder", "another case"])
def test_a_split_file_that_cannot_be_read_or_is_named_in_another_case_is_refused(tmp_path, kind):
    """Passed over, the photos it holds out would be drawn into training."""
    root = _dataset(tmp_path, [f"s{i}" for i in range(4)])
    if kind == "broken link":
        (root / "test.txt").symlink_to(tmp_path / "moved" / "test.txt")
        message = f"{root / 'test.txt'}: not a file (a broken link)"
    elif kind == "folder":
        (root / "test.txt").mkdir()
        message = f"{root / 'test.txt'}: not a file (a folder)"
    else:
        (root / "Test.txt").write_text("s3\n")
        message = f"{root / 'Test.txt'}: crackseg reads it only as test.txt, in lower case; rename it"
    with pytest.raises(InputError, match=f"^{re.escape(message)}"):
        open_dataset(root)


def test_crack_pixel_weight_on_hand_made_masks():
    infos = [data.MaskInfo(10, 10, 10, True), data.MaskInfo(10, 10, 0, True), data.MaskInfo(5, 4, 10, True)]
    assert crack_pixel_weight(infos) == pytest.approx((220 - 20) / 20)
    with pytest.raises(InputError, match="no crack pixels"):
        crack_pixel_weight([data.MaskInfo(4, 4, 0, True)])


def _inspect(capsys, *args) -> tuple[int, str]:
    try:
        code = main(["inspect", *map(str, args)])
    except SystemExit as exit:
        code = exit.code
    return code, capsys.readouterr().out


def test_inspect_exit_codes(synth_root, tmp_path, capsys):
    code, out = _inspect(capsys, synth_root)
    assert code == 0
    assert "pairs: 12 usable" in out and "crack pixel weight" in out
    root = _dataset(tmp_path, ["a", "b"])
    (root / "masks" / "b.png").unlink()
    code, out = _inspect(capsys, root)
    assert code == 1 and "b.png: no mask" in out and "1 problems found" in out
    assert _inspect(capsys, tmp_path / "nothing")[0] == 2


def test_inspect_on_crackforest(cfd_root, capsys):
    code, out = _inspect(capsys, cfd_root)
    assert code == 0, out
    assert "pairs: 117 usable: train 64, val 7, test 46" in out
    sqrt, auto = map(float, re.search(r"crack pixel weight: ([\d.]+) \(--pos-weight sqrt.*; ([\d.]+) \(auto\)", out).groups())
    assert 40 < auto < 90 and sqrt == pytest.approx(math.sqrt(auto), abs=0.01)  # about 1.6% crack pixels


def test_a_stem_repeated_in_a_split_file_is_refused_naming_it(tmp_path):
    root = _dataset(tmp_path, ["a", "b", "c"])
    (root / "train.txt").write_text("a\nb\na\n")
    with pytest.raises(InputError, match=r"train.txt: lists 'a' more than once"):
        open_dataset(root)
    (root / "train.txt").write_text("\n\n")
    with pytest.raises(InputError, match=r"train.txt: lists no stems"):
        open_dataset(root)


def test_split_files_from_windows_editors_are_read_and_others_refused(tmp_path):
    """Notepad saves UTF-8 with a byte order mark, or UTF-16 ("Unicode"); Latin-1 is not UTF-8."""
    root = _dataset(tmp_path, ["a", "b", "c", "é"])
    for content in ("a\r\nb\r\n".encode("utf-8-sig"), "a\r\nb\r\n".encode("utf-16"), b"\xfe\xff" + "a\nb\n".encode("utf-16-be")):
        (root / "test.txt").write_bytes(content)
        assert open_dataset(root).listed["test"] == ["a", "b"], content
    (root / "test.txt").write_bytes("é\n".encode("latin-1"))
    with pytest.raises(InputError, match=r"test.txt: not UTF-8 text; save it as UTF-8, one stem per line$"):
        open_dataset(root)


def test_inspect_on_a_folder_without_pairs_exits_1(tmp_path, capsys):
    (tmp_path / "images").mkdir()
    (tmp_path / "masks").mkdir()
    assert main(["inspect", str(tmp_path)]) == 1
    assert "no image/mask pairs" in capsys.readouterr().out


def test_images_in_subfolders_are_a_problem_not_left_out_in_silence(tmp_path):
    root = _dataset(tmp_path, ["a", "b"])
    for sub in ("images", "masks"):
        (root / sub / "siteB").mkdir()
        (root / sub / ".thumbnails").mkdir()  # hidden: a viewer's, not the user's
        for folder in ("siteB", ".thumbnails"):
            (root / sub / folder / "c.png").write_bytes((root / sub / "a.png").read_bytes())
    found = open_dataset(root)
    assert [s.stem for s in found.samples] == ["a", "b"]
    assert [str(p) for p in found.problems] == [
        f"{root / sub / 'siteB'}: 1 image in a subfolder, which crackseg does not read (it pairs the files right in "
        f"{root / sub}); move them up, or make each site a dataset of its own (train takes --data once per dataset)" for sub in ("images", "masks")]


def test_photos_and_masks_in_one_folder_pair_by_the_mask_pattern(tmp_path):
    root = _dataset(tmp_path, ["a", "b"])
    for path in (root / "masks").iterdir():
        path.rename(root / "images" / f"{path.stem}_mask{path.suffix}")
    samples, problems = find_samples(root / "images", root / "images", "{stem}_mask")
    assert not problems and [(s.stem, s.mask.name) for s in samples] == [("a", "a_mask.png"), ("b", "b_mask.png")]


def test_a_masks_folder_inside_the_images_folder_is_read_not_reported(tmp_path):
    root = _dataset(tmp_path, ["a", "b"])
    (root / "masks").rename(root / "images" / "masks")
    samples, problems = find_samples(root / "images", root / "images" / "masks")
    assert not problems and [s.stem for s in samples] == ["a", "b"]
