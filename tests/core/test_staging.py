"""The staged folder: one way to write an --out, local or in object storage (a real S3 server on loopback)."""

from __future__ import annotations

from pathlib import Path

import pytest

from crackseg.core.errors import InputError
from crackseg.core.staging import StagedFolder, StagedSources, inside, location, output_location


def _keys(s3, prefix: str) -> dict[str, bytes]:
    listed = s3.client.list_objects_v2(Bucket=s3.name, Prefix=prefix).get("Contents", [])
    return {item["Key"][len(prefix):]: s3.client.get_object(Bucket=s3.name, Key=item["Key"])["Body"].read() for item in listed}


def _run(out: StagedFolder, decides_on=lambda key: key == "table.csv") -> None:
    """What a run does, the same wherever ``out`` lies: reads the table it decides on, writes two files, removes one."""
    with out:
        out.prepare(decides_on)
        table = out.root / "table.csv"
        rows = table.read_text() if table.exists() else ""
        (out.root / "masks").mkdir(exist_ok=True)
        (out.root / "masks" / "a.png").write_bytes(b"a")
        out.upload([out.root / "masks" / "a.png"])
        table.write_text(rows + "a\n")
        (out.root / "stale.json").unlink(missing_ok=True)
        out.finish()


def test_a_local_folder_is_written_in_place_and_locked_while_prepared(tmp_path):
    out = StagedFolder(tmp_path / "out", "predict", "predictions")
    assert out.root == tmp_path / "out" and not out.remote
    with out:
        out.prepare()
        with pytest.raises(InputError, match="in use by"):
            StagedFolder(tmp_path / "out", "predict", "predictions").prepare()
    assert not (tmp_path / "out" / "lock").exists()
    StagedFolder(tmp_path / "out", "predict", "predictions").prepare()  # released


def test_a_store_prefix_ends_as_the_same_files_as_a_local_folder(tmp_path, s3, staging):
    (tmp_path / "local").mkdir()
    for name, data in (("table.csv", b"old\n"), ("stale.json", b"{}"), ("keep.txt", b"theirs")):
        (tmp_path / "local" / name).write_bytes(data)
        s3.put(f"out/{name}", data)
    _run(StagedFolder(tmp_path / "local", "predict", "predictions"), lambda key: key in ("table.csv", "stale.json"))
    _run(StagedFolder(s3.url("out/"), "predict", "predictions"), lambda key: key in ("table.csv", "stale.json"))
    local = {path.relative_to(tmp_path / "local").as_posix(): path.read_bytes()
             for path in (tmp_path / "local").rglob("*") if path.is_file()}
    assert _keys(s3, "out/") == local == {"table.csv": b"old\na\n", "keep.txt": b"theirs", "masks/a.png": b"a"}
    assert not any(staging.iterdir())  # the staging folder and the lock object are gone


def test_a_store_prefix_is_locked_and_unchanged_files_are_not_sent_again(s3, staging, monkeypatch):
    first = StagedFolder(s3.url("out/"), "compare", "comparisons")
    with first:
        first.prepare()
        assert ".crackseg-compare.lock" in _keys(s3, "out/")
        with pytest.raises(InputError, match="another compare is writing"):
            StagedFolder(s3.url("out/"), "compare", "comparisons").prepare()
        (first.root / "a.csv").write_text("a")
        first.upload([first.root / "a.csv"])
        sent = []
        monkeypatch.setattr("crackseg.core.staging.upload_file", lambda path, url: sent.append(url))
        first.finish()
        assert sent == []
    assert _keys(s3, "out/") == {"a.csv": b"a"}


def test_what_existed_is_known_before_any_work_and_a_kept_file_is_fetched(s3, staging):
    s3.put("out/masks/a.png", b"mask")
    out = StagedFolder(s3.url("out/"), "predict", "predictions")
    with out:
        assert out.prepare() == {"masks/a.png"}
        assert out.existed(out.root / "masks" / "a.png") and not out.existed(out.root / "masks" / "b.png")
        assert not (out.root / "masks" / "a.png").exists()
        assert out.fetch([out.root / "masks" / "a.png"]) and (out.root / "masks" / "a.png").read_bytes() == b"mask"
        assert out.shown(out.root / "masks" / "a.png") == s3.url("out/masks/a.png") and out.shown() == s3.url("out/")


def test_files_handed_over_reach_another_process_through_the_store(s3, staging):
    sender, receiver = (StagedFolder(s3.url("out/"), "predict", "predictions") for _ in range(2))
    with sender, receiver:
        (sender.root / ".part-1").write_bytes(b"rows")
        sender.hand_over([sender.root / ".part-1", sender.root / ".never-written"])
        receiver.take_over([receiver.root / ".part-1", receiver.root / ".never-written"])
        assert (receiver.root / ".part-1").read_bytes() == b"rows" and not (receiver.root / ".never-written").exists()
    assert _keys(s3, "out/") == {}


@pytest.mark.parametrize("target", ["https://host/out/", "http://host/out", "gs://bucket/out/"])
def test_a_target_that_cannot_be_written_is_one_line(target):
    with pytest.raises(InputError, match=r"--out .*: reports are written to a local folder or an s3://bucket/prefix/ URL"):
        output_location(target, "reports")


def test_locations_and_what_lies_inside_what(tmp_path):
    assert location("s3://b/x/") == "s3://b/x/" and location("a/b") == Path("a/b")
    assert inside(tmp_path / "a" / "b", tmp_path / "a") and inside(tmp_path / "a", tmp_path / "a")
    assert not inside(tmp_path / "ab", tmp_path / "a") and not inside(tmp_path / "a", tmp_path / "a" / "b")
    assert inside("s3://b/a/b/", "s3://b/a") and not inside("s3://b/ab/", "s3://b/a/")
    assert not inside("s3://b/a/", tmp_path / "a")


def test_sources_in_a_store_are_copied_and_named_by_their_urls(tmp_path, s3, staging):
    s3.put("visit/masks/a.png", b"m")
    s3.put("visit/.crackseg-predict.lock", b"{}")
    with StagedSources("compare") as sources:
        assert sources.folder(tmp_path, "BEFORE", "an inspection") == tmp_path
        copy = sources.folder(s3.url("visit/"), "AFTER", "an inspection")
        assert sorted(path.name for path in copy.rglob("*") if path.is_file()) == ["a.png"]
        assert sources.shown(f"cannot read {copy / 'masks' / 'a.png'}") == f"cannot read {s3.url('visit/masks/a.png')}"
        with pytest.raises(InputError, match="no objects below this prefix"):
            sources.folder(s3.url("empty/"), "BEFORE", "an inspection")
    assert not any(staging.iterdir())


@pytest.mark.parametrize("typo", ["s3:/survey/typo/", "s3://", "s3:", "S3:/bucket"])
def test_an_out_that_looks_like_a_url_but_is_none_is_refused_not_made_a_local_folder(tmp_path, typo, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if typo != "s3:":  # no slash: an ordinary (if odd) local name
        with pytest.raises(InputError, match=f"--out {typo}: not a URL; write an s3://bucket/prefix/ URL"):
            output_location(typo, "predictions")
    else:
        assert output_location(typo, "predictions") == Path("s3:")
    assert output_location("C:/surveys", "predictions") == Path("C:/surveys")  # a drive letter is no scheme
    assert not list(tmp_path.iterdir())
