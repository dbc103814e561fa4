"""crackseg labels import (crackseg.labels.loop.import_labels) against hostile or broken input: --overwrite never deletes an input, duplicate COCO ids,
far, NaN or infinite vertices, stated sizes checked before anything is allocated, and nothing half-written.

Every file here is written by the test; the 10x8 px photos keep each case tiny.
"""

from __future__ import annotations

import contextlib
import json
import os

import numpy as np
import pytest
from conftest import cli_result
from PIL import Image

from crackseg.core.errors import InputError
from crackseg.data.images import load_mask
from crackseg.labels.formats.shapes import finite_points
from crackseg.labels.loop import ImportOptions, import_labels

masks_api = pytest.importorskip("pycocotools.mask")

W, H = 10, 8  # px


def _photo(folder, name="a.png", colour=(128, 128, 128), size=None):
    folder.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size or (W, H), colour).save(folder / name)
    return folder / name


def _coco(tmp_path, annotations, images=(("a.png", W, H),), categories=("crack",), name="coco.json"):
    """A COCO file; ``annotations`` are (image_id, segmentation), or whole annotation dicts."""
    document = {
        "images": [{"id": n, "file_name": file, "width": w, "height": h} for n, (file, w, h) in enumerate(images, 1)],
        "categories": [{"id": n, "name": label} for n, label in enumerate(categories, 1)],
        "annotations": [item if isinstance(item, dict) else {"id": n, "image_id": item[0], "category_id": 1, "segmentation": item[1]}
                        for n, item in enumerate(annotations, 1)],
    }
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return path


def _cvat(tmp_path, shapes: str, size=(W, H)):
    path = tmp_path / "annotations.xml"
    path.write_text(f"""<?xml version="1.0" encoding="utf-8"?>
<annotations><version>1.1</version>
<meta><task><labels><label><name>crack</name></label></labels></task></meta>
<image id="0" name="a.png" width="{size[0]}" height="{size[1]}">{shapes}</image>
</annotations>""")
    return path


def _cli(*args) -> tuple[int, str]:
    return cli_result(["labels", *args])


def _refused(path, fmt, photos, out, message):
    """The import ends with one line naming ``message``, exit status 2."""
    code, err = _cli("import", path, "--format", fmt, "--images", photos, "--out", out)
    assert code == 2 and err.count("\n") == 1 and err.startswith("crackseg: error: ") and message in err, err
    return err


def _mask(out, stem="a") -> np.ndarray:
    return load_mask(out / "masks" / f"{stem}.png")[0].numpy().astype(bool)


