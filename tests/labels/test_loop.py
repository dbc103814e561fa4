"""crackseg labels: each format's coordinates pinned by one-pixel examples, round trips, counts, one-line errors, rank.

Every annotation file here is written by the test from its format's documentation (COCO's data
format, CVAT's XML annotation format, labelme's shape_to_mask and imageData, Label Studio's JSON
export and label-studio-converter's brush RLE); none comes from a labelling tool's repository.
"""

from __future__ import annotations

import base64
import csv
import io
import json

import numpy as np
import pytest
import torch
from conftest import cli_result
from PIL import Image

from crackseg.core.errors import InputError
from crackseg.data.datasets import open_dataset
from crackseg.data.images import load_mask
from crackseg.labels.formats.label_studio import brush_decode, brush_encode
from crackseg.labels.loop import ImportOptions, export_labels, import_labels, import_summary, rank_predictions
from crackseg.prediction.outputs import OutputSpec, PredictionsFolder, Records, write_image_outputs

pytest.importorskip("pycocotools")

W, H = 10, 8  # px: the photos of the one-pixel examples


def _photo(folder, name="a.png", size=(W, H), exif_orientation=None):
    folder.mkdir(parents=True, exist_ok=True)
    picture = Image.new("RGB", size, (128, 128, 128))
    if exif_orientation is None:
        picture.save(folder / name)
    else:
        exif = Image.Exif()
        exif[0x0112] = exif_orientation
        picture.save(folder / name, exif=exif)
    return folder / name


def _imported(tmp_path, fmt, annotations, **options) -> tuple[dict[str, np.ndarray], dict]:
    """(mask by stem, labels.json) of importing ``annotations`` with the photos in tmp_path/photos."""
    out = tmp_path / "dataset"
    provenance = import_labels(annotations, fmt, tmp_path / "photos", out, ImportOptions(**options))
    masks = {path.stem: load_mask(path)[0].numpy().astype(bool) for path in sorted((out / "masks").glob("*.png"))}
    assert json.loads((out / "labels.json").read_text()) == provenance
    return masks, provenance


def _columns(mask: np.ndarray) -> list[int]:
    return sorted(set(np.nonzero(mask)[1].tolist()))


def _coco(tmp_path, segmentations, categories=("crack",), images=(("a.png", W, H),)) -> object:
    document = {
        "images": [{"id": n, "file_name": name, "width": w, "height": h} for n, (name, w, h) in enumerate(images, 1)],
        "categories": [{"id": n, "name": name} for n, name in enumerate(categories, 1)],
        "annotations": [{"id": n, "image_id": 1, "category_id": category, "segmentation": segmentation, "iscrowd": 0}
                        for n, (category, segmentation) in enumerate(segmentations, 1)],
    }
    path = tmp_path / "coco.json"
    path.write_text(json.dumps(document))
    return path


def _cvat(tmp_path, shapes: str, name="a.png", size=(W, H)) -> object:
    path = tmp_path / "annotations.xml"
    path.write_text(f"""<?xml version="1.0" encoding="utf-8"?>
<annotations><version>1.1</version>
<meta><task><labels><label><name>crack</name></label><label><name>joint</name></label></labels></task></meta>
<image id="0" name="{name}" width="{size[0]}" height="{size[1]}">{shapes}</image>
</annotations>""")
    return path


def _labelme(tmp_path, shapes, image="a.png", size=(W, H), image_data=None) -> object:
    folder = tmp_path / "labelme"
    folder.mkdir(exist_ok=True)
    document = {"version": "5.5.0", "flags": {}, "shapes": [{"group_id": None, "flags": {}, "description": "", **shape} for shape in shapes],
                "imagePath": f"../photos/{image}", "imageData": image_data, "imageWidth": size[0], "imageHeight": size[1]}
    (folder / f"{image.rsplit('.', 1)[0]}.json").write_text(json.dumps(document))
    return folder


def _labelstudio(tmp_path, results, image="/data/upload/3/1a2b3c4d-a.png") -> object:
    path = tmp_path / "labelstudio.json"
    task = {"id": 1, "data": {"image": image}, "annotations": [{"id": 1, "was_cancelled": False, "result": results}]}
    path.write_text(json.dumps([task]))
    return path


def _ls_polygon(points_px, label="crack", size=(W, H)):
    return {"type": "polygonlabels", "from_name": "label", "to_name": "image", "original_width": size[0], "original_height": size[1],
            "value": {"points": [[100.0 * x / size[0], 100.0 * y / size[1]] for x, y in points_px], "polygonlabels": [label]}}


# Coordinates: one pixel wide, as each tool draws it


def test_coco_polygons_run_along_pixel_edges(tmp_path):
    _photo(tmp_path / "photos")
    masks, _ = _imported(tmp_path, "coco", _coco(tmp_path, [(1, [[3, 1, 4, 1, 4, 7, 3, 7]])]))
    assert _columns(masks["a"]) == [3] and masks["a"].sum() == 6  # pixel column 3, rows 1-6: the square from x=3 to x=4


