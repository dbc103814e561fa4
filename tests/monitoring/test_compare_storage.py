"""crackseg compare with inspections and --out in object storage (a real S3 server on loopback, no mocks): the outputs
are those of a local compare, naming the URLs; earlier outputs, a missing prefix and a register in the store are
refused before any work; no lock object and no staged copy is left."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

from conftest import cli_result
import test_compare
from test_compare import _rows

two_visits = test_compare.two_visits  # its inspections, a fixture


def _keys(s3, prefix: str) -> list[str]:
    return sorted(item["Key"] for item in s3.client.list_objects_v2(Bucket=s3.name, Prefix=prefix).get("Contents", []))


def _download(s3, prefix: str, folder: Path) -> Path:
    for key in _keys(s3, prefix + "/"):
        target = folder / key[len(prefix) + 1:]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(s3.client.get_object(Bucket=s3.name, Key=key)["Body"].read())
    return folder


def test_inspections_and_out_in_the_store_give_a_local_compare_naming_the_urls(s3, two_visits, tmp_path, staging):
    before, after = two_visits
    urls = s3.upload(before, "site/visit1"), s3.upload(after, "site/visit2")
    local = tmp_path / "local"
    assert cli_result(["compare", before, after, "--out", local, "--px-size", "0.5"]) == (0, "")
    assert cli_result(["compare", *urls, "--out", s3.url("site/changes/"), "--px-size", "0.5"]) == (0, "")
    assert _keys(s3, "site/changes/") == [f"site/changes/{name}" for name in ("changes.csv", "pairs.csv", "summary.json")]
    remote = _download(s3, "site/changes", tmp_path / "remote")

    def named(path: str) -> str:  # a local path as the remote run names it
        for folder, url in zip((before, after), urls):
            if path.startswith(f"{folder}/"):
                return url + path[len(str(folder)) + 1:]
        return path

    for table in ("changes.csv", "pairs.csv"):
        expected = [{k: named(v) for k, v in row.items()} for row in _rows(local / table)]
        assert _rows(remote / table) == expected and any(v.startswith("s3://") for row in expected for v in row.values())
    summaries = [json.loads((folder / "summary.json").read_text()) for folder in (local, remote)]
    assert (summaries[1].pop("before"), summaries[1].pop("after")) == tuple(url.rstrip("/") for url in urls)
    assert {k: v for k, v in summaries[0].items() if k not in ("before", "after")} == summaries[1]
    assert not any(staging.iterdir())
    assert not [key for key in _keys(s3, "site/") if key.endswith(".lock")]


def test_earlier_outputs_in_the_store_are_refused_unless_overwrite(s3, two_visits, staging):
    before, after = two_visits
    out = s3.url("changes/")
    stale = s3.put("changes/vectors/old.geojson", b"{}")  # an earlier compare's layer, which this one does not write
    s3.put("changes/pairs.csv", b"pair,name_before,name_after,status\n0,old,old,registered\n")
    s3.put("changes/summary.json", b"{}")
    s3.put("changes/notes.txt", b"mine")
    code, err = cli_result(["compare", before, after, "--out", out])
    assert code == 2 and err.count("\n") == 1 and "crackseg: error: s3://" in err and "--overwrite" in err
    assert "/tmp" not in err and str(staging) not in err
    assert s3.client.get_object(Bucket=s3.name, Key="changes/summary.json")["Body"].read() == b"{}"
    assert cli_result(["compare", before, after, "--out", out, "--overwrite"]) == (0, "")
    assert _keys(s3, "changes/") == [f"changes/{name}" for name in ("changes.csv", "notes.txt", "pairs.csv", "summary.json")]
    assert json.loads(s3.client.get_object(Bucket=s3.name, Key="changes/summary.json")["Body"].read())["pairs"] == 1
    assert stale not in _keys(s3, "changes/")
    assert not any(staging.iterdir())


def test_a_missing_prefix_and_a_register_in_the_store_are_one_line_before_any_work(s3, two_visits, tmp_path, staging):
    before, after = two_visits
    for argv in (["compare", s3.url("nothing/here/"), after, "--out", tmp_path / "out"],
                 ["compare", s3.url("nothing/"), after, "--out", s3.url("out/")],
                 ["compare", "s3://no-such-bucket-crackseg/visit/", after, "--out", tmp_path / "out"],
                 ["compare", before, after, "--out", tmp_path / "out", "--register", s3.url("site.gpkg")],
                 ["compare", before, after, "--out", tmp_path / "out", "--pairs", s3.url("pairs.csv")],
                 ["compare", before, after, "--out", "https://example.com/out/"]):
        code, err = cli_result(argv)
        assert code == 2 and err.count("\n") == 1 and err.startswith("crackseg: error: "), (argv, err)
        assert "Traceback" not in err and str(staging) not in err
    assert "s3://no-such-bucket-crackseg/visit" in cli_result(["compare", "s3://no-such-bucket-crackseg/visit/", after,
                                                                "--out", tmp_path / "out"])[1]
    assert not (tmp_path / "out").exists() and _keys(s3, "") == [] and not any(staging.iterdir())


def test_out_below_an_inspection_prefix_is_refused(s3, two_visits, staging):
    url = s3.upload(two_visits[0], "visit1")
    code, err = cli_result(["compare", url, two_visits[1], "--out", url + "changes/"])
    assert code == 2 and "lies in the BEFORE inspection" in err and not any(staging.iterdir())


def test_layers_report_and_register_with_inspections_in_the_store(s3, two_visits, tmp_path, staging):
    urls = s3.upload(two_visits[0], "site/visit1"), s3.upload(two_visits[1], "site/visit2")
    register = tmp_path / "site.gpkg"
    assert cli_result(["compare", *urls, "--out", s3.url("site/changes"), "--vectors", "geojson", "--report",
                       "--register", register, "--before-date", "2025-06-01", "--after-date", "2026-06-01"]) == (0, "")
    keys = _keys(s3, "site/changes/")
    assert {"site/changes/report.html", "site/changes/vectors/wall.geojson", "site/changes/vectors/wall.qml"} <= set(keys)
    assert any(key.startswith("site/changes/report/pair0-") for key in keys)
    with closing(sqlite3.connect(register)) as db:
        assert [source for (source,) in db.execute("SELECT source FROM surveys ORDER BY survey")] == [url.rstrip("/") for url in urls]
    report = s3.client.get_object(Bucket=s3.name, Key="site/changes/report.html")["Body"].read().decode()
    assert str(staging) not in report and not any(staging.iterdir())
    layer = json.loads(s3.client.get_object(Bucket=s3.name, Key="site/changes/vectors/wall.geojson")["Body"].read())
    paths = {feature["properties"][side] for feature in layer["features"] for side in ("path_before", "path_after")}
    assert paths and all(path.startswith(urls) for path in paths), paths  # the store's objects, never the staged copy


def test_folder_markers_and_an_object_named_as_a_folder_are_left_out(s3, two_visits, tmp_path, staging, capsys):
    """Keys ending in / (what consoles create for folders) and an object ``masks`` beside ``masks/*.png``."""
    urls = s3.upload(two_visits[0], "site/visit1"), s3.upload(two_visits[1], "site/visit2")
    for visit in ("visit1", "visit2"):
        s3.put(f"site/{visit}/", b"")
        s3.put(f"site/{visit}/masks/", b"")
    s3.put("site/visit1/masks", b"a stray object")
    code, err = cli_result(["compare", *urls, "--out", tmp_path / "out"])
    assert code == 0, err
    assert f"{urls[0]}masks: an object with the name of a folder of other objects; left out" in err
    assert _rows(tmp_path / "out" / "pairs.csv")[0]["status"] == "registered" and not any(staging.iterdir())


def test_predictions_folders_in_the_store_whose_photos_are_in_the_store(s3, two_visits, tmp_path, staging):
    """As predict --out s3:// writes them from photos in the store: predictions.csv names the photo and the mask by URL."""
    urls = []
    for number, visit in enumerate(two_visits, start=1):
        photo = s3.put(f"photos/visit{number}/wall.png", (visit / "images" / "wall.png").read_bytes())
        folder = tmp_path / f"pred{number}"
        (folder / "masks").mkdir(parents=True)
        (folder / "masks" / "wall.png").write_bytes((visit / "masks" / "wall.png").read_bytes())
        (folder / "predictions.csv").write_text(f"path,mask,status\n{photo},{s3.url(f'pred{number}/masks/wall.png')},ok\n")
        (folder / "summary.json").write_text("{}")
        urls.append(s3.upload(folder, f"pred{number}"))
    out = tmp_path / "out"
    assert cli_result(["compare", *urls, "--out", out, "--report"]) == (0, "")
    pair = _rows(out / "pairs.csv")[0]
    assert pair["status"] == "registered"
    assert (pair["path_before"], pair["path_after"]) == (s3.url("photos/visit1/wall.png"), s3.url("photos/visit2/wall.png"))
    assert {row["path_after"] for row in _rows(out / "changes.csv")} == {s3.url("photos/visit2/wall.png")}
    assert str(staging) not in (out / "report.html").read_text() and not any(staging.iterdir())


def test_a_held_lock_refuses_a_second_compare_and_is_left_to_its_holder(s3, two_visits, staging):
    before, after = two_visits
    s3.put("held/.crackseg-compare.lock", b'{"host": "elsewhere", "pid": 1}')
    code, err = cli_result(["compare", before, after, "--out", s3.url("held/")])
    assert code == 2 and err.splitlines() == [
        f"crackseg: error: {s3.url('held/.crackseg-compare.lock')}: another compare is writing to {s3.url('held')}/; if none is "
        f"(a run that was killed), remove the lock with: aws s3 rm {s3.url('held/.crackseg-compare.lock')}"]
    assert _keys(s3, "held/") == ["held/.crackseg-compare.lock"] and not any(staging.iterdir())


def test_a_full_staging_folder_is_one_line_naming_it(s3, two_visits, staging, monkeypatch):
    """Inspections downloaded from the store into a full TMPDIR: one line naming the folder, the object and what to
    do; nothing left there. The same for the outputs staged for the store."""
    import errno

    import crackseg.core.staging as staged
    import crackseg.monitoring.comparison_folder as outputs

    before, after = two_visits
    urls = s3.upload(before, "site/visit1"), s3.upload(after, "site/visit2")
    real = staged.write_atomic

    def full(path, *args, **kwargs):
        if Path(path).suffix in (".png", ".json"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(staged, "write_atomic", full)
    code, err = cli_result(["compare", *urls, "--out", s3.url("site/changes/"), "--px-size", "0.5"])
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"crackseg: error: no space left in {staging}/") and "set TMPDIR to a folder with room" in err
    assert f": {urls[0]}" in err and err.endswith(" could not be downloaded\n") and not any(staging.iterdir())
    monkeypatch.setattr(staged, "write_atomic", real)
    monkeypatch.setattr(outputs, "write_atomic", full)
    code, err = cli_result(["compare", before, after, "--out", s3.url("site/changes/"), "--px-size", "0.5"])
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"crackseg: error: no space left in {staging}/") and f"the staging folder of {s3.url('site/changes/')}" in err
    assert not any(staging.iterdir()) and not _keys(s3, "site/changes/")
