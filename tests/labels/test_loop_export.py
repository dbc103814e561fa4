"""crackseg labels export and rank (crackseg.labels.loop), and the tools' readers, against files it did not write or
that lie: names a URL must carry, thresholds and table paths a summary.json or predictions.csv could hold, oversized
brushes and masks, malformed coordinates, and folders holding things that are not files.

Every file here is built by the test; each case is one a hand-edited or crafted file can hold.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import io
import json
import os
import signal
import tracemalloc
from urllib.parse import quote

import numpy as np
import pytest
import torch
from conftest import cli_result
from PIL import Image

from crackseg.core.errors import InputError
from crackseg.data.images import load_mask
from crackseg.labels.loop import export_labels, import_labels
from crackseg.prediction.outputs import OutputSpec, PredictionsFolder, Records, write_image_outputs

pytest.importorskip("pycocotools")

W, H = 10, 8  # px: the photos of the small cases


def _photo(folder, name="a.png", size=(W, H)):
    folder.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (128, 128, 128)).save(folder / name)
    return folder / name


def _cli(*args) -> tuple[int, str]:
    return cli_result(["labels", *args])


def _one_line_error(code: int, err: str, *parts: str) -> None:
    assert code == 2 and err.count("\n") == 1 and err.startswith("crackseg: error: "), err
    for part in parts:
        assert part in err, err


def _predictions(tmp_path, stems, size=(16, 12)) -> tuple[object, dict[str, np.ndarray]]:
    """A predictions folder (8-bit probabilities) of photos photos/site/<stem>.jpg, photo k cracked along column k + 1."""
    folder, records, spec = PredictionsFolder(tmp_path / "pred"), Records(), OutputSpec(save_prob=8, measure=False)
    masks = {}
    for key, stem in enumerate(stems):
        mask = np.zeros(size[::-1], bool)
        mask[:, key + 1] = True
        masks[stem] = mask
        photo = _photo(tmp_path / "photos" / "site", f"{stem}.jpg", size)
        prob = torch.from_numpy(np.where(mask, 0.9, 0.1).astype(np.float32))
        image = torch.zeros(3, size[1], size[0], dtype=torch.uint8)
        records.add(key, *write_image_outputs(folder, photo, f"site/{stem}", image, prob, 0.5, spec))
    folder.write_tables(records, spec, [], False, 0.5)
    return tmp_path / "pred", masks


def _imported_masks(out) -> dict[str, np.ndarray]:
    return {path.stem: load_mask(path)[0].numpy().astype(bool) for path in sorted((out / "masks").glob("*.png"))}


# 1. Label Studio local-files URLs carry any file name


NAMES = ("a&b", "100%", "x#1", "q?", "é", "plain", "a")  # "a": where a&b's cracks went when & split the URL


def _round_trip(tmp_path, names, prefix: str) -> list[dict]:
    """Export pre-annotations of photos named ``names`` after ``prefix``, submit each unchanged as a person would, import
    them, and check that every photo comes back under its own name with its own mask; returns the exported tasks."""
    predictions, expected = _predictions(tmp_path, names)
    tasks_json = tmp_path / "tasks.json"
    export_labels(predictions, "labelstudio", tasks_json, rle=True, image_prefix=prefix)
    exported = json.loads(tasks_json.read_text())
    tasks = [{**task, "annotations": [{"result": task["predictions"][0]["result"]}]} for task in exported]
    tasks_json.write_text(json.dumps(tasks))
    provenance = import_labels(tasks_json, "labelstudio", tmp_path / "photos", tmp_path / "dataset")
    masks = _imported_masks(tmp_path / "dataset")
    assert provenance["images"] == len(names) and sorted(masks) == sorted(names)
    for stem in names:
        assert np.array_equal(masks[stem], expected[stem]), stem
    return exported


def test_labelstudio_local_files_urls_are_encoded_as_label_studio_builds_them_and_decoded_on_import(tmp_path):
    tasks = _round_trip(tmp_path, NAMES, "/data/local-files/?d=")
    # as Label Studio's local files storage writes a task: /data/local-files/?d={quote(relative path)}
    assert sorted(task["data"]["image"] for task in tasks) == sorted(f"/data/local-files/?d={quote(f'site/{stem}.jpg')}"
                                                                     for stem in NAMES)


@pytest.mark.parametrize("prefix", ["", "photos/", "/data/local-files/?d=", "/data/local-files/?d=Bay 3&4 +#%/", "http://files.example/survey/",
                                    "s3://bucket/survey 3/", "gs://bucket/survey/", "azure-blob://container/survey/"])
def test_every_name_comes_back_as_itself_whatever_the_prefix(tmp_path, prefix):
    """Export then import of names with literal escapes (p%41 is not pA), URL delimiters, spaces and non-ASCII."""
    _round_trip(tmp_path, ("p%41", "100%", "a%20b", "a&b", "x#1", "q?d=1", "é", "a b", "plus+1"), prefix)


def test_a_cloud_storage_prefix_gives_each_key_as_it_is_as_label_studio_reads_it(tmp_path):
    """Label Studio's S3, GCS and Azure storages take the key of s3://bucket/KEY as written (resolve_s3_url: the URL's
    path, never unquoted): an encoded name would name another object."""
    tasks = _round_trip(tmp_path, ("my photo é", "a%20b"), "s3://bucket/survey/")
    assert sorted(task["data"]["image"] for task in tasks) == ["s3://bucket/survey/site/a%20b.jpg", "s3://bucket/survey/site/my photo é.jpg"]


def test_a_local_files_url_is_decoded_once(tmp_path):
    """%2541 is the name %41 encoded; decoding twice would give A."""
    _photo(tmp_path / "photos", "%41.png")
    _photo(tmp_path / "photos", "A.png")
    result = {"type": "polygonlabels", "original_width": W, "original_height": H,
              "value": {"points": [[10, 0], [20, 0], [20, 100], [10, 100]], "polygonlabels": ["crack"]}}
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps([{"id": 1, "data": {"image": "/data/local-files/?d=%2541.png"}, "annotations": [{"result": [result]}]}]))
    provenance = import_labels(path, "labelstudio", tmp_path / "photos", tmp_path / "dataset")
    assert provenance["stems"] == ["%41"]


# 2. rank's threshold from summary.json


@pytest.mark.parametrize("threshold, shown", [
    (float("nan"), "nan"), (7.0, "7.0"), ("abc", "'abc'"), (0.0, "0.0"), (1, "1"), (True, "True"), (float("inf"), "inf"), (None, "None"),
])
def test_rank_refuses_a_summary_threshold_that_is_not_a_number_in_0_1(tmp_path, threshold, shown):
    predictions, _ = _predictions(tmp_path, ("a", "b"))
    summary = json.loads((predictions / "summary.json").read_text())
    (predictions / "summary.json").write_text(json.dumps(summary | {"threshold": threshold}))
    code, err = _cli("rank", predictions)
    _one_line_error(code, err, str(predictions / "summary.json"), f"threshold {shown}", "--threshold")
    assert not (predictions / "rank.csv").exists()
    assert _cli("rank", predictions, "--threshold", "0.5")[0] == 0  # the flag still wins


@pytest.mark.parametrize("threshold", ["0", "1"])
def test_rank_refuses_a_threshold_flag_at_which_every_pixel_is_sure(tmp_path, threshold):
    predictions, _ = _predictions(tmp_path, ("a",))
    code, err = _cli("rank", predictions, "--threshold", threshold)
    _one_line_error(code, err, "--threshold", "(0, 1)")
    assert not (predictions / "rank.csv").exists()


def test_a_labelme_export_that_meets_an_unreadable_mask_writes_nothing(tmp_path):
    predictions, _ = _predictions(tmp_path, ("a", "b", "c"))
    (predictions / "masks" / "site" / "b.png").write_bytes(b"cut short")
    code, err = _cli("export", predictions, "--format", "labelme", "--out", tmp_path / "new")
    _one_line_error(code, err, "b.png")
    assert not (tmp_path / "new").exists()
    earlier = tmp_path / "photos" / "site" / "a.json"
    earlier.write_text("the last round's corrected file")
    before = sorted((tmp_path / "photos").rglob("*"))
    code, err = _cli("export", predictions, "--format", "labelme", "--out", tmp_path / "photos", "--overwrite")
    _one_line_error(code, err, "b.png")
    assert earlier.read_text() == "the last round's corrected file" and sorted((tmp_path / "photos").rglob("*")) == before


# 3. paths read from predictions.csv stay inside the predictions folder


def _craft_mask_column(predictions, value: str) -> None:
    with open(predictions / "predictions.csv", newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    rows[0]["mask"] = value
    with open(predictions / "predictions.csv", "w", newline="", encoding="utf-8") as file:
        writer = csv.DictWriter(file, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


@pytest.mark.parametrize("crafted", ["masks/../../escape/x.png", "{pred}/masks/../../escape/x.png", "{pred}/masks/site/../../../escape/x",
                                     "symlink"])
def test_a_mask_path_outside_the_predictions_folder_is_refused_by_export_and_rank(tmp_path, crafted):
    predictions, _ = _predictions(tmp_path, ("a", "b"))
    escape = tmp_path / "escape"
    escape.mkdir()
    Image.new("L", (16, 12), 255).save(escape / "x.png")  # a mask there, so that nothing else stops the export
    if crafted == "symlink":  # a mask that resolves outside, through a link
        (predictions / "masks" / "site" / "a.png").unlink()
        (predictions / "masks" / "site" / "a.png").symlink_to(escape / "x.png")
        crafted = str(predictions / "masks" / "site" / "a.png")
    value = crafted.format(pred=predictions)
    _craft_mask_column(predictions, value)
    out = tmp_path / "photos" / "labelme"  # out/../../escape is tmp_path/escape
    code, err = _cli("export", predictions, "--format", "labelme", "--out", out)
    _one_line_error(code, err, str(predictions / "predictions.csv"), "row 1", value)
    assert [path.name for path in escape.iterdir()] == ["x.png"] and not out.exists()
    code, err = _cli("rank", predictions)
    _one_line_error(code, err, str(predictions / "predictions.csv"), "row 1", value)
    for command in (["report", str(predictions)], ["compare", str(predictions), str(predictions), "--out", str(tmp_path / "changes")]):
        code, err = cli_result(command)  # the other readers of the table
        _one_line_error(code, err, str(predictions / "predictions.csv"), "row 1", value)


def test_mask_paths_are_found_inside_the_folder_however_predict_was_run(tmp_path, monkeypatch):
    """predictions.csv holds paths as predict was given them: relative to its working folder, or absolute."""
    predictions, _ = _predictions(tmp_path, ("a",))
    folder = PredictionsFolder(predictions)
    for value in (f"{predictions}/masks/site/a.png", "pred/masks/site/a.png", "../elsewhere/pred/masks/site/a.png"):
        assert folder.table_path(value, "mask", 1) == predictions / "masks" / "site" / "a.png"
    for value in ("", "site/a.png", "masks/../x.png", "masks/site/../../../x.png"):
        with pytest.raises(InputError, match=r"predictions.csv: row 3: mask .* inside"):
            folder.table_path(value, "mask", 3)


def test_labelme_export_writes_only_inside_out(tmp_path, monkeypatch):
    """The last guard, should a name with .. ever come through: each labelme file's path is checked against --out."""
    predictions, _ = _predictions(tmp_path, ("a", "b"))
    out = tmp_path / "photos" / "labelme"
    export_labels(predictions, "labelme", out)
    assert sorted(path.relative_to(out).as_posix() for path in out.rglob("*.json")) == ["site/a.json", "site/b.json"]
    monkeypatch.setattr(PredictionsFolder, "name_of", lambda self, mask: f"../../{mask.stem}")
    with pytest.raises(InputError, match=r"outside --out"):
        export_labels(predictions, "labelme", out, overwrite=True)
    assert not list(tmp_path.glob("*.json"))