@pytest.mark.parametrize("fmt", ["coco", "cvat", "labelstudio", "labelme"])
def test_a_crack_traced_as_a_polygon_comes_back_as_wide_as_traced(tmp_path, fmt):
    """A crack 3 px wide (columns 4-6) traced along its two edges, in each format's own coordinates."""
    _photo(tmp_path / "photos")
    edges = [(4, 0), (7, 0), (7, H), (4, H)]  # pixel edges: x = 4 and x = 7
    if fmt == "coco":
        path = _coco(tmp_path, [(1, [[v for point in edges for v in point]])])
    elif fmt == "cvat":
        path = _cvat(tmp_path, f'<polygon label="crack" occluded="0" points="{";".join(f"{x},{y}" for x, y in edges)}"/>')
    elif fmt == "labelstudio":
        path = _labelstudio(tmp_path, [_ls_polygon(edges)])
    else:  # labelme's points are pixel centres, and shape_to_mask draws the outline: the edge pixels' centres
        path = _labelme(tmp_path, [{"label": "crack", "shape_type": "polygon", "points": [[4, 0], [6, 0], [6, H - 1], [4, H - 1]]}])
    masks, _ = _imported(tmp_path, fmt, path)
    assert _columns(masks["a"]) == [4, 5, 6] and masks["a"].sum() == 3 * H


def test_labelme_polygons_are_drawn_with_their_outline_on_pixel_centres(tmp_path):
    """labelme's shape_to_mask: PIL's polygon with outline=1, fill=1 through the points as given."""
    _photo(tmp_path / "photos")
    path = _labelme(tmp_path, [{"label": "crack", "shape_type": "polygon", "points": [[3, 1], [3, 6], [3, 6], [3, 1]]}])
    masks, _ = _imported(tmp_path, "labelme", path)
    assert _columns(masks["a"]) == [3] and masks["a"].sum() == 6  # all points on x = 3: column 3, rows 1-6


def test_labelstudio_points_are_percent_of_the_image(tmp_path):
    _photo(tmp_path / "photos")
    path = _labelstudio(tmp_path, [{"type": "polygonlabels", "original_width": W, "original_height": H,
                                    "value": {"points": [[30, 12.5], [40, 12.5], [40, 87.5], [30, 87.5]], "polygonlabels": ["Crack"]}}])
    masks, provenance = _imported(tmp_path, "labelstudio", path)  # the upload's 8-hex prefix is not part of the photo's name
    assert _columns(masks["a"]) == [3] and masks["a"].sum() == 6 and provenance["labels"] == {"Crack": 1}


def test_cvat_polygons_run_along_pixel_edges_as_its_mask_exports_draw_them(tmp_path):
    _photo(tmp_path / "photos")
    masks, _ = _imported(tmp_path, "cvat", _cvat(tmp_path, '<polygon label="crack" occluded="0" points="3.00,1.00;4.00,1.00;4.00,7.00;3.00,7.00"/>'))
    assert _columns(masks["a"]) == [3] and masks["a"].sum() == 6


def test_cvat_masks_are_runs_from_background_row_by_row_in_their_box(tmp_path):
    _photo(tmp_path / "photos")
    masks, _ = _imported(tmp_path, "cvat", _cvat(tmp_path, '<mask label="crack" rle="1, 2, 3" left="1" top="2" width="2" height="3"/>'))
    assert np.argwhere(masks["a"]).tolist() == [[2, 2], [3, 1]]  # box values 0 1 / 1 0 / 0 0 at x 1-2, y 2-4


def test_coco_rle_uncompressed_runs_down_columns_and_compressed_too(tmp_path):
    _photo(tmp_path / "photos", size=(4, 3))
    uncompressed = {"size": [3, 4], "counts": [1, 2, 3, 6]}  # column-major: column 0 rows 1-2, columns 2-3 whole
    masks, _ = _imported(tmp_path, "coco", _coco(tmp_path, [(1, uncompressed)], images=[("a.png", 4, 3)]))
    expected = np.array([[0, 0, 1, 1], [1, 0, 1, 1], [1, 0, 1, 1]], bool)
    assert np.array_equal(masks["a"], expected)
    from pycocotools import mask as coco_masks

    compressed = coco_masks.encode(np.asfortranarray(expected.astype(np.uint8)))
    compressed["counts"] = compressed["counts"].decode()
    masks, _ = _imported(tmp_path, "coco", _coco(tmp_path, [(1, compressed)], images=[("a.png", 4, 3)]), overwrite=True)
    assert np.array_equal(masks["a"], expected)


def test_labelme_masks_sit_at_their_first_point(tmp_path):
    _photo(tmp_path / "photos")
    patch = io.BytesIO()
    Image.fromarray(np.array([[1, 0], [1, 1]], np.uint8)).save(patch, "PNG")  # 0/1, as labelme saves masks
    shape = {"label": "crack", "shape_type": "mask", "points": [[2, 1], [3, 2]], "mask": base64.b64encode(patch.getvalue()).decode()}
    masks, _ = _imported(tmp_path, "labelme", _labelme(tmp_path, [shape]))
    assert np.argwhere(masks["a"]).tolist() == [[1, 2], [2, 2], [2, 3]]


def _brush(values: list[int]) -> list[int]:
    """Label Studio's brush RLE written from its format with literal runs only (3-bit lengths, 8-bit words)."""
    bits = f"{len(values):032b}" + f"{7:05b}" + "".join(f"{size - 1:04b}" for size in (3, 4, 8, 16))
    for start in range(0, len(values), 8):
        run = values[start : start + 8]
        bits += "0" + "00" + f"{len(run) - 1:03b}" + "".join(f"{value:08b}" for value in run)
    bits += "0" * (-len(bits) % 8)
    return [int(bits[i : i + 8], 2) for i in range(0, len(bits), 8)]


def test_labelstudio_brushes_hold_the_crack_where_alpha_is_above_zero(tmp_path):
    """As label-studio-converter reads a brush (its brush export, ls_rle_to_coco_rle): alpha > 0 is the mask."""
    _photo(tmp_path / "photos", size=(3, 2))
    rgba = [[0, 0, 0, 0], [255, 0, 0, 255], [255, 0, 0, 0], [0, 0, 0, 0], [255, 0, 0, 1], [255, 0, 0, 200]]
    brush = {"type": "brushlabels", "original_width": 3, "original_height": 2,
             "value": {"format": "rle", "rle": _brush([v for pixel in rgba for v in pixel]), "brushlabels": ["crack"]}}
    masks, _ = _imported(tmp_path, "labelstudio", _labelstudio(tmp_path, [brush]))
    assert masks["a"].tolist() == [[False, True, False], [False, True, True]]  # alpha 1 is crack, red at alpha 0 is not


