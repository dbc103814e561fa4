"""evaluate --data s3://: a dataset in moto's S3 server on loopback scores exactly as the same dataset on disk."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import S3_KEY_ID, S3_SECRET, cli_result

from crackseg.data.datasets import open_dataset
from crackseg.data.pairing import find_samples
from crackseg.model.checkpoint import save_model


@pytest.fixture
def dataset(synth_root, tmp_path) -> Path:
    """Five 64 px photos with masks (one crack-free, listed in negatives.txt) and a test split of three."""
    root = tmp_path / "data"
    for kind, suffix in (("images", ".jpg"), ("masks", ".png")):
        (root / kind).mkdir(parents=True)
        for source in sorted((synth_root / kind).glob(f"*{suffix}"))[:5]:
            shutil.copyfile(source, root / kind / source.name)
    stems = sorted(path.stem for path in (root / "images").iterdir())
    (root / "test.txt").write_text("\n".join(stems[:3]) + "\n")
    (root / "negatives.txt").write_text(stems[4] + "\n")
    (root / "masks" / f"{stems[4]}.png").unlink()
    return root


def _evaluate(checkpoint: Path, data: str, out: Path) -> tuple[int, str]:
    return cli_result(["evaluate", "--checkpoint", checkpoint, "--data", data, "--split", "test", "--tolerance", "2",
                       "--device", "cpu", "--out", out])


def test_a_dataset_in_s3_scores_exactly_as_on_disk(model, dataset, s3, tmp_path):
    save_model(model, tmp_path / "m.pt")
    url = s3.upload(dataset, "surveys/data")
    assert _evaluate(tmp_path / "m.pt", str(dataset), tmp_path / "local") == (0, "")
    assert _evaluate(tmp_path / "m.pt", url, tmp_path / "remote") == (0, "")
    local = json.loads((tmp_path / "local" / "report.json").read_text())
    remote = json.loads((tmp_path / "remote" / "report.json").read_text())
    assert remote.pop("source")["data"] == url and local.pop("source")["data"] == str(dataset)
    assert remote == local and remote["images"] == 3  # test.txt's stems, read from the store
    for name in ("per_image.csv", "pr_curve.csv", "report.md"):
        assert (tmp_path / "remote" / name).read_bytes() == (tmp_path / "local" / name).read_bytes()
    for path in (tmp_path / "remote").iterdir():
        assert S3_KEY_ID.encode() not in path.read_bytes() and S3_SECRET.encode() not in path.read_bytes()


def test_a_missing_bucket_or_prefix_is_one_line_naming_the_url(model, dataset, s3, tmp_path):
    save_model(model, tmp_path / "m.pt")
    s3.upload(dataset, "surveys/data")
    for url in ("s3://crackseg-no-such-bucket/data/", s3.url("surveys/missing/")):
        code, err = _evaluate(tmp_path / "m.pt", url, tmp_path / "out")
        assert code == 2 and err.count("\n") == 1 and url.rstrip("/") in err, err
        assert S3_KEY_ID not in err and S3_SECRET not in err
        if "no-such-bucket" in url:  # as predict words it
            assert "no such bucket 'crackseg-no-such-bucket'" in err, err
    assert not (tmp_path / "out" / "report.json").exists()


def test_images_under_sub_prefixes_are_a_problem_as_in_a_local_subfolder(dataset, s3):
    photo, mask = sorted((dataset / "images").iterdir())[0], sorted((dataset / "masks").iterdir())[0]
    for kind, source in (("images", photo), ("masks", mask)):
        for folder in ("siteB", "siteB/2024", ".thumbnails"):
            (dataset / kind / folder).mkdir(parents=True)
            shutil.copyfile(source, dataset / kind / folder / source.name)
    url = s3.upload(dataset, "surveys/data")
    remote, local = open_dataset(url), open_dataset(dataset)
    assert [s.stem for s in remote.samples] == [s.stem for s in local.samples]
    assert [str(p) for p in remote.problems] == [
        f"{url}{kind}/siteB: 2 images in a subfolder, which crackseg does not read (it pairs the files right in {url}{kind}); "
        "move them up, or make each site a dataset of its own (train takes --data once per dataset)" for kind in ("images", "masks")]
    assert [str(p) for p in local.problems] == [str(p).replace(url, f"{dataset}/") for p in remote.problems]
    _, problems = find_samples(f"{url}images", f"{url}images/siteB")  # the masks' own prefix is read, not reported
    assert [str(p.path) for p in problems if "subfolder" in p.message] == [f"{url}images/siteB/2024"]


def test_a_report_goes_to_the_store_whole_and_is_not_replaced_unless_asked(model, dataset, s3, tmp_path, staging):
    save_model(model, tmp_path / "m.pt")
    out = s3.url("reports/cfd/")
    assert _evaluate(tmp_path / "m.pt", str(dataset), tmp_path / "local") == (0, "")
    assert _evaluate(tmp_path / "m.pt", str(dataset), out) == (0, "")
    keys = sorted(item["Key"] for item in s3.client.list_objects_v2(Bucket=s3.name, Prefix="reports/cfd/")["Contents"])
    assert keys == [f"reports/cfd/{name}" for name in sorted(("per_image.csv", "pr_curve.csv", "pr_curve.png", "report.json", "report.md"))]
    for key in keys:
        assert s3.client.get_object(Bucket=s3.name, Key=key)["Body"].read() == (tmp_path / "local" / key.rsplit("/", 1)[1]).read_bytes()
    code, err = _evaluate(tmp_path / "m.pt", str(dataset), out)
    assert (code, err) == (2, f"crackseg: error: {out}report.json already exists; choose another --out or pass --overwrite\n")
    code, err = cli_result(["evaluate", "--checkpoint", tmp_path / "m.pt", "--data", dataset, "--split", "test", "--device", "cpu",
                            "--protocol", "omnicrack", "--out", out, "--overwrite"])  # a protocol without a curve: the old one goes
    assert code == 0, err
    keys = sorted(item["Key"] for item in s3.client.list_objects_v2(Bucket=s3.name, Prefix="reports/cfd/")["Contents"])
    assert keys == [f"reports/cfd/{name}" for name in ("per_image.csv", "report.json", "report.md")] and not any(staging.iterdir())
    assert not (Path.cwd() / "s3:").exists()


def test_an_http_out_is_one_line(model, dataset, tmp_path):
    save_model(model, tmp_path / "m.pt")
    code, err = _evaluate(tmp_path / "m.pt", str(dataset), "https://example.org/reports/")
    assert (code, err) == (2, "crackseg: error: --out https://example.org/reports/: reports are written to a local folder or an "
                              "s3://bucket/prefix/ URL (http(s):// is read-only)\n")


@pytest.mark.parametrize("where", ["store", "local"])
def test_any_file_of_a_report_is_kept_unless_overwrite(model, dataset, s3, tmp_path, staging, where):
    """As predict's outputs: a folder or prefix holding part of a report (one that failed half-way, or another tool's
    per_image.csv) is not written over unless asked."""
    save_model(model, tmp_path / "m.pt")
    if where == "store":
        s3.put("reports/cfd/per_image.csv", b"image,f1\nmine,1\n")
        out = s3.url("reports/cfd/")
    else:
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "per_image.csv").write_text("image,f1\nmine,1\n")
        out = f"{tmp_path / 'out'}/"
    assert _evaluate(tmp_path / "m.pt", str(dataset), out) == (
        2, f"crackseg: error: {out}per_image.csv already exists; choose another --out or pass --overwrite\n")
    kept = s3.client.get_object(Bucket=s3.name, Key="reports/cfd/per_image.csv")["Body"].read() if where == "store" \
        else (tmp_path / "out" / "per_image.csv").read_bytes()
    assert kept == b"image,f1\nmine,1\n" and not any(staging.iterdir())
    code, err = cli_result(["evaluate", "--checkpoint", tmp_path / "m.pt", "--data", dataset, "--split", "test", "--device", "cpu",
                            "--out", out, "--overwrite"])
    assert (code, err) == (0, "")


def test_a_missing_bucket_for_out_reads_as_predicts(model, dataset, tmp_path, s3, staging):
    save_model(model, tmp_path / "m.pt")
    code, err = _evaluate(tmp_path / "m.pt", str(dataset), "s3://crackseg-no-such-bucket/reports/")
    assert (code, err) == (2, "crackseg: error: s3://crackseg-no-such-bucket/reports/: no such bucket 'crackseg-no-such-bucket'\n")
    assert not any(staging.iterdir())


def test_a_full_staging_folder_is_one_line_naming_it(model, dataset, s3, tmp_path, staging, monkeypatch):
    """A report staged for the store: a full TMPDIR names the folder and what to do, not a file's OSError; nothing
    is left there."""
    import errno

    import crackseg.evaluation.report as report

    save_model(model, tmp_path / "m.pt")
    real = report.write_atomic

    def full(path, *args, **kwargs):
        if Path(path).name == "report.md":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(report, "write_atomic", full)
    out = s3.url("reports/cfd/")
    code, err = _evaluate(tmp_path / "m.pt", str(dataset), out)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"crackseg: error: no space left in {staging}/") and f"the staging folder of {out}" in err
    assert "set TMPDIR to a folder with room" in err and not any(staging.iterdir())