@pytest.mark.parametrize("fmt", ["labelme", "coco", "cvat", "labelstudio"])
def test_an_out_of_the_wrong_kind_is_one_line_even_with_overwrite(tmp_path, fmt):
    """labelme writes a folder of files, the other formats one file: the other kind at --out is named, not replaced."""
    predictions, _ = _predictions(tmp_path, ("a",))
    out = tmp_path / ("file.json" if fmt == "labelme" else "folder")
    out.write_text("kept\n") if fmt == "labelme" else (out / "kept").mkdir(parents=True)
    code, err = _cli("export", predictions, "--format", fmt, "--out", out, "--overwrite")
    _one_line_error(code, err, str(out), "a file; labelme" if fmt == "labelme" else f"a folder; {fmt} writes one file")
    if fmt != "labelme":
        assert err.rstrip().endswith(f"{out / fmt}.{'xml' if fmt == 'cvat' else 'json'}"), err
    assert (out.read_text() == "kept\n") if fmt == "labelme" else [p.name for p in out.iterdir()] == ["kept"]


def test_an_out_below_a_file_is_one_line_naming_the_file(tmp_path):
    predictions, _ = _predictions(tmp_path, ("a",))
    (tmp_path / "photo.jpg").write_bytes(b"kept")
    code, err = _cli("export", predictions, "--format", "cvat", "--out", tmp_path / "photo.jpg" / "sub" / "tasks.xml")
    _one_line_error(code, err, str(tmp_path / "photo.jpg"), "is a file, not a folder")
    assert (tmp_path / "photo.jpg").read_bytes() == b"kept"