def test_a_brush_is_decoded_without_holding_its_rgba_canvas():
    """A 12 MP photo's brush: 48 million RGBA values, 384 MB as int64; only the alpha values are kept, as bools."""
    import tracemalloc

    mask = np.zeros((3000, 4000), bool)
    mask[1000:1010] = True
    mask[2000, 5::7] = True
    rle = brush_encode(mask)
    tracemalloc.start()
    try:
        decoded = brush_decode(rle, 4000, 3000, "brush.json")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert np.array_equal(decoded, mask) and peak < 2 * mask.size


def test_lines_are_drawn_line_width_wide_and_a_cvat_width_attribute_wins(tmp_path):
    _photo(tmp_path / "photos")
    strip = {"label": "crack", "shape_type": "linestrip", "points": [[1, 3], [6, 3]]}  # centres of row 3, columns 1-6
    masks, provenance = _imported(tmp_path, "labelme", _labelme(tmp_path, [strip]), line_width=3)
    assert np.argwhere(masks["a"]).min(axis=0).tolist() == [2, 1] and np.argwhere(masks["a"]).max(axis=0).tolist() == [4, 6]
    assert provenance["shapes"] == {"line": 1} and provenance["line_width_px"] == 3
    polyline = '<polyline label="crack" points="1.5,3.5;6.5,3.5"><attribute name="width">1</attribute></polyline>'
    masks, _ = _imported(tmp_path, "cvat", _cvat(tmp_path, polyline), line_width=3, overwrite=True)
    assert np.argwhere(masks["a"]).tolist() == [[3, x] for x in range(1, 7)]  # its own width, 1 px


# What is imported, left out and counted


def test_import_writes_a_dataset_inspect_accepts_and_counts_everything(tmp_path):
    photos = tmp_path / "photos"
    for name in ("a.png", "b.png", "c.png"):
        _photo(photos, name)
    shapes = [(1, [[3, 1, 4, 1, 4, 7, 3, 7]]), (2, [[0, 0, 5, 0, 5, 5]]), (1, [[8, 2, 14, 2, 14, 4, 8, 4]]),
              (1, [[2, 2, 2, 2, 2.3, 2.3]]), (1, {"size": [H, W], "counts": [W * H]})]
    coco = _coco(tmp_path, shapes, categories=("Crack", "joint"), images=[("a.png", W, H), ("sub/b.png", W, H)])
    masks, provenance = _imported(tmp_path, "coco", coco, labels=("crack",))
    assert sorted(masks) == ["a", "b"] and not masks["b"].any()  # listed without a crack: an empty mask
    assert provenance["shapes"] == {"polygon": 3, "mask": 1} and provenance["labels"] == {"Crack": 4}
    assert provenance["left_out_labels"] == {"joint": 1} and provenance["clipped"] == 1 and provenance["zero_area"] == 2
    assert provenance["images_not_listed"] == ["c.png"] and provenance["crack_free"] == 1
    assert masks["a"][2:4, 8:].all() and masks["a"][:, 8:].sum() == 4  # the part inside the image
    found = open_dataset(tmp_path / "dataset")
    assert not found.problems and [sample.stem for sample in found.samples] == ["a", "b"]


def test_import_refuses_to_replace_a_dataset_and_replaces_it_whole_with_overwrite(tmp_path):
    _photo(tmp_path / "photos", "a.png")
    _photo(tmp_path / "photos", "b.png")
    two = _coco(tmp_path, [], images=[("a.png", W, H), ("b.png", W, H)])
    _imported(tmp_path, "coco", two)
    with pytest.raises(Exception, match="pass --overwrite"):
        _imported(tmp_path, "coco", two)
    masks, _ = _imported(tmp_path, "coco", _coco(tmp_path, [], images=[("a.png", W, H)]), overwrite=True)
    assert sorted(masks) == ["a"] and sorted(p.name for p in (tmp_path / "dataset" / "images").iterdir()) == ["a.png"]


def _cli(*args) -> tuple[int, str]:
    return cli_result(["labels", *args])


