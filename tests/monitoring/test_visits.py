"""Pairing two inspections' images: which image a --pairs cell names, and the CSVs that are refused in one line
naming the line. Reading inspection folders is tested end to end in test_compare.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import predict_photos_named
from crackseg.core.errors import InputError
from crackseg.monitoring.visits import Shot, pair_shots, read_visit


def _shots(root: Path, names: list[str]) -> list[Shot]:
    return [Shot(name, root / "masks" / f"{name}.png", root / "images" / f"{name}.png", 10.0, 10.0) for name in names]


def test_pairs_csv_cells_name_a_shot_by_name_then_path_then_a_file_name_only_one_shot_has(tmp_path, monkeypatch):
    """An Excel CSV (byte order mark, spaces): a path relative to the CSV's folder or to the working folder is that
    file, not the first shot with its file name."""
    before, after = _shots(tmp_path / "v1", ["a/wall", "b/wall", "c/kerb"]), _shots(tmp_path / "v2", ["a/wall", "b/wall", "c/kerb"])
    (tmp_path / "lists").mkdir()
    listed = tmp_path / "lists" / "pairs.csv"
    listed.write_text("before , after\n../v1/images/b/wall.png , b/wall\nv1/images/a/wall.png,v2/images/a/wall.png\n"
                      " kerb.png ,c/kerb\n", encoding="utf-8-sig")
    monkeypatch.chdir(tmp_path)
    paired, alone = pair_shots(before, after, listed)
    assert [(b.name, a.name) for b, a in paired] == [("b/wall", "b/wall"), ("a/wall", "a/wall"), ("c/kerb", "c/kerb")]
    assert alone == []


def test_a_pairs_csv_path_of_the_other_visit_is_refused_not_read_by_its_file_name(tmp_path, monkeypatch):
    """Columns swapped: v2's a.png in the BEFORE column was read as BEFORE's a.png, and the wrong photos compared."""
    before, after = _shots(tmp_path / "v1", ["a", "b"]), _shots(tmp_path / "v2", ["a", "b"])
    for shot in before + after:
        shot.photo.parent.mkdir(parents=True, exist_ok=True)
        shot.photo.touch()
    monkeypatch.chdir(tmp_path)
    listed = tmp_path / "pairs.csv"
    listed.write_text("before,after\nv2/images/a.png,v1/images/b.png\n")
    with pytest.raises(InputError, match=r"line 2: 'v2/images/a.png' is not an image of BEFORE$"):
        pair_shots(before, after, listed)
    listed.write_text("before,after\nimages/a.png,./images/b.png\n")  # a path inside each visit's folder
    assert [(b.name, a.name) for b, a in pair_shots(before, after, listed)[0]] == [("a", "b")]


def test_images_a_pairs_csv_does_not_list_pair_by_name(tmp_path):
    before, after = _shots(tmp_path / "v1", ["wall", "kerb", "gone"]), _shots(tmp_path / "v2", ["wall-2026", "kerb", "wall", "new"])
    listed = tmp_path / "pairs.csv"
    listed.write_text("before,after\nwall,wall-2026\n")
    paired, alone = pair_shots(before, after, listed)
    assert [(b.name, a.name) for b, a in paired] == [("wall", "wall-2026"), ("kerb", "kerb")]
    assert [(side, shot.name) for side, shot in alone] == [("before", "gone"), ("after", "wall"), ("after", "new")]


@pytest.mark.parametrize("content, message", [
    ("before,after\nwall.png,a/wall\n", "line 2: 'wall.png' is ambiguous: BEFORE has 2 images named wall.png (a/wall, b/wall)"),
    ("before,after\na/wall\n", "line 2: needs a before and an after cell"),
    ("before,after\n\na/wall,\n", "line 3: needs a before and an after cell"),
    ("before,after\na/wall,a/wall\nb/wall,b/wall\na/wall,a/wall\n", "line 4: the pair a/wall,a/wall is listed twice (also on line 2)"),
    ("before,after\na/wall,a/wall\na/wall,b/wall\n", "line 3: a/wall of BEFORE is already paired on line 2"),
    (b"before,after\n\xe9,a/wall\n", "not UTF-8 text"),
    (b"before,after\na/wall,a/wall\nb/wall,b/w\x00all\n", "line 3: holds a NUL byte"),  # a path with one is a ValueError
    (b"before,af\x00ter\na/wall,a/wall\n", "line 1: holds a NUL byte"),
])
def test_a_pairs_csv_that_is_not_one_pair_per_line_is_one_line_naming_it(tmp_path, content, message):
    listed = tmp_path / "pairs.csv"
    listed.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(InputError) as error:
        pair_shots(_shots(tmp_path / "v1", ["a/wall", "b/wall"]), _shots(tmp_path / "v2", ["a/wall", "b/wall"]), listed)
    assert str(error.value).startswith(f"--pairs {listed}") and message in str(error.value) and "\n" not in str(error.value)


def test_a_predictions_folder_gives_the_photos_predict_was_given_under_names_that_look_like_formulas(
        tmp_path, monkeypatch, dark_checkpoint):
    """predictions.csv holds '=x.jpg (a spreadsheet must not run it): the inspection's photo is =x.jpg."""
    names = ["=x.jpg", "+1.jpg"]
    predict_photos_named(names, tmp_path / "in", dark_checkpoint, tmp_path / "pred", monkeypatch)
    shots = read_visit(tmp_path / "pred", "BEFORE").shots
    assert sorted((shot.name, str(shot.photo)) for shot in shots) == [("+1", "+1.jpg"), ("=x", "=x.jpg")]
    assert all(shot.photo.is_file() and shot.mask.is_file() for shot in shots)