@contextlib.contextmanager
def _address_space(extra: int):
    """At most ``extra`` bytes more address space for this process: an allocation the import should never make fails
    with MemoryError instead of taking the machine's memory."""
    resource = pytest.importorskip("resource")
    if not os.path.exists("/proc/self/statm"):
        pytest.skip("needs /proc/self/statm")
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as statm:
        used = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    cap = used + extra if hard == resource.RLIM_INFINITY else min(used + extra, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


# 1. --overwrite removes only what crackseg wrote, never an input


def test_overwrite_with_the_dataset_images_as_input_keeps_every_photo(tmp_path):
    dataset = tmp_path / "ds"
    for name in ("a.png", "b.png"):
        _photo(dataset / "images", name)
    both = _coco(tmp_path, [], images=[("a.png", W, H), ("b.png", W, H)])
    import_labels(both, "coco", dataset / "images", dataset, ImportOptions(overwrite=True))
    assert (dataset / "masks" / "b.png").is_file()
    fewer = _coco(tmp_path, [], images=[("a.png", W, H)], name="fewer.json")
    provenance = import_labels(fewer, "coco", dataset / "images", dataset, ImportOptions(overwrite=True))
    assert (dataset / "images" / "b.png").is_file(), "an input photo was deleted"
    assert not (dataset / "masks" / "b.png").exists()  # crackseg's own mask of b is gone
    assert provenance["images_not_listed"] == ["b.png"]


def test_overwrite_keeps_photos_that_became_input_and_files_crackseg_did_not_write(tmp_path):
    photos, dataset = tmp_path / "photos", tmp_path / "ds"
    for name in ("a.png", "b.png"):
        _photo(photos, name)
    import_labels(_coco(tmp_path, [], images=[("a.png", W, H), ("b.png", W, H)]), "coco", photos, dataset)
    _photo(dataset / "masks", "b.jpg")  # the user's, of a stem crackseg wrote before
    fewer = _coco(tmp_path, [], images=[("a.png", W, H)], name="fewer.json")
    import_labels(fewer, "coco", dataset / "images", dataset, ImportOptions(overwrite=True))  # the dataset's photos as input
    assert (dataset / "images" / "b.png").is_file(), "an input photo was deleted"
    assert (dataset / "masks" / "b.jpg").is_file(), "a file crackseg did not write was deleted"
    assert not (dataset / "masks" / "b.png").exists()
    import_labels(fewer, "coco", photos, dataset, ImportOptions(overwrite=True))  # photos elsewhere: the dataset's copy goes
    assert not (dataset / "images" / "b.png").exists() and (photos / "b.png").is_file()


def test_photos_already_in_the_dataset_are_never_recorded_as_written_nor_removed_later(tmp_path):
    dataset, new = tmp_path / "ds", tmp_path / "new"
    _photo(dataset / "images", "a.png")
    _photo(new, "b.png")
    provenance = import_labels(_coco(tmp_path, []), "coco", dataset / "images", dataset, ImportOptions(overwrite=True))
    assert provenance["files_written"] == ["masks/a.png"]
    other = _coco(tmp_path, [], images=[("b.png", W, H)], name="other.json")
    import_labels(other, "coco", new, dataset, ImportOptions(overwrite=True))
    assert (dataset / "images" / "a.png").is_file(), "the user's only copy of a photo was deleted"
    assert not (dataset / "masks" / "a.png").exists() and (dataset / "masks" / "b.png").is_file()


def test_two_names_that_find_one_photo_are_refused_naming_both(tmp_path):
    """Cameras restart their numbering in each folder: site2's cracks must not be painted on site1's photo."""
    _photo(tmp_path / "photos" / "site1", "IMG_1.png")
    square = [[0, 0, 4, 0, 4, 4, 0, 4]]
    path = _coco(tmp_path, [(1, square), (2, square)], images=[("site1/IMG_1.png", W, H), ("site2/IMG_1.png", W, H)])
    _refused(path, "coco", tmp_path / "photos", tmp_path / "ds", "site1/IMG_1.png and site2/IMG_1.png both match")
    assert not (tmp_path / "ds").exists()
    again = _coco(tmp_path, [(1, square), (2, square)], images=[("site1/IMG_1.png", W, H), ("./site1//IMG_1.png", W, H)],
                  name="again.json")  # one name, written two ways: one photo, both shapes
    import_labels(again, "coco", tmp_path / "photos", tmp_path / "ds")
    assert _mask(tmp_path / "ds", "IMG_1")[:4, :4].all()


def test_a_name_finds_the_photo_sharing_the_longest_tail_of_its_path(tmp_path):
    """site1/a.png is new/site1/a.png, not the a.png at the top of --images that shares only its file name."""
    _photo(tmp_path / "photos", colour=(10, 10, 10))
    _photo(tmp_path / "photos" / "new" / "site1", "b.png")
    _photo(tmp_path / "photos" / "new" / "site1", colour=(200, 200, 200))
    square = [[0, 0, 4, 0, 4, 4, 0, 4]]
    path = _coco(tmp_path, [(1, square), (2, square)], images=[("site1/a.png", W, H), ("b.png", W, H)])
    import_labels(path, "coco", tmp_path / "photos", tmp_path / "ds")
    assert Image.open(tmp_path / "ds" / "images" / "a.png").getpixel((0, 0)) == (200, 200, 200)
    for tops in (("new", "old"), ("old", "new")):  # two photos that share that tail: a guess either way
        for top in tops:
            _photo(tmp_path / f"two{tops[0]}" / top / "site1")
        _refused(path, "coco", tmp_path / f"two{tops[0]}", tmp_path / "out", "site1/a.png could be any of")


def test_photos_that_share_a_stem_are_named_as_a_pair(tmp_path):
    square = [[0, 0, 4, 0, 4, 4, 0, 4]]
    names = ["x/a.png", "x/b.png", "y/a.png", "y/b.png"]
    for name in names:
        _photo(tmp_path / "photos" / name.split("/")[0], name.split("/")[1])
    path = _coco(tmp_path, [(n, square) for n in range(1, 5)], images=[(name, W, H) for name in names])
    err = _refused(path, "coco", tmp_path / "photos", tmp_path / "ds", "share the stem 'a'")
    assert "x/a.png and " in err and "y/a.png share" in err


@pytest.mark.parametrize("segmentation, message", [
    ({"size": [H, W], "counts": [30.5, 49.5]}, "its RLE counts are not all whole numbers of pixels"),
    ("0 0 4 0 4 4", "is neither polygons (a list of lists) nor an RLE"),
    (7, "is neither polygons (a list of lists) nor an RLE"),
])
def test_a_coco_segmentation_of_no_known_form_is_one_line(tmp_path, segmentation, message):
    _photo(tmp_path / "photos")
    _refused(_coco(tmp_path, [(1, segmentation)]), "coco", tmp_path / "photos", tmp_path / "ds", message)


def test_a_coco_rle_of_whole_numbers_written_as_floats_is_read(tmp_path):
    _photo(tmp_path / "photos")
    import_labels(_coco(tmp_path, [(1, {"size": [H, W], "counts": [8.0, 2.0, 70.0]})]), "coco", tmp_path / "photos", tmp_path / "ds")
    assert _mask(tmp_path / "ds")[:2, 1].all() and _mask(tmp_path / "ds").sum() == 2  # column-major: column 1, rows 0 and 1


def test_a_labelme_shape_type_that_is_not_a_name_is_one_line(tmp_path):
    _photo(tmp_path / "photos")
    (tmp_path / "photos" / "a.json").write_text(json.dumps({"imagePath": "a.png", "imageWidth": W, "imageHeight": H, "shapes": [
        {"label": "crack", "shape_type": ["polygon"], "points": [[0, 0], [4, 0], [4, 4]]}]}))
    _refused(tmp_path / "photos" / "a.json", "labelme", tmp_path / "photos", tmp_path / "ds", "its shape_type ['polygon'] is not a name")


@pytest.mark.parametrize("width", ["0", "10001", "99999999999"])
def test_a_line_width_out_of_range_is_one_line(tmp_path, width):
    _photo(tmp_path / "photos")
    path = _cvat(tmp_path, '<polyline label="crack" points="1,1;8,6" />')
    code, err = _cli("import", path, "--format", "cvat", "--images", tmp_path / "photos", "--out", tmp_path / "ds", "--line-width", width)
    assert code == 2 and err.count("\n") == 1 and "argument --line-width: must be in [1, 10000]" in err, err


@pytest.mark.parametrize("fmt", ["coco", "labelstudio"])
def test_an_image_listed_twice_at_two_sizes_is_one_line(tmp_path, fmt):
    _photo(tmp_path / "photos")
    if fmt == "coco":
        rle = {"size": [H // 2, W // 2], "counts": _compressed(np.ones((H // 2, W // 2), bool))}
        path = _coco(tmp_path, [{"id": 1, "image_id": 2, "category_id": 1, "segmentation": rle, "iscrowd": 1}],
                     images=[("a.png", W, H), ("a.png", W // 2, H // 2)])
    else:
        def task(number, size):
            result = {"id": f"r{number}", "type": "polygonlabels", "from_name": "label", "to_name": "image",
                      "original_width": size[0], "original_height": size[1],
                      "value": {"points": [[10, 10], [50, 10], [50, 50]], "polygonlabels": ["crack"]}}
            return {"id": number, "data": {"image": "a.png"}, "annotations": [{"result": [result]}]}

        path = tmp_path / "tasks.json"
        path.write_text(json.dumps([task(1, (W, H)), task(2, (W // 2, H // 2))]))
    _refused(path, fmt, tmp_path / "photos", tmp_path / "ds", f"a.png is listed at {W}x{H} px and at {W // 2}x{H // 2} px")
    assert not (tmp_path / "ds").exists()


def test_overwrite_after_an_older_labels_json_and_a_hand_edited_one_keeps_inputs_and_outsiders(tmp_path):
    dataset = tmp_path / "ds"
    for name in ("a.png", "b.png"):
        _photo(dataset / "images", name)
    _photo(tmp_path, "outside.png")
    both = _coco(tmp_path, [], images=[("a.png", W, H), ("b.png", W, H)])
    provenance = import_labels(both, "coco", dataset / "images", dataset, ImportOptions(overwrite=True))
    older = {key: value for key, value in provenance.items() if key != "files_written"}  # as crackseg wrote it before
    (dataset / "labels.json").write_text(json.dumps(older))
    fewer = _coco(tmp_path, [], images=[("a.png", W, H)], name="fewer.json")
    import_labels(fewer, "coco", dataset / "images", dataset, ImportOptions(overwrite=True))
    assert (dataset / "images" / "b.png").is_file() and not (dataset / "masks" / "b.png").exists()
    edited = json.loads((dataset / "labels.json").read_text()) | {"files_written": ["../outside.png", "images/../../outside.png", "masks/.."]}
    (dataset / "labels.json").write_text(json.dumps(edited))
    import_labels(fewer, "coco", dataset / "images", dataset, ImportOptions(overwrite=True))
    assert (tmp_path / "outside.png").is_file() and (dataset / "images" / "b.png").is_file()


# 2. duplicate COCO ids


@pytest.mark.parametrize("duplicate, message", [
    ("image", "image id 1 appears 2 times"),
    ("category", "category id 1 appears 2 times"),
    ("annotation", "annotation id 7 appears 2 times"),
])
def test_coco_duplicate_ids_are_refused_naming_them(tmp_path, duplicate, message):
    photos = tmp_path / "photos"
    _photo(photos, "a.png")
    _photo(photos, "b.png")
    polygon = [[3, 1, 4, 1, 4, 7, 3, 7]]
    document = {
        "images": [{"id": 1, "file_name": "a.png", "width": W, "height": H}, {"id": 2, "file_name": "b.png", "width": W, "height": H}],
        "categories": [{"id": 1, "name": "crack"}, {"id": 2, "name": "joint"}],
        "annotations": [{"id": 7, "image_id": 1, "category_id": 1, "segmentation": polygon},
                        {"id": 8, "image_id": 2, "category_id": 2, "segmentation": polygon}],
    }
    if duplicate == "image":  # b.png's crack would be drawn on a.png, or a.png's on b.png
        document["images"][1]["id"] = document["annotations"][1]["image_id"] = 1
    elif duplicate == "category":  # the joint would be imported as crack
        document["categories"] = [{"id": 1, "name": "joint"}, {"id": 1, "name": "crack"}]
        document["annotations"][1]["category_id"] = 1
    else:
        document["annotations"][1]["id"] = 7
    path = tmp_path / "coco.json"
    path.write_text(json.dumps(document))
    _refused(path, "coco", photos, tmp_path / "out", message)
    assert not (tmp_path / "out").exists()


# 3. far vertices: drawn clipped to the image; pycocotools never sees them


@pytest.fixture
def guarded_polygons(monkeypatch):
    """pycocotools.mask.frPyObjects refusing a polygon vertex outside its canvas (pycocotools 2.0.11 takes all memory or
    crashes with SIGSEGV on a vertex at 1e8)."""
    original = masks_api.frPyObjects

    def guarded(objects, height, width):
        if isinstance(objects, list):
            for polygon in objects:
                xy = np.asarray(polygon, dtype=np.float64).reshape(-1, 2)
                assert np.isfinite(xy).all() and (xy >= 0).all() and (xy <= [width, height]).all(), f"pycocotools given {xy.tolist()}"
        return original(objects, height, width)

    monkeypatch.setattr(masks_api, "frPyObjects", guarded)


@pytest.mark.parametrize("far, by_hand", [
    # (4, 1) -> (5e8, 7) and (5e8, 7) -> (3, 7) cut at x = 10
    ([3, 1, 4, 1, 5e8, 7, 3, 7], [3, 1, 4, 1, 10, 1 + 6 * 6 / (5e8 - 4), 10, 7, 3, 7]),
    # (8, 6) -> (5, -1e9) and (5, -1e9) -> (2, 6) cut at y = 0
    ([2, 6, 8, 6, 5, -1e9], [2, 6, 8, 6, 8 - 3 * 6 / (1e9 + 6), 0, 2 + 3 * 6 / (1e9 + 6), 0]),
    # a vertex far beyond two sides: (6, 1) -> (F, F) leaves through x = 10, (F, F) -> (1, 6) comes back through y = 8
    ([1, 1, 6, 1, 1e12, 1e12, 1, 6], [1, 1, 6, 1, 10, 1 + 4 * (1e12 - 1) / (1e12 - 6), 10, 8, (3e12 - 8) / (1e12 - 6), 8, 1, 6]),
])
def test_a_far_vertex_is_drawn_clipped_to_the_image(tmp_path, guarded_polygons, far, by_hand):
    _photo(tmp_path / "photos")
    provenance = import_labels(_coco(tmp_path, [(1, [far])]), "coco", tmp_path / "photos", tmp_path / "far")
    import_labels(_coco(tmp_path, [(1, [by_hand])], name="by_hand.json"), "coco", tmp_path / "photos", tmp_path / "by_hand")
    drawn, expected = _mask(tmp_path / "far"), _mask(tmp_path / "by_hand")
    assert expected.sum() > 10 and (drawn == expected).all()
    assert provenance["zero_area"] == 0 and provenance["clipped"] == 1


@pytest.mark.parametrize("name", [5, None, ""])
def test_a_coco_image_whose_file_name_is_not_text_is_one_line(tmp_path, name):
    _photo(tmp_path / "photos")
    path = _coco(tmp_path, [(1, [[1, 1, 6, 1, 6, 5]])], images=((name, W, H),))
    _refused(path, "coco", tmp_path / "photos", tmp_path / "out", f"an image named {name!r}; a file names each image's file as text")


def test_polygons_are_the_pixels_pycocotools_draws_on_the_whole_image(tmp_path):
    """Decimal vertices, and vertices up to 15 px outside the image: each polygon's mask is what pycocotools' annToMask
    gives, pixel for pixel."""
    rng = np.random.default_rng(3)
    _photo(tmp_path / "photos", size=(64, 48))
    for number in range(40):
        centre = rng.uniform([0, 0], [64, 48])
        ring = centre + rng.uniform(-15, 15, (int(rng.integers(3, 8)), 2))
        polygon = np.round(ring, int(rng.integers(0, 3))).ravel().tolist()
        path = _coco(tmp_path, [(1, [polygon])], images=(("a.png", 64, 48),))
        import_labels(path, "coco", tmp_path / "photos", tmp_path / "out", ImportOptions(overwrite=True))
        expected = masks_api.decode(masks_api.frPyObjects([polygon], 48, 64))[:, :, 0].astype(bool)
        assert (_mask(tmp_path / "out") == expected).all(), (number, polygon)


# Polygons that a drawing in a box around them, moved by whole pixels, drew a pixel off the tool's whole-image drawing.
COCO_RING = [[137.76, 101.05], [134.27, 101.87], [134.5, 113.45], [124.44, 115.1], [124.84, 147.58], [115.01, 101.92],
             [105.78, 130.62], [105.46, 120.11], [106.51, 110.72], [80.72, 133.96], [53.05, 91.5], [75.45, 53.28], [99.0, 70.2],
             [90.83, 48.57], [96.39, 47.7], [118.53, 44.07], [117.86, 66.68], [130.33, 38.63], [133.6, 54.11], [170.52, 87.95]]
LABELME_RING = [[31.764803574877053, 99.71876893283005], [2.9394969620233766, 53.22301331399987],
                [24.828706608421722, 45.60892989520174], [40.925815183870455, 37.15245727750252],
                [50.93102459106205, 43.10141860019381], [53.48614368092485, 56.83882766388538],
                [41.51115731706523, 63.294241159692376]]


@pytest.mark.parametrize("fmt", ["coco", "labelme"])
def test_a_polygon_is_the_pixels_its_tool_draws_on_the_whole_image_not_in_a_box(tmp_path, fmt):
    from PIL import ImageDraw

    size = (192, 188) if fmt == "coco" else (164, 159)
    _photo(tmp_path / "photos", size=size)
    if fmt == "coco":
        polygon = [value for point in COCO_RING for value in point]
        path = _coco(tmp_path, [(1, [polygon])], images=(("a.png", *size),))
        expected = masks_api.decode(masks_api.frPyObjects([polygon], size[1], size[0]))[:, :, 0].astype(bool)
    else:
        folder = tmp_path / "labelme"
        folder.mkdir()
        (folder / "a.json").write_text(json.dumps({
            "version": "5.5.0", "flags": {}, "imagePath": "../photos/a.png", "imageData": None, "imageWidth": size[0],
            "imageHeight": size[1], "shapes": [{"label": "crack", "points": LABELME_RING, "shape_type": "polygon", "flags": {}}]}))
        path = folder
        picture = Image.new("L", size, 0)
        ImageDraw.Draw(picture).polygon([tuple(point) for point in LABELME_RING], outline=1, fill=1)  # labelme's shape_to_mask
        expected = np.asarray(picture, dtype=bool)
    provenance = import_labels(path, fmt, tmp_path / "photos", tmp_path / "out")
    assert np.argwhere(_mask(tmp_path / "out") != expected).tolist() == []
    assert provenance["zero_area"] == 0


def test_a_far_polyline_vertex_is_drawn_as_near_ones_are(tmp_path):
    """PIL draws a line through a vertex at 1e8 px a pixel off; through one at 1e4 px it is exact."""
    _photo(tmp_path / "photos")
    for name, x in (("far", 1e8), ("near", 1e4)):
        path = _cvat(tmp_path, f'<polyline label="crack" points="1,1;{x},{1 + (x - 1) * 0.25}"/>')
        import_labels(path, "cvat", tmp_path / "photos", tmp_path / name, ImportOptions(line_width=2))
    assert (_mask(tmp_path / "far") == _mask(tmp_path / "near")).all()


# 4. stated sizes checked before allocating; nothing half-written


@pytest.mark.parametrize("box, message", [
    ('rle="10000000000" left="0" top="0" width="100000" height="100000"', "a mask of 100000x100000 px"),  # 9 GiB
    ('rle="400" left="0" top="0" width="20" height="20"', "a mask of 20x20 px"),
    ('rle="4" left="-1" top="0" width="-2" height="-2"', "a mask of -2x-2 px"),
    ('rle="4" left="50" top="0" width="2" height="2"', "at (50, 0)"),
])
def test_a_cvat_mask_larger_than_its_image_is_refused_before_allocating(tmp_path, box, message):
    _photo(tmp_path / "photos")
    path = _cvat(tmp_path, f'<mask label="crack" {box}/>')
    with _address_space(1 << 30):
        err = _refused(path, "cvat", tmp_path / "photos", tmp_path / "out", message)
    assert "a.png" in err and not (tmp_path / "out").exists()


def test_a_cvat_mask_is_checked_against_the_photo_not_only_the_size_the_file_states(tmp_path):
    _photo(tmp_path / "photos")
    path = _cvat(tmp_path, '<mask label="crack" rle="10000000000" left="0" top="0" width="100000" height="100000"/>',
                 size=(100000, 100000))
    with _address_space(1 << 30):
        _refused(path, "cvat", tmp_path / "photos", tmp_path / "out", "is 100000x100000 px there but")


def _compressed(mask: np.ndarray) -> str:
    return masks_api.encode(np.asfortranarray(mask.astype(np.uint8)))["counts"].decode()


@pytest.mark.parametrize("rows", [10, 6])
def test_a_compressed_coco_rle_running_past_or_short_of_its_image_is_one_line_and_writes_nothing(tmp_path, rows):
    _photo(tmp_path / "photos")
    _photo(tmp_path / "photos", "b.png")
    other = np.zeros((rows, W), bool)
    other[rows - 1, :] = True
    rle = {"size": [H, W], "counts": _compressed(other)}  # the runs of a 10 x rows mask, said to be 10x8
    good = [(1, [[3, 1, 4, 1, 4, 7, 3, 7]]), (2, rle)]
    path = _coco(tmp_path, good, images=[("a.png", W, H), ("b.png", W, H)])
    _refused(path, "coco", tmp_path / "photos", tmp_path / "out", f"its RLE counts cover {rows * W} pixels, not 10x8")
    assert not (tmp_path / "out").exists()


def test_an_import_that_fails_while_drawing_leaves_the_previous_dataset_as_it_was(tmp_path, monkeypatch):
    from crackseg.labels import loop

    photos, dataset = tmp_path / "photos", tmp_path / "ds"
    _photo(photos, "a.png")
    _photo(photos, "b.png")
    two = [("a.png", W, H), ("b.png", W, H)]
    import_labels(_coco(tmp_path, [], images=two), "coco", photos, dataset)
    before = {path.relative_to(dataset): path.read_bytes() for path in dataset.rglob("*") if path.is_file()}
    drawn = []

    def failing(*args, **kwargs):
        drawn.append(1)
        if len(drawn) == 2:
            raise InputError("the second photo fails")
        return original(*args, **kwargs)

    original = loop._draw
    monkeypatch.setattr(loop, "_draw", failing)
    with pytest.raises(InputError, match="second photo"):
        import_labels(_coco(tmp_path, [(1, [[3, 1, 4, 1, 4, 7, 3, 7]])], images=two), "coco", photos, dataset, ImportOptions(overwrite=True))
    after = {path.relative_to(dataset): path.read_bytes() for path in dataset.rglob("*") if path.is_file()}
    assert after == before  # no mask replaced, no temp left
    drawn.clear()
    with pytest.raises(InputError, match="second photo"):
        import_labels(_coco(tmp_path, [], images=two), "coco", photos, tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()


# 5. NaN, infinite and far too large coordinates are malformed, named


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e400", "1e308"])
def test_a_coco_polygon_with_a_coordinate_that_is_not_finite_is_refused_naming_it(tmp_path, value):
    _photo(tmp_path / "photos")
    path = tmp_path / "coco.json"
    path.write_text(json.dumps({
        "images": [{"id": 1, "file_name": "a.png", "width": W, "height": H}], "categories": [{"id": 1, "name": "crack"}],
        "annotations": [{"id": 5, "image_id": 1, "category_id": 1, "segmentation": [[3, 1, 4, 1, 4, 7, 3, 7], [3, 1, 4, 1, 0, 0]]}],
    }).replace("[3, 1, 4, 1, 0, 0]", f"[3, 1, 4, 1, {value}, 0]"))
    _refused(path, "coco", tmp_path / "photos", tmp_path / "out", f"{path}: annotation 5 (image a.png): polygon 1")


def test_a_label_studio_point_far_past_the_image_is_refused_before_scaling_to_px_overflows(tmp_path):
    _photo(tmp_path / "photos")
    result = {"id": "r1", "type": "polygonlabels", "from_name": "label", "to_name": "image", "original_width": W,
              "original_height": H, "value": {"points": [[10, 10], [1e300, 10], [50, 50]], "polygonlabels": ["crack"]}}
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps([{"id": 1, "data": {"image": "a.png"}, "annotations": [{"result": [result]}]}]))
    _refused(path, "labelstudio", tmp_path / "photos", tmp_path / "out", "a coordinate of 1e+300, beyond the 1e+15 crackseg draws")


@pytest.mark.parametrize("kind, points", [("polygon", "3,1;4,nan;4,7"), ("polyline", "3,1;inf,1;4,7"), ("polygon", "3,1;4,1;-inf,7")])
def test_a_cvat_shape_with_a_coordinate_that_is_not_finite_is_refused_naming_it(tmp_path, kind, points):
    _photo(tmp_path / "photos")
    path = _cvat(tmp_path, f'<polygon label="crack" points="1,1;2,1;2,2"/><{kind} label="crack" points="{points}"/>')
    _refused(path, "cvat", tmp_path / "photos", tmp_path / "out", f"{path}: image a.png: shape 1 (<{kind}>, label 'crack'): ")


def test_finite_points_reads_pairs_flat_or_nested_and_names_the_shape():
    assert finite_points([1, 2, 3, 4], "here").tolist() == [[1, 2], [3, 4]]
    assert finite_points([[1, 2], [3, 4]], "here").dtype == np.float64
    assert finite_points([], "here").shape == (0, 2)
    for bad, reason in (([1, 2, 3], "3 coordinates"), ([1, float("nan")], "not finite"), ([[1, 2], [float("inf"), 0]], "not finite"),
                        (["a", 1], "not numbers"), ([[1, 2, 3]], "3 coordinates"), ([1e308, 1], "1e\\+308, beyond the 1e\\+15"), ([2e15, 1], "2e\\+15, beyond the 1e\\+15")):
        with pytest.raises(InputError, match=f"^file.json: shape 3: .*{reason}"):
            finite_points(bad, "file.json: shape 3")


@pytest.mark.parametrize("width", ["0", "nan", "11", "3e9", "unknown", "0.2 mm"])
def test_a_cvat_polyline_width_beyond_its_image_or_not_in_px_is_refused(tmp_path, width):
    """PIL draws a line 1e6 px wide wrong, and fails on one 3e9 px wide."""
    _photo(tmp_path / "photos")
    path = _cvat(tmp_path, f'<polyline label="crack" points="1,1;5,5"><attribute name="width">{width}</attribute></polyline>')
    _refused(path, "cvat", tmp_path / "photos", tmp_path / "out", f"shape 0 (<polyline>, label 'crack'): width '{width}'; a width is")


def test_a_cvat_width_attribute_is_read_only_on_the_crack_polylines_drawn(tmp_path):
    """A label's attributes are on all its shapes: a polygon's width (a class, mm) says nothing of its outline, and a
    left-out label's polyline is never drawn."""
    _photo(tmp_path / "photos")
    path = _cvat(tmp_path, '<polygon label="crack" points="1,1;6,1;6,6;1,6"><attribute name="width">unknown</attribute></polygon>'
                           '<polyline label="joint" points="1,8;9,8"><attribute name="width">0</attribute></polyline>')
    provenance = import_labels(path, "cvat", tmp_path / "photos", tmp_path / "out")
    assert provenance["left_out_labels"] == {"joint": 1} and provenance["shapes"] == {"polygon": 1}
    assert _mask(tmp_path / "out")[2:6, 2:6].all()


def test_a_file_with_no_annotated_image_is_refused_and_writes_nothing(tmp_path):
    """An empty COCO file, or a Label Studio export of tasks that only hold the model's predictions, would otherwise
    give an empty dataset and exit status 0."""
    _photo(tmp_path / "photos")
    empty = _coco(tmp_path, [], images=())
    _refused(empty, "coco", tmp_path / "photos", tmp_path / "out", f"{empty}: no annotated image to import; nothing was written")
    drafts = tmp_path / "tasks.json"
    drafts.write_text(json.dumps([{"id": 1, "data": {"image": "a.png"}, "annotations": [],
                                   "predictions": [{"result": [], "model_version": "crackseg"}]}]))
    _refused(drafts, "labelstudio", tmp_path / "photos", tmp_path / "out", "(1 tasks have no submitted annotation")
    assert not (tmp_path / "out").exists()


def test_an_import_interrupted_while_drawing_or_renaming_leaves_no_temp_file_and_runs_again(tmp_path, monkeypatch):
    from crackseg.core import files
    from crackseg.labels import loop

    names = [f"{n}.png" for n in range(4)]
    for name in names:
        _photo(tmp_path / "photos", name)
    coco = _coco(tmp_path, [], images=[(name, W, H) for name in names])
    for owner, name in ((loop, "write_png"), (files.PendingFile, "commit")):  # Ctrl-C at the third mask drawn, or renamed
        real, calls = getattr(owner, name), []

        def interrupted(*args, real=real, calls=calls, **kwargs):
            calls.append(1)
            if len(calls) == 3:
                raise KeyboardInterrupt
            return real(*args, **kwargs)

        with monkeypatch.context() as patch:
            patch.setattr(owner, name, interrupted)
            with pytest.raises(KeyboardInterrupt):
                import_labels(coco, "coco", tmp_path / "photos", tmp_path / "ds", ImportOptions(overwrite=True))
        assert len(calls) == 3 and not [path for path in tmp_path.rglob("*") if files.TEMP_MARK in path.name], name
    import_labels(coco, "coco", tmp_path / "photos", tmp_path / "ds", ImportOptions(overwrite=True))
    assert sorted(path.name for path in (tmp_path / "ds" / "masks").iterdir()) == names
    (tmp_path / "new" / "masks").mkdir(parents=True)  # a killed import's temp, all its first run left: not a dataset yet
    (tmp_path / "new" / "masks" / files.temp_path(tmp_path / "new" / "masks" / "0.png", "0a1b2c3d").name).write_bytes(b"")
    import_labels(coco, "coco", tmp_path / "photos", tmp_path / "new", ImportOptions())
    assert sorted(path.name for path in (tmp_path / "new" / "masks").iterdir()) == names