@pytest.mark.parametrize("case, message", [
    ("missing image", "refers to 1 images that are not in --images (e.g. gone.png)"),
    ("wrong size", "is 12x8 px there but"),
    ("exif", "EXIF orientation tag (6) explains it"),
    ("label", "--label crak matches no label in"),
    ("malformed", "not a valid coco file: missing 'file_name'"),
    ("not json", "not readable JSON"),
    ("lines", "holds 1 lines (polylines, linestrips): give --line-width PX"),
    ("unknown category", "has category_id 9, which the categories list lacks"),
    ("mask without data", "labelme/a.json: shape 1 (label 'crack'): a mask shape without its mask"),
    ("mask not base64", "labelme/a.json: shape 0 (label 'crack'): its mask is not a base64 PNG"),
])
def test_bad_input_is_one_line_naming_the_file(tmp_path, case, message):
    photos = tmp_path / "photos"
    _photo(photos, "a.png")
    _photo(photos, "turned.jpg", size=(W, H), exif_orientation=6)  # shown 8x10
    fmt, extra = "coco", []
    if case == "missing image":
        path = _coco(tmp_path, [], images=[("gone.png", W, H)])
    elif case == "wrong size":
        path = _coco(tmp_path, [], images=[("a.png", 12, H)])
    elif case == "exif":
        path = _coco(tmp_path, [], images=[("turned.jpg", W, H)])
    elif case == "label":
        path, extra = _coco(tmp_path, []), ["--label", "crak"]
    elif case == "malformed":
        path = tmp_path / "coco.json"
        path.write_text(json.dumps({"images": [{"id": 1}], "annotations": []}))
    elif case == "not json":
        path = tmp_path / "coco.json"
        path.write_text("{not json")
    elif case == "lines":
        fmt, path = "cvat", _cvat(tmp_path, '<polyline label="crack" points="1,1;5,5"/>')
    elif case.startswith("mask"):
        polygon = {"label": "crack", "shape_type": "polygon", "points": [[3, 1], [3, 6], [4, 6]]}
        mask = {"label": "crack", "shape_type": "mask", "points": [[1, 1], [2, 2]], "mask": None if case == "mask without data" else "no%data"}
        fmt, path = "labelme", _labelme(tmp_path, [polygon, mask] if case == "mask without data" else [mask])
    else:
        path = _coco(tmp_path, [(9, [[0, 0, 1, 0, 1, 1]])])
    code, err = _cli("import", path, "--format", fmt, "--images", photos, "--out", tmp_path / "out", *extra)
    assert code == 2 and err.count("\n") == 1 and err.startswith("crackseg: error: ") and message in err, err
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_missing_pycocotools_names_the_extra(monkeypatch, tmp_path):
    import sys

    from crackseg.core.errors import InputError

    monkeypatch.setitem(sys.modules, "pycocotools.mask", None)
    _photo(tmp_path / "photos")
    with pytest.raises(InputError, match=r"pip install 'crackseg\[labels\]'"):
        _imported(tmp_path, "coco", _coco(tmp_path, [(1, [[3, 1, 4, 1, 4, 7, 3, 7]])]))


@pytest.mark.parametrize("fmt", ["coco", "cvat", "labelstudio"])
def test_a_folder_given_for_an_annotation_file_is_one_line(tmp_path, fmt):
    _photo(tmp_path / "photos")
    code, err = _cli("import", tmp_path / "photos", "--format", fmt, "--images", tmp_path / "photos", "--out", tmp_path / "out")
    assert code == 2 and err.count("\n") == 1 and f"{tmp_path / 'photos'} is a folder; --format {fmt} expects a" in err, err


# Exports as the tools write them


def _ls_result(kind, value, region="r1", size=(W, H)):
    """One result of a region, as Label Studio's JSON export writes it (all results of a region share its id)."""
    return {"id": region, "type": kind, "from_name": kind, "to_name": "image", "original_width": size[0], "original_height": size[1],
            "image_rotation": 0, "value": value}


def _ls_column(x, label="crack"):
    """A polygonlabels result over pixel column x."""
    return _ls_polygon([(x, 0), (x + 1, 0), (x + 1, H), (x, H)], label)


def _ls_tasks(tmp_path, tasks) -> object:
    path = tmp_path / "labelstudio.json"
    path.write_text(json.dumps([{"id": number, "data": {"image": image}, key: annotations}
                                for number, (image, key, annotations) in enumerate(tasks, 1)]))
    return path


def test_labelstudio_reads_older_completions_and_counts_cancelled_or_skipped_annotations(tmp_path):
    """Label Studio before 1.0 exported a task's annotations as "completions"; cancelled (was_cancelled) and
    skipped annotations are passed over and counted."""
    for name in ("a.png", "b.png"):
        _photo(tmp_path / "photos", name)
    path = _ls_tasks(tmp_path, [
        ("a.png", "completions", [{"id": 1, "result": [_ls_column(3)]}, {"id": 2, "skipped": True, "result": [_ls_column(6)]}]),
        ("b.png", "annotations", [{"id": 3, "was_cancelled": True, "result": [_ls_column(5)]}]),
    ])
    masks, provenance = _imported(tmp_path, "labelstudio", path)
    assert sorted(masks) == ["a"] and _columns(masks["a"]) == [3]
    assert provenance["cancelled_annotations"] == 2 and provenance["unlabelled_tasks"] == 1
    assert "2 cancelled or skipped annotations were not imported" in import_summary(provenance, tmp_path / "dataset")


def test_labelstudio_takes_the_ground_truth_else_the_newest_annotation_and_says_so(tmp_path):
    names = ("truth.png", "updated.png", "created.png", "untimed.png")
    for name in names:
        _photo(tmp_path / "photos", name)

    def annotation(x, **fields):
        return {"result": [_ls_column(x)], **fields}

    path = _ls_tasks(tmp_path, [
        ("truth.png", "annotations", [annotation(1, ground_truth=True, updated_at="2024-01-01T00:00:00Z"),
                                      annotation(2, ground_truth=False, updated_at="2024-06-01T00:00:00Z")]),
        ("updated.png", "annotations", [annotation(3, created_at="2024-01-01T00:00:00Z", updated_at="2024-03-01T10:00:00.123456Z"),
                                        annotation(4, created_at="2024-02-01T00:00:00Z", updated_at="2024-02-01T00:00:00Z")]),
        ("created.png", "annotations", [annotation(5, created_at="2024-05-01T01:00:00+02:00"),  # 23:00 UTC, after 22:30
                                        annotation(6, created_at="2024-04-30T22:30:00Z")]),
        ("untimed.png", "annotations", [annotation(7), annotation(8)]),
    ])
    masks, provenance = _imported(tmp_path, "labelstudio", path)
    assert [_columns(masks[name.split(".")[0]]) for name in names] == [[1], [3], [5], [8]]
    assert provenance["tasks_with_several_annotations"] == 4
    assert "4 tasks had several annotations" in import_summary(provenance, tmp_path / "dataset")