# 4. oversized brushes and masks: refused before their pixels are allocated


def _repeat_brush(count: int) -> list[int]:
    """A Label Studio brush of ``count`` zero values in repeat runs of 2**16 (16-bit lengths, 8-bit words)."""
    bits = [f"{count:032b}", f"{7:05b}", *(f"{size - 1:04b}" for size in (3, 4, 8, 16))]
    left = count
    while left:
        run = min(left, 1 << 16)
        bits.append(f"1{3:02b}{run - 1:016b}{0:08b}")
        left -= run
    text = "".join(bits)
    text += "0" * (-len(text) % 8)
    return [int(text[i : i + 8], 2) for i in range(0, len(text), 8)]


def _ls_brush_file(tmp_path, size, rle) -> object:
    brush = {"id": "r1", "type": "brushlabels", "original_width": size[0], "original_height": size[1],
             "value": {"format": "rle", "rle": rle, "brushlabels": ["crack"]}}
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps([{"id": 1, "data": {"image": "a.png"}, "annotations": [{"result": [brush]}]}]))
    return path


def test_an_oversized_brush_is_refused_by_its_stated_size_before_it_is_decoded(tmp_path):
    _photo(tmp_path / "photos")
    path = _ls_brush_file(tmp_path, (4000, 4000), _repeat_brush(4000 * 4000 * 4))  # 16 MB of pixels, a 3 KB file
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match="a.png is 4000x4000 px there but"):
            import_labels(path, "labelstudio", tmp_path / "photos", tmp_path / "dataset")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4e6, peak
    assert not (tmp_path / "dataset").exists()


