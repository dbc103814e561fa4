"""The CVAT function: what cvat-sdk's own validation accepts, and the mask CVAT would store is predict's mask."""

from __future__ import annotations

import logging
from pathlib import Path
from xml.etree import ElementTree

import numpy as np
import pytest
from conftest import pavement, predict_cli
from PIL import Image

from crackseg.core.errors import InputError
from crackseg.labels.formats.cvat import cvat_document
from crackseg.prediction.session import PredictionSession

pytest.importorskip("cvat_sdk")
from cvat_sdk import models  # noqa: E402
from cvat_sdk.auto_annotation.driver import _AnnotationMapper, _DetectionFunctionContextImpl  # noqa: E402
from cvat_sdk.masks import decode_mask  # noqa: E402

from crackseg.integrations import cvat  # noqa: E402

TASK_LABEL_ID = 41  # the task's own id for "crack", which the driver maps the function's label to


@pytest.fixture(scope="module")
def photo(checkpoint, tmp_path_factory) -> tuple[Path, Path, float]:
    """(checkpoint, photo, a threshold that marks about half the photo)."""
    folder = tmp_path_factory.mktemp("cvat")
    path = folder / "wall.png"
    Image.fromarray(pavement(80, 128, seed=5).transpose(1, 2, 0)).save(path)
    threshold = float(np.quantile(PredictionSession(checkpoint).probabilities(Image.open(path)), 0.7))
    return checkpoint, path, threshold


def _detected(function, image: Image.Image, polygons: bool, conf_threshold: float | None = None) -> list:
    """The shapes as cvat-sdk's driver checks and remaps them before uploading them to a task."""
    task_labels = [models.Label(id=TASK_LABEL_ID, name="crack", type="any", attributes=[], sublabels=[], _check_type=False)]
    mapper = _AnnotationMapper(logging.getLogger("test"), function.spec.labels, task_labels, allow_unmatched_labels=False,
                               conv_mask_to_poly=polygons)
    context = _DetectionFunctionContextImpl(frame_name="wall.png", conf_threshold=conf_threshold, conv_mask_to_poly=polygons)
    tags, shapes = mapper.validate_and_remap(function.detect(context, image), ds_frame=3)
    assert tags == [] and all(shape.label_id == TASK_LABEL_ID and shape.frame == 3 for shape in shapes)
    return shapes


def test_the_stored_mask_is_predicts_mask(tmp_path, photo):
    checkpoint, path, threshold = photo
    assert predict_cli("--checkpoint", checkpoint, path, "--out", tmp_path / "out", "--threshold", threshold) == 0
    expected = np.asarray(Image.open(tmp_path / "out" / "masks" / "wall.png")) > 0
    function = cvat.create(checkpoint=str(checkpoint), threshold=threshold)
    shapes = _detected(function, Image.open(path), polygons=False)
    assert len(shapes) > 1 and {shape.type.value for shape in shapes} == {"mask"}
    stored = [decode_mask(shape.points, image_width=128, image_height=80) for shape in shapes]
    assert np.array_equal(np.logical_or.reduce(stored), expected)
    assert sum(part.sum() for part in stored) == expected.sum()  # one mask per crack, none overlapping


def test_polygons_when_cvat_asks_are_labels_exports_polygons(photo):
    checkpoint, path, threshold = photo
    function = cvat.create(checkpoint=str(checkpoint), threshold=threshold)
    shapes = _detected(function, Image.open(path), polygons=True)
    mask = PredictionSession(checkpoint, threshold=threshold).mask(Image.open(path))
    exported = ElementTree.fromstring(cvat_document([("wall.png", mask)], rle=False)).findall("image/polygon")
    assert {shape.type.value for shape in shapes} == {"polygon"} and len(shapes) == len(exported)
    for shape, polygon in zip(shapes, exported):
        points = np.array([[float(v) for v in pair.split(",")] for pair in polygon.get("points").split(";")])
        assert np.allclose(np.reshape(shape.points, (-1, 2)), points, atol=0.005)


def test_cvats_confidence_threshold_is_the_pixel_threshold(photo):
    checkpoint, path, threshold = photo
    function = cvat.create(checkpoint=str(checkpoint), tile=256, tta="flip")
    strict = _detected(function, Image.open(path), polygons=False, conf_threshold=1.0)
    loose = _detected(function, Image.open(path), polygons=False, conf_threshold=0.0)
    assert strict == [] and len(loose) == 1 and decode_mask(loose[0].points, image_width=128, image_height=80).all()


def test_parameters_are_checked_before_the_model_loads(photo):
    checkpoint = str(photo[0])
    with pytest.raises(InputError, match="unknown parameter treshold"):
        cvat.create(checkpoint=checkpoint, treshold=0.3)
    with pytest.raises(InputError, match="tile=int:VALUE"):
        cvat.create(checkpoint=checkpoint, tile="512")
    with pytest.raises(InputError, match="no such file|not found|missing"):
        cvat.create(checkpoint=checkpoint + ".missing")


@pytest.mark.parametrize("parameters, message", [
    ({"threshold": "0.4"}, "threshold must be given as threshold=float:VALUE, got str '0.4'"),
    ({"threshold": True}, "threshold must be given as threshold=float:VALUE, got bool True"),
    ({"threshold": 1.5}, "threshold must be in [0, 1], got 1.5"),
    ({"threshold": float("nan")}, "threshold must be in [0, 1], got nan"),
    ({"tile": True}, "tile must be given as tile=int:VALUE, got bool True"),
    ({"tile": 0}, "tile must be >= 1, got 0"),
    ({"tile": 256, "overlap": 256}, "(256 px) must be smaller than --tile"),
    ({"batch_size": -1}, "batch_size must be >= 1, got -1"),
    ({"tta": "all"}, "tta must be one of none, flip, d4"),
    ({"checkpoint": 3}, "checkpoint must be given as checkpoint=str:VALUE, got int 3"),
    ({"overlap": -1}, "overlap must be >= 0, got -1"),
    ({"device": "gpu9"}, "device must be auto, cpu, cuda or cuda:N (crackseg runs on cpu or cuda), got 'gpu9'"),
    ({"device": True}, "device must be given as device=str:VALUE, got bool True"),
    ({"amp": "fp8"}, "amp must be one of auto, bf16, fp16, off, got 'fp8'"),
    ({"backend": "tensorrt"}, "backend must be one of auto, torch, onnxruntime, openvino, got 'tensorrt'"),
    ({"batch_size": 2.5}, "batch_size must be given as batch_size=int:VALUE, got float 2.5"),
])
def test_every_parameter_is_checked_for_type_and_range_with_cvats_error(photo, parameters, message):
    from cvat_sdk.auto_annotation import BadFunctionError

    with pytest.raises(BadFunctionError) as raised:
        cvat.create(**{"checkpoint": str(photo[0]), **parameters})
    assert message in str(raised.value) and isinstance(raised.value, InputError)