def test_labelstudio_results_are_drawn_on_the_image_their_to_name_names(tmp_path):
    """A config with two <Image> tags (a before and an after photo): each result is drawn on its own photo."""
    for name in ("before.png", "after.png", "other.png"):
        _photo(tmp_path / "photos", name)
    results = [_ls_column(2), _ls_column(7) | {"to_name": "image2"}]
    task = {"id": 1, "data": {"image": "/data/local-files/?d=before.png", "image2": "/data/local-files/?d=after.png"},
            "annotations": [{"result": results}]}
    path = tmp_path / "pairs.json"
    path.write_text(json.dumps([task]))
    masks, _ = _imported(tmp_path, "labelstudio", path)
    assert _columns(masks["before"]) == [2] and _columns(masks["after"]) == [7]
    task["data"] = {"image": "before.png", "other": "other.png"}
    task["annotations"][0]["result"] = [_ls_column(4) | {"to_name": "other"}]  # one image, named by its to_name
    path.write_text(json.dumps([task]))
    masks, _ = _imported(tmp_path, "labelstudio", path, overwrite=True)
    assert list(masks) == ["other"] and _columns(masks["other"]) == [4]
    task["annotations"][0]["result"] = [_ls_column(2), _ls_column(7) | {"to_name": "image3"}]
    path.write_text(json.dumps([task]))
    code, err = _cli("import", path, "--format", "labelstudio", "--images", tmp_path / "photos", "--out", tmp_path / "out")
    assert code == 2 and err.count("\n") == 1 and "results on several images (image, image3)" in err, err


@pytest.mark.parametrize("sub, kind, what", [("images", "file", "a file, not a folder"), ("masks", "file", "a file, not a folder"),
                                             ("images", "link", "a broken link, not a folder"),
                                             ("labels.json", "folder", "a folder, not a file")])
def test_a_file_where_the_dataset_needs_a_folder_is_refused_and_nothing_is_made(tmp_path, sub, kind, what):
    _photo(tmp_path / "photos")
    out = tmp_path / "out"
    out.mkdir()
    if kind == "file":
        (out / sub).write_text("notes")
    elif kind == "link":
        (out / sub).symlink_to(tmp_path / "nowhere")
    else:
        (out / sub).mkdir()
    code, err = _cli("import", _coco(tmp_path, [(1, [[3, 1, 4, 1, 4, 7, 3, 7]])]), "--format", "coco",
                     "--images", tmp_path / "photos", "--out", out)
    assert code == 2 and err.count("\n") == 1 and f"{out / sub} is {what}" in err, err
    assert [path.name for path in out.iterdir()] == [sub]


def test_labelstudio_uploads_match_the_photo_whose_name_django_stored_cleaned(tmp_path):
    """An upload of "my photo (1).png" is stored as <8 hex>-my_photo_1.png (Django's get_valid_filename)."""
    photos = tmp_path / "photos"
    _photo(photos, "my photo (1).png")
    path = _labelstudio(tmp_path, [_ls_column(3)], image="/data/upload/3/abcd1234-my_photo_1.png")
    masks, _ = _imported(tmp_path, "labelstudio", path)
    assert list(masks) == ["my photo (1)"] and _columns(masks["my photo (1)"]) == [3]
    for other in ("my_photo_1.png", "my photo 1.png"):  # stored as that upload too, the one so named exactly included
        _photo(photos, other)
        code, err = _cli("import", path, "--format", "labelstudio", "--images", photos, "--out", tmp_path / "out")
        assert code == 2 and err.count("\n") == 1 and "my photo (1).png" in err and other in err, err
        (photos / other).unlink()
    _photo(photos, "abcd1234-my_photo_1.png")  # the whole name comes first
    masks, provenance = _imported(tmp_path, "labelstudio", path, overwrite=True)
    assert list(masks) == ["abcd1234-my_photo_1"] and provenance["images_not_listed"] == ["my photo (1).png"]


@pytest.mark.parametrize("fmt", ["coco", "cvat"])
def test_a_name_like_an_upload_is_the_whole_name_outside_label_studio(tmp_path, fmt):
    """20230514-a.png is that file, not a.png with an upload prefix: a.png's cracks would be another photo's."""
    _photo(tmp_path / "photos")
    if fmt == "coco":
        path = _coco(tmp_path, [(1, [[3, 1, 4, 1, 4, 7, 3, 7]])], images=(("site2/20230514-a.png", W, H),))
    else:
        path = _cvat(tmp_path, '<polygon label="crack" points="3,1;4,1;4,7;3,7"/>', name="site2/20230514-a.png")
    code, err = _cli("import", path, "--format", fmt, "--images", tmp_path / "photos", "--out", tmp_path / "out")
    assert code == 2 and "not in --images (e.g. site2/20230514-a.png)" in err, err
    _photo(tmp_path / "photos", "20230514-a.png")
    masks, _ = _imported(tmp_path, fmt, path)
    assert list(masks) == ["20230514-a"] and _columns(masks["20230514-a"]) == [3]