@pytest.mark.parametrize("case, message", [
    ("count", "a brush of 300 values on a 10x8 image (320 expected)"),
    ("short", "the brush RLE ends early"),
])
def test_a_brush_that_does_not_fit_its_stated_size_is_one_line_before_anything_is_written(tmp_path, case, message):
    _photo(tmp_path / "photos")
    rle = _repeat_brush(300) if case == "count" else _repeat_brush(W * H * 4)[:-3]
    code, err = _cli("import", _ls_brush_file(tmp_path, (W, H), rle), "--format", "labelstudio", "--images", tmp_path / "photos",
                     "--out", tmp_path / "dataset")
    _one_line_error(code, err, "tasks.json", message)
    assert not (tmp_path / "dataset").exists()


def _labelme_file(tmp_path, shapes, image_path="../photos/a.png", size=(W, H), name="a.json", image_data=None) -> object:
    folder = tmp_path / "labelme"
    folder.mkdir(exist_ok=True)
    document = {"version": "5.5.0", "flags": {}, "shapes": shapes, "imagePath": image_path, "imageData": image_data,
                "imageWidth": size[0], "imageHeight": size[1]}
    (folder / name).write_text(json.dumps(document))
    return folder


def _png(size, mode="1") -> str:
    buffer = io.BytesIO()
    Image.new(mode, size, 0).save(buffer, "PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def _mask_shape(size, box=None) -> dict:
    box = box or size
    return {"label": "crack", "shape_type": "mask", "points": [[0, 0], [box[0] - 1, box[1] - 1]], "mask": _png(size)}


@pytest.mark.parametrize("case, message", [
    ("box", "a mask of 6000x6000 px in a box of 2x2 px"),
    ("image", "a mask of 6000x6000 px on a 10x8 px image"),
])
def test_a_labelme_mask_is_measured_before_it_is_decoded(tmp_path, case, message):
    _photo(tmp_path / "photos")
    folder = _labelme_file(tmp_path, [_mask_shape((6000, 6000), (2, 2) if case == "box" else None)])  # 36 MB decoded
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match=message):
            import_labels(folder, "labelme", tmp_path / "photos", tmp_path / "dataset")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8e6, peak


