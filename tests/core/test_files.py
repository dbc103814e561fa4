"""Atomic writes: temp names that fit and are recognisably crackseg's, CSV cells a spreadsheet cannot run."""

from __future__ import annotations

import csv
import os

import pytest

from crackseg.core.files import NAME_MAX, PendingFile, read_csv, remove_orphan_temps, temp_path, write_atomic, write_csv


def test_a_name_near_the_file_system_limit_still_gets_a_temp_name_that_fits(tmp_path):
    target = tmp_path / ("é" * 120 + ".png")  # 244 bytes in UTF-8
    assert len(os.fsencode(target.name)) == 244
    for suffix in ("", ".gpkg"):
        temp = temp_path(target, "a1b2c3d4", suffix)
        assert len(os.fsencode(temp.name)) <= NAME_MAX - 8  # room for SQLite's "-journal" beside it
        assert temp.name.startswith(".é") and temp.name.endswith(".crackseg-tmp" + suffix)
    write_atomic(target, b"data")
    assert target.read_bytes() == b"data" and [p.name for p in tmp_path.iterdir()] == [target.name]


def test_temp_names_of_names_that_are_not_utf8_are_encodable(tmp_path):
    target = tmp_path / os.fsdecode(b"caf\xe9.png")
    temp = temp_path(target, "x")
    temp.name.encode("utf-8")  # what GDAL and pyogrio need of a path
    write_atomic(target, b"data")
    assert (tmp_path / os.fsdecode(b"caf\xe9.png")).read_bytes() == b"data"


def test_only_crackseg_temp_files_are_cleared(tmp_path):
    ours = [temp_path(tmp_path / "a.png", "1234"), temp_path(tmp_path / "b.gpkg", "part0", ".gpkg"), temp_path(tmp_path / "lock", "77")]
    users = [tmp_path / ".a.png.tmp", tmp_path / ".notes.tmp.txt", tmp_path / ".x.tmp.gpkg", tmp_path / "crackseg-tmp"]
    for path in ours + users:
        path.write_text("x")
    assert remove_orphan_temps(tmp_path) == len(ours)
    assert not any(path.exists() for path in ours) and all(path.exists() for path in users)


def test_files_follow_the_umask_and_a_failed_write_leaves_nothing(tmp_path):
    old = os.umask(0o027)
    try:
        write_atomic(tmp_path / "a.txt", "text")
        with PendingFile(tmp_path / "b.bin") as pending:
            pending.temp.write_bytes(b"by path")
    finally:
        os.umask(old)
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o640 and (tmp_path / "b.bin").stat().st_mode & 0o777 == 0o640
    with pytest.raises(RuntimeError):
        with PendingFile(tmp_path / "c.bin") as pending:
            pending.temp.write_bytes(b"half")
            raise RuntimeError("the writer failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.bin"]
    (tmp_path / "d.bin").mkdir()  # a folder where the file goes: the rename fails, and takes the temp file with it
    (tmp_path / "d.bin" / "held").write_text("x")
    with pytest.raises(OSError):
        with PendingFile(tmp_path / "d.bin") as pending:
            pending.temp.write_bytes(b"whole")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.bin", "d.bin"]


def test_csv_text_cells_never_start_a_formula_and_numbers_stay_numbers(tmp_path):
    rows = [{"path": start + "HYPERLINK(\"http://x\")", "value": -1.5, "count": 3} for start in ("=", "+", "-", "@", "\t", "\r")]
    rows.append({"path": "plain/name.jpg", "value": 0.25, "count": -2})
    rows.append({"path": os.fsdecode(b"caf\xe9.jpg"), "value": 1e-7, "count": 0})
    write_csv(tmp_path / "t.csv", rows)
    text = (tmp_path / "t.csv").read_bytes().decode("utf-8")  # valid UTF-8 whatever the names held
    read = list(csv.DictReader(text.splitlines(keepends=True)))
    assert all(row["path"].startswith("'") for row in read[:6]), read
    assert read[6]["path"] == "plain/name.jpg" and read[7]["path"] == "caf\\xe9.jpg"
    assert [row["value"] for row in read] == ["-1.5"] * 6 + ["0.25", "1e-07"] and read[6]["count"] == "-2"


def test_a_table_saved_again_with_a_byte_order_mark_reads_as_written(tmp_path):
    """Excel's "CSV UTF-8" starts the file with a BOM, which would make the first column "\\ufeffpath"."""
    write_csv(tmp_path / "t.csv", [{"path": "a.jpg", "pair": 1}])
    (tmp_path / "t.csv").write_bytes(b"\xef\xbb\xbf" + (tmp_path / "t.csv").read_bytes())
    assert read_csv(tmp_path / "t.csv", ("path", "pair")) == [{"path": "a.jpg", "pair": "1"}]


def test_csv_cells_that_begin_with_a_quote_come_back_as_they_were(tmp_path):
    names = ["'=x.jpg", "'-y.jpg", "'plain.jpg", "''.jpg", "=z.jpg", "ok.jpg"]
    write_csv(tmp_path / "t.csv", [{"path": name} for name in names])
    assert [row["path"] for row in read_csv(tmp_path / "t.csv")] == names
    written = [row["path"] for row in csv.DictReader(open(tmp_path / "t.csv"))]
    assert all(cell.startswith("'") for cell in written[:5]) and written[5] == "ok.jpg"  # no cell starts a formula


@pytest.mark.skipif(os.name == "nt", reason="Windows file names are text, never bytes that are not UTF-8")
def test_a_file_name_that_is_not_utf8_is_written_as_escapes_and_read_back_as_the_name(tmp_path):
    name = os.fsdecode(b"in/fissur\xe9 \xff.png")  # Latin-1 bytes, as a Windows share or an old archive leaves them
    literal = "C:\\x86\\photos\\x5c.jpg"  # backslashes as text, which must not read back as escapes
    write_csv(tmp_path / "t.csv", [{"path": name, "note": literal, "plain": "C:\\photos\\a.jpg"}])
    line = (tmp_path / "t.csv").read_bytes().decode("utf-8").splitlines()[1]
    assert line == "in/fissur\\xe9 \\xff.png,C:\\x5cx86\\photos\\x5cx5c.jpg,C:\\photos\\a.jpg"
    (row,) = read_csv(tmp_path / "t.csv")
    assert row == {"path": name, "note": literal, "plain": "C:\\photos\\a.jpg"}
    assert os.fsencode(row["path"]) == b"in/fissur\xe9 \xff.png"