def test_a_name_finds_its_photo_in_either_unicode_form(tmp_path):
    """macOS writes é as e and a combining accent (NFD), most tools as one character (NFC)."""
    composed, decomposed = "fissure_\u00e9", "fissure_e\u0301"
    _photo(tmp_path / "photos", f"{decomposed}.png")
    masks, _ = _imported(tmp_path, "coco", _coco(tmp_path, [(1, [[3, 1, 4, 1, 4, 7, 3, 7]])], images=((f"{composed}.png", W, H),)))
    assert list(masks) == [decomposed] and _columns(masks[decomposed]) == [3]
    path = _labelstudio(tmp_path, [_ls_column(3)], image=f"/data/upload/3/1a2b3c4d-{composed}.png")
    masks, _ = _imported(tmp_path, "labelstudio", path, overwrite=True)
    assert list(masks) == [decomposed]
    _photo(tmp_path / "photos", f"{composed}.png")  # both forms: which one a file means would be a guess
    code, err = _cli("import", path, "--format", "labelstudio", "--images", tmp_path / "photos", "--out", tmp_path / "other")
    assert code == 2 and "one name, written in two Unicode forms" in err and err.count("\n") == 1, err


def test_photos_in_linked_subfolders_of_images_are_found(tmp_path):
    _photo(tmp_path / "nas" / "site1")
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "site1").symlink_to(tmp_path / "nas" / "site1", target_is_directory=True)
    masks, provenance = _imported(tmp_path, "coco", _coco(tmp_path, [(1, [[3, 1, 4, 1, 4, 7, 3, 7]])], images=(("site1/a.png", W, H),)))
    assert _columns(masks["a"]) == [3] and provenance["images_not_listed"] == []


def test_labelstudio_relations_between_regions_are_left_out(tmp_path):
    """<Relations> results link two regions: they have no to_name and are drawn on no image."""
    _photo(tmp_path / "photos")
    first, second = {**_ls_column(3), "id": "r1"}, {**_ls_column(6), "id": "r2"}
    relation = {"from_id": "r1", "to_id": "r2", "type": "relation", "direction": "right", "labels": ["continues"]}
    masks, provenance = _imported(tmp_path, "labelstudio", _labelstudio(tmp_path, [first, relation, second]))
    assert _columns(masks["a"]) == [3, 6] and provenance["shapes"] == {"polygon": 2} and provenance["labels"] == {"crack": 2}