def test_a_labelme_mask_over_pillows_pixel_limit_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 20)  # a decompression bomb to Pillow: over twice the limit
    _photo(tmp_path / "photos")
    folder = _labelme_file(tmp_path, [_mask_shape((8, 6))])
    code, err = _cli("import", folder, "--format", "labelme", "--images", tmp_path / "photos", "--out", tmp_path / "dataset")
    _one_line_error(code, err, "a.json: shape 0 (label 'crack')", "decompression bomb")


# 5. malformed names and coordinates, and things in a folder that are not files


def test_a_nul_in_a_labelme_image_path_is_one_line_naming_the_file(tmp_path):
    buffer = io.BytesIO()
    Image.new("RGB", (W, H)).save(buffer, "PNG")
    folder = _labelme_file(tmp_path, [], image_path="z\0.png", image_data=base64.b64encode(buffer.getvalue()).decode())
    (tmp_path / "photos").mkdir()
    code, err = _cli("import", folder, "--format", "labelme", "--images", tmp_path / "photos", "--out", tmp_path / "dataset")
    _one_line_error(code, err, str(folder / "a.json"), "imagePath")
    assert not (tmp_path / "dataset").exists()


BAD = (float("nan"), float("inf"), float("-inf"))


@pytest.mark.parametrize("bad", BAD, ids=str)
@pytest.mark.parametrize("kind", ["polygon", "linestrip", "mask"])
def test_labelme_coordinates_that_are_not_finite_are_malformed(tmp_path, kind, bad):
    _photo(tmp_path / "photos")
    good = {"label": "crack", "shape_type": "polygon", "points": [[3, 1], [3, 6], [4, 6]]}
    shape = _mask_shape((2, 2)) if kind == "mask" else {"label": "crack", "shape_type": kind, "points": [[1, 1], [2, 5], [4, 4]]}
    shape["points"][1][0] = bad
    folder = _labelme_file(tmp_path, [good, shape])
    code, err = _cli("import", folder, "--format", "labelme", "--images", tmp_path / "photos", "--out", tmp_path / "dataset",
                     "--line-width", 1)
    _one_line_error(code, err, str(folder / "a.json"), "shape 1 (label 'crack')", "finite")
    assert not (tmp_path / "dataset").exists()


@pytest.mark.parametrize("bad", BAD, ids=str)
def test_labelstudio_coordinates_that_are_not_finite_are_malformed(tmp_path, bad):
    _photo(tmp_path / "photos")
    polygon = {"id": "r7", "type": "polygonlabels", "original_width": W, "original_height": H,
               "value": {"points": [[10, 0], [20, bad], [20, 100]], "polygonlabels": ["crack"]}}
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps([{"id": 5, "data": {"image": "a.png"}, "annotations": [{"result": [polygon]}]}]))
    code, err = _cli("import", path, "--format", "labelstudio", "--images", tmp_path / "photos", "--out", tmp_path / "dataset")
    _one_line_error(code, err, str(path), "task 5", "r7", "finite")
    assert not (tmp_path / "dataset").exists()


@contextlib.contextmanager
def _deadline(seconds: int):
    def expire(*_):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_labelme_folder_reads_regular_files_only_and_counts_the_rest(tmp_path):
    _photo(tmp_path / "photos")
    folder = _labelme_file(tmp_path, [{"label": "crack", "shape_type": "polygon", "points": [[3, 1], [3, 6], [4, 6]]}])
    os.mkfifo(folder / "pipe.json")  # opening it for reading waits for a writer that never comes
    (folder / "folder.json").mkdir()
    with _deadline(20):
        provenance = import_labels(folder, "labelme", tmp_path / "photos", tmp_path / "dataset")
    assert provenance["images"] == 1 and provenance["json_files_skipped"] == 2
    with _deadline(20):
        code, err = _cli("import", folder / "pipe.json", "--format", "labelme", "--images", tmp_path / "photos",
                         "--out", tmp_path / "other")
    _one_line_error(code, err, str(folder / "pipe.json"), "not a regular file")
