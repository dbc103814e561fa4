"""Crack-free photos (hard negatives): negatives.txt as a split entry, a folder of them, empty masks, the saved pool."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from crackseg.cli.main import main
from crackseg.core.errors import InputError
from crackseg.data.datasets import inspection_report, open_dataset
from crackseg.data.splits import load_split, make_split, save_split
from crackseg.data.negatives import folder_negatives, negative_pool


def _photo(path: Path, seed: int = 0, size=(24, 32)) -> Path:
    """A grey texture crossed by a dark straight joint: crack-like, but no crack."""
    pixels = np.random.default_rng(seed).integers(120, 200, (*size, 3), dtype=np.uint8)
    pixels[size[0] // 2 : size[0] // 2 + 2] = 40
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)
    return path


def _mask(path: Path, crack_rows: int = 0, size=(24, 32)) -> Path:
    mask = np.zeros(size, np.uint8)
    mask[:crack_rows] = 255
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(mask).save(path)
    return path


def _dataset_with_negatives(root: Path) -> Path:
    for i, stem in enumerate("abcdef"):
        _photo(root / "images" / f"{stem}.png", i)
        _mask(root / "masks" / f"{stem}.png", crack_rows=2)
    _photo(root / "images" / "n1.png", 10)  # no mask: all background
    _photo(root / "images" / "n2.jpg", 11)
    _mask(root / "masks" / "n2.png")  # an empty mask is fine
    (root / "negatives.txt").write_text("n2\nn1\n")
    return root


def test_negatives_txt_is_a_split_entry_kept_out_of_the_pairs_and_the_split(tmp_path, capsys):
    root = _dataset_with_negatives(tmp_path)
    found = open_dataset(root)
    assert not found.problems
    assert [s.stem for s in found.samples] == list("abcdef")
    assert [(s.stem, s.mask) for s in found.negatives] == [("n1", None), ("n2", root / "masks" / "n2.png")]
    split = make_split([s.stem for s in found.samples], 0.3, 0, found.listed)
    assert not {"n1", "n2"} & {stem for stems in split.values() for stem in stems}
    assert "crack-free: 2 photos listed in negatives.txt" in inspection_report(found, split, 0.3)

    (root / "negatives.txt").write_text("n1\nn2\nghost\n")
    assert [str(p) for p in open_dataset(root).problems] == [f"{root / 'negatives.txt'}: lists 'ghost', which has no image in {root / 'images'}"]

    (root / "negatives.txt").write_text("n1\nn2\n")
    (root / "test.txt").write_text("a\nn1\n")
    with pytest.raises(InputError, match=r"test.txt: lists 'n1', which negatives.txt lists as crack-free"):
        open_dataset(root)


def test_a_negative_whose_mask_holds_cracks_is_refused_naming_the_mask(tmp_path, capsys):
    root = _dataset_with_negatives(tmp_path)
    bad = _mask(root / "masks" / "n2.png", crack_rows=3)
    with pytest.raises(InputError, match=rf"^{bad}: 96 crack pixels in the mask of a crack-free image"):
        open_dataset(root)
    with pytest.raises(SystemExit) as exit:
        main(["inspect", str(root)])
    error = capsys.readouterr().err
    assert exit.value.code == 2 and error.startswith(f"crackseg: error: {bad}: ") and error.count("\n") == 1
    folder = tmp_path / "photos"
    _photo(folder / "images" / "p.png", 50)
    bad = _mask(folder / "masks" / "p.png", crack_rows=1)
    pool = folder_negatives(folder)
    assert [(s.stem, s.mask) for s in pool] == [("p", bad)]
    with pytest.raises(InputError, match=rf"^{bad}: 32 crack pixels"):
        negative_pool(open_dataset(_dataset_with_negatives(tmp_path / "data")), folder)


def test_a_folder_of_photos_needs_no_masks_and_its_pool_is_saved_and_fixed(tmp_path):
    data = _dataset_with_negatives(tmp_path / "data")
    folder = tmp_path / "photos"
    for i, name in enumerate(["z.png", "y.jpg", "x.bmp"]):
        _photo(folder / name, 20 + i)
    (folder / "notes.txt").write_text("not a photo")
    found = open_dataset(data)
    pool, entries, problems = negative_pool(found, folder)
    assert not problems and all(s.mask is None for s in pool[2:])
    assert [s.stem for s in pool] == ["n1", "n2", "x", "y", "z"]  # negatives.txt's, then the folder's, each by stem
    assert entries == {"negatives": ["n1", "n2"], "negative_files": ["x.bmp", "y.jpg", "z.png"]}

    split = make_split([s.stem for s in found.samples], 0.3, 0, found.listed) | entries
    save_split(tmp_path / "split.json", split)
    saved = load_split(tmp_path / "split.json")
    assert saved == split
    _photo(folder / "w.png")  # added after the run started: left out on resume
    assert negative_pool(found, folder, saved)[0] == pool
    (folder / "y.jpg").unlink()
    with pytest.raises(InputError, match=r"1 crack-free photos of the saved split are no longer usable \(e.g. y.jpg\)"):
        negative_pool(found, folder, saved)
    assert negative_pool(found, None, {"train": []})[:2] == ([], {})  # a run saved without negatives has none


@pytest.mark.parametrize("negatives", [
    lambda data, tmp: data / "images",  # the crack photos themselves
    lambda data, tmp: data,  # the dataset's root
    lambda data, tmp: _copied(data / "images" / "c.png", tmp / "elsewhere" / "wall_0001.png"),  # a copy under another name
    lambda data, tmp: _copied(data / "images" / "n1.png", tmp / "more" / "n1.png"),  # one of its own crack-free photos
])
def test_a_pool_sharing_photos_with_the_dataset_is_refused_in_one_line(tmp_path, capsys, negatives):
    data = _dataset_with_negatives(tmp_path / "data")
    folder = negatives(data, tmp_path)
    with pytest.raises(InputError, match=rf"--negatives {folder}: \d+ of its \d+ photos are photos of the training data"):
        negative_pool(open_dataset(data), folder)
    with pytest.raises(SystemExit) as exit:
        main(["train", "--data", str(data), "--run", str(tmp_path / "run"), "--negatives", str(folder), "--device", "cpu",
              "--encoder-weights", "none"])
    assert exit.value.code == 2 and capsys.readouterr().err.count("\n") == 1 and not (tmp_path / "run" / "last.pt").exists()


def test_crack_masks_beside_an_images_folder_make_it_no_pool_of_negatives(tmp_path):
    data = _dataset_with_negatives(tmp_path / "data")
    other = tmp_path / "other"
    for i, stem in enumerate("pq"):
        _photo(other / "images" / f"{stem}.png", 30 + i)
        _mask(other / "masks" / f"{stem}.png", crack_rows=2)
    with pytest.raises(InputError, match=rf"^{other / 'masks' / 'p.png'}: 64 crack pixels in the mask of a crack-free image"):
        negative_pool(open_dataset(data), other / "images")


def _copied(source: Path, target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(source.read_bytes())
    _photo(target.parent / "own.png", 40)  # and a photo of its own
    return target.parent


def test_unreadable_negatives_are_problems_and_an_empty_folder_an_error(tmp_path):
    data = _dataset_with_negatives(tmp_path / "data")
    folder = tmp_path / "photos"
    _photo(folder / "good.png", 70)
    (folder / "broken.png").write_bytes(b"")
    pool, entries, problems = negative_pool(open_dataset(data), folder)
    assert [s.stem for s in pool][-1] == "good" and entries["negative_files"] == ["good.png"]
    assert [str(p) for p in problems] == [f"{folder / 'broken.png'}: not a readable image (empty, or another kind of file)"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="holds no photos"):
        folder_negatives(tmp_path / "empty")
    with pytest.raises(InputError, match=r"is not a folder \(--negatives\)"):
        folder_negatives(tmp_path / "missing")


def test_a_negative_whose_empty_mask_has_another_size_is_a_problem_naming_the_mask(tmp_path):
    root = _dataset_with_negatives(tmp_path)
    bad = _mask(root / "masks" / "n2.png", size=(30, 40))
    assert [str(p) for p in open_dataset(root).problems] == [f"{bad}: mask is 40x30 px but its image is 32x24"]