def test_labelstudio_labels_tag_beside_polygon_and_brush_tags_gives_labelled_shapes(tmp_path):
    """<Labels> beside <Polygon> and <Brush>: a region's labels result holds its shape (points in percent, or an RLE);
    the region's own polygon result (same id) is the same shape, and labels without a shape label the region's shape.
    A shape without labels is counted under its type."""
    _photo(tmp_path / "photos")

    def column(x):
        return {"points": [[100 * x / W, 0], [100 * (x + 1) / W, 0], [100 * (x + 1) / W, 100], [100 * x / W, 100]], "closed": True}

    def brush(x):
        return {"format": "rle", "rle": _brush([255 * (n // 4 % W == x) for n in range(W * H * 4)])}

    results = [_ls_result("polygon", column(3), "r1"), _ls_result("labels", column(3) | {"labels": ["crack"]}, "r1"),
               _ls_result("labels", brush(7) | {"labels": ["crack"]}, "r2"), _ls_result("polygon", column(5), "r3"),
               _ls_result("brush", brush(8), "r4"), _ls_result("polygon", column(1), "r5"), _ls_result("labels", {"labels": ["crack"]}, "r5")]
    path = _labelstudio(tmp_path, results)
    masks, provenance = _imported(tmp_path, "labelstudio", path)
    assert _columns(masks["a"]) == [1, 3, 7] and masks["a"].sum() == 3 * H
    assert provenance["shapes"] == {"polygon": 2, "mask": 1} and provenance["left_out_labels"] == {"polygon": 1, "brush": 1}
    masks, _ = _imported(tmp_path, "labelstudio", path, labels=("crack", "polygon", "brush"), overwrite=True)
    assert _columns(masks["a"]) == [1, 3, 5, 7, 8]


def test_coco_annotations_without_an_outline_are_counted(tmp_path):
    """Label Studio's COCO export writes a rectangle as "segmentation": []; a two-point polygon covers nothing
    (pycocotools 2.0.11 refuses [[x1, y1, x2, y2]] rather than reading it as a box)."""
    _photo(tmp_path / "photos")
    masks, provenance = _imported(tmp_path, "coco", _coco(tmp_path, [(1, []), (1, None), (1, [[1, 1, 3, 5]])]))
    assert provenance["not_drawn"] == {"box": 2} and provenance["shapes"] == {"polygon": 1} and provenance["zero_area"] == 1
    assert not masks["a"].any()


def test_cvat_video_frames_without_a_suffix_match_the_photo_of_that_stem(tmp_path):
    """CVAT for images names the frames of a video task frame_000000, without a suffix."""
    photos = tmp_path / "photos"
    _photo(photos, "frame_000000.png")
    path = _cvat(tmp_path, '<polygon label="crack" occluded="0" points="3,1;4,1;4,7;3,7"/>', name="frame_000000")
    masks, _ = _imported(tmp_path, "cvat", path)
    assert _columns(masks["frame_000000"]) == [3]
    _photo(photos, "frame_000000.jpg")
    code, err = _cli("import", path, "--format", "cvat", "--images", photos, "--out", tmp_path / "out")
    assert code == 2 and err.count("\n") == 1 and "frame_000000.jpg" in err and "frame_000000.png" in err, err


def test_labelme_image_data_stands_in_for_a_photo_the_folder_lacks(tmp_path):
    """labelme embeds the photo (imageData: its file, base64) and shows it when the photo is absent."""
    photos = tmp_path / "photos"
    photos.mkdir()
    pixels = np.random.default_rng(0).integers(0, 255, (H, W, 3), dtype=np.uint8)
    encoded = io.BytesIO()
    Image.fromarray(pixels).save(encoded, "PNG")
    data = base64.b64encode(encoded.getvalue()).decode()
    shape = {"label": "crack", "shape_type": "polygon", "points": [[3, 1], [3, 6], [3, 6], [3, 1]]}
    masks, provenance = _imported(tmp_path, "labelme", _labelme(tmp_path, [shape], image_data=data))
    assert _columns(masks["a"]) == [3] and provenance["photos_from_image_data"] == ["a.png"]
    assert np.array_equal(np.asarray(Image.open(tmp_path / "dataset" / "images" / "a.png")), pixels)
    assert not open_dataset(tmp_path / "dataset").problems
    _photo(photos)  # the photo itself, when the folder has it
    _, provenance = _imported(tmp_path, "labelme", _labelme(tmp_path, [shape], image_data=data), overwrite=True)
    assert provenance["photos_from_image_data"] == [] and np.asarray(Image.open(tmp_path / "dataset" / "images" / "a.png"))[0, 0, 0] == 128
    (photos / "a.png").unlink()
    path = _labelme(tmp_path, [shape], size=(W + 2, H), image_data=data)
    code, err = _cli("import", path, "--format", "labelme", "--images", photos, "--out", tmp_path / "out")
    assert code == 2 and err.count("\n") == 1 and "is 12x8 px there but the photo in" in err and "imageData is 10x8" in err, err


def test_a_labelme_folder_passes_over_other_json_files_and_the_dataset_written_inside_it(tmp_path):
    _photo(tmp_path / "photos")
    folder = _labelme(tmp_path, [{"label": "crack", "shape_type": "polygon", "points": [[3, 1], [3, 6], [3, 6], [3, 1]]}])
    (folder / "classes.json").write_text(json.dumps({"classes": ["crack", "joint"]}))
    for _ in range(2):  # the second time, the dataset's own labels.json lies in the folder
        provenance = import_labels(folder, "labelme", tmp_path / "photos", folder / "dataset", ImportOptions(overwrite=True))
    assert provenance["images"] == 1 and provenance["json_files_skipped"] == 1
    assert "skipped 1 JSON files that are not labelme annotations" in import_summary(provenance, folder / "dataset")
    (folder / "a.json").unlink()
    with pytest.raises(InputError, match="holds no labelme .json files"):
        import_labels(folder, "labelme", tmp_path / "photos", folder / "dataset", ImportOptions(overwrite=True))


def test_a_labelstudio_region_is_named_by_its_geometry_and_drawn_once(tmp_path):
    """A per-region TextArea result listed before the region's polygon does not name it, and a region labelled by
    both its polygonlabels and a labels result is one shape."""
    _photo(tmp_path / "photos")
    column = {"points": [[100 * 2 / W, 0], [100 * 3 / W, 0], [100 * 3 / W, 100], [100 * 2 / W, 100]], "closed": True}
    results = [_ls_result("textarea", column | {"text": ["hairline?"]}, "r1"), _ls_result("polygon", column, "r1"),
               _ls_column(4) | {"id": "r2"}, _ls_result("labels", _ls_column(4)["value"] | {"labels": ["crack"]}, "r2")]
    masks, provenance = _imported(tmp_path, "labelstudio", _labelstudio(tmp_path, results))
    assert _columns(masks["a"]) == [4] and provenance["shapes"] == {"polygon": 1}
    assert provenance["left_out_labels"] == {"polygon": 1}


def test_labelstudio_annotations_timed_in_seconds_are_ordered_too(tmp_path):
    _photo(tmp_path / "photos")
    path = _ls_tasks(tmp_path, [("a.png", "completions", [{"result": [_ls_column(6)], "created_at": 1_700_000_100},
                                                          {"result": [_ls_column(2)], "created_at": 1_700_000_000}])])
    masks, _ = _imported(tmp_path, "labelstudio", path)
    assert _columns(masks["a"]) == [6]


def test_a_labelme_folder_passes_over_json_it_cannot_parse_and_refuses_embedded_photos_of_other_kinds(tmp_path):
    _photo(tmp_path / "photos")
    shape = {"label": "crack", "shape_type": "polygon", "points": [[3, 1], [3, 6], [3, 6], [3, 1]]}
    folder = _labelme(tmp_path, [shape])
    (folder / "notes.json").write_text("{ not json")
    provenance = import_labels(folder, "labelme", tmp_path / "photos", tmp_path / "dataset", ImportOptions())
    assert provenance["images"] == 1 and provenance["json_files_skipped"] == 1
    (folder / "notes.json").unlink()
    path = _labelme(tmp_path, [shape], image="a.gif", image_data=base64.b64encode(b"GIF89a").decode())
    code, err = _cli("import", path / "a.json", "--format", "labelme", "--images", tmp_path / "photos", "--out", tmp_path / "out")
    assert code == 2 and err.count("\n") == 1 and "a.gif is only embedded (imageData)" in err, err


# Export: predictions -> pre-annotations -> import gives the predictions back


def _predictions(tmp_path) -> tuple[object, dict[str, np.ndarray]]:
    """A predictions folder (with 8-bit probabilities) of four photos: thin and wide cracks, a ring with a crack inside
    its hole, specks, one crack-free; and the masks."""
    masks = {name: np.zeros((48, 64), bool) for name in ("ring", "thin", "specks", "clean")}
    masks["ring"][8:40, 8:40] = True
    masks["ring"][14:34, 14:34] = False
    masks["ring"][22:26, 22:26] = True
    for x in range(60):
        masks["thin"][5 + x * 35 // 60, x] = True  # one pixel wide, diagonal steps
        masks["thin"][30 + x // 20 : 34 + x // 20, x] = True
    masks["specks"][[3, 10, 47], [5, 63, 0]] = True
    folder, records = PredictionsFolder(tmp_path / "pred"), Records()
    spec = OutputSpec(save_prob=8, measure=False)
    rng = np.random.default_rng(0)
    for key, (name, mask) in enumerate(masks.items()):
        photo = _photo(tmp_path / "photos" / "site", f"{name}.jpg", size=(64, 48))
        prob = torch.from_numpy(np.where(mask, rng.uniform(0.5, 1, mask.shape), rng.uniform(0, 0.5, mask.shape)).astype(np.float32))
        records.add(key, *write_image_outputs(folder, photo, f"site/{name}", torch.zeros(3, 48, 64, dtype=torch.uint8), prob, 0.5, spec))
    folder.write_tables(records, spec, [], False, 0.5)
    return tmp_path / "pred", masks


@pytest.mark.parametrize("rle", [False, True], ids=["polygons", "rle"])
@pytest.mark.parametrize("fmt", ["coco", "labelme", "cvat", "labelstudio"])
def test_import_of_an_export_gives_the_predicted_masks_back(tmp_path, fmt, rle):
    predictions, expected = _predictions(tmp_path)
    out = tmp_path / {"coco": "pre.json", "labelme": "photos", "cvat": "pre.xml", "labelstudio": "tasks.json"}[fmt]
    written = export_labels(predictions, fmt, out, rle)
    assert written["images"] == 4
    if fmt == "labelme":  # beside each photo, naming it as labelme will
        assert json.loads((out / "site" / "ring.json").read_text())["imagePath"] == "ring.jpg"
    if fmt == "labelstudio":  # a person submits each pre-annotation unchanged
        tasks = json.loads(out.read_text())
        assert tasks[0]["data"]["image"] == "site/ring.jpg"
        for task in tasks:
            task["annotations"] = [{"result": task.pop("predictions")[0]["result"]}]
        out.write_text(json.dumps(tasks))
    masks, provenance = _imported(tmp_path, fmt, out)
    assert provenance["zero_area"] == 0 and provenance["clipped"] == 0 and provenance["crack_free"] == 1
    for name, mask in expected.items():
        if rle:
            assert np.array_equal(masks[name], mask), name
        else:
            union = (masks[name] | mask).sum()
            assert (masks[name] & mask).sum() / union >= 0.99 if union else not masks[name].any(), name


def test_export_refuses_to_replace_without_overwrite(tmp_path):
    predictions, _ = _predictions(tmp_path)
    export_labels(predictions, "cvat", tmp_path / "pre.xml")
    code, err = _cli("export", predictions, "--format", "cvat", "--out", tmp_path / "pre.xml")
    assert code == 2 and "already exists" in err and err.count("\n") == 1
    assert _cli("export", predictions, "--format", "cvat", "--out", tmp_path / "pre.xml", "--overwrite")[0] == 0


def test_exported_polygons_cut_holes_and_stay_few(tmp_path):
    """A ring is one COCO polygon whose hole is joined by a cut of zero width; a straight edge is one segment."""
    predictions, expected = _predictions(tmp_path)
    export_labels(predictions, "coco", tmp_path / "pre.json")
    document = json.loads((tmp_path / "pre.json").read_text())
    ring = [a for a in document["annotations"] if a["image_id"] == 1]
    assert len(ring) == 2 and all(len(a["segmentation"]) == 1 for a in ring)  # the ring, and the crack inside its hole
    # two squares (8 points each: marching squares cut every corner by half a pixel), the cut there and back, closed
    assert max(len(a["segmentation"][0]) // 2 for a in ring) <= 20


# Rank


def test_rank_orders_photos_by_uncertainty_as_predictions_csv_has_it(tmp_path):
    predictions, _ = _predictions(tmp_path)
    ranked, rasters = rank_predictions(predictions)
    assert rasters == 0 and [row["rank"] for row in ranked] == [1, 2, 3, 4]
    assert [row["uncertainty"] for row in ranked] == sorted((row["uncertainty"] for row in ranked), reverse=True)
    with open(predictions / "rank.csv") as file:
        table = list(csv.DictReader(file))
    with open(predictions / "predictions.csv") as file:
        by_path = {row["path"]: row for row in csv.DictReader(file)}
    assert [row["path"] for row in table] == [row["path"] for row in ranked]
    for row in table:  # the same figure, from the saved map, as predict wrote
        assert row["uncertainty"] == by_path[row["path"]]["uncertainty"]
        assert row["unsure_crack_share"] == by_path[row["path"]]["unsure_crack_share"]
    assert float(table[0]["uncertainty"]) > 0.4  # probabilities drawn uniformly: about half the pixels are unsure


def test_rank_needs_probability_maps(tmp_path):
    predictions, _ = _predictions(tmp_path)
    for path in (predictions / "probs" / "site").iterdir():
        path.unlink()
    code, err = _cli("rank", predictions)
    assert code == 2 and "--save-prob" in err and err.count("\n") == 1


def test_a_dataset_written_inside_the_photo_folder_is_not_read_as_photos(tmp_path):
    _photo(tmp_path / "photos")
    coco = _coco(tmp_path, [(1, [[3, 1, 4, 1, 4, 7, 3, 7]])])
    for _ in range(2):
        provenance = import_labels(coco, "coco", tmp_path / "photos", tmp_path / "photos" / "dataset", ImportOptions(overwrite=True))
    assert provenance["images_not_listed"] == []
    site = tmp_path / "site"  # masks beside the photos: --out is the folder holding images/
    _photo(site / "images")
    provenance = import_labels(coco, "coco", site / "images", site, ImportOptions(overwrite=True))
    assert provenance["images"] == 1 and (site / "masks" / "a.png").is_file() and (site / "images" / "a.png").is_file()
