"""CVAT auto-annotation: the function module ``cvat-cli`` runs against any CVAT server, self-hosted included.

    cvat-cli --server-host URL --auth USER task auto-annotate TASK \\
        --function-module crackseg.integrations.cvat -p checkpoint=str:best.pt [-p threshold=float:0.4]

One label, ``crack``, of type mask: a mask per 8-connected crack, as ``crackseg labels export --format cvat --rle``
draws it, or, when CVAT asks for polygons (``--conv-mask-to-poly``), that export's polygons. ``create`` loads the
model once per run; each frame's mask is predict's mask of that image (:mod:`crackseg.prediction.session`).
CVAT's ``--conf-threshold``, when given, is the pixel threshold (a crack pixel's probability is its confidence).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from crackseg.core.errors import InputError, require
from crackseg.labels.formats.cvat import cvat_rle_encode
from crackseg.labels.formats.outlines import CRACK, crack_components, edge_polygon
from crackseg.prediction.options import InferenceOptions

# InferenceOptions fields that a -p parameter may set, with the types cvat-cli's -p NAME=TYPE:VALUE gives them.
INFERENCE_PARAMETERS = {"tile": int, "overlap": int, "batch_size": int, "tta": str, "device": str, "amp": str, "backend": str}
_LABEL_ID = 0


def create(checkpoint: str, threshold: float | None = None, **inference) -> CrackDetector:
    """The detection function cvat-cli builds from ``-p`` parameters: ``checkpoint`` (a model file crackseg predicts
    with), ``threshold`` (default: the model's) and any of ``INFERENCE_PARAMETERS``.

    Every parameter is checked for its type (cvat-cli's ``NAME=TYPE:VALUE``; a bool is not a number) and its range
    before the model loads; a wrong one raises CVAT's ``BadFunctionError`` (a crackseg ``InputError`` as well).
    """
    unknown = sorted(set(inference) - set(INFERENCE_PARAMETERS))
    if unknown:
        raise _refused(f"unknown parameter {', '.join(unknown)}; crackseg's CVAT function takes checkpoint, threshold, "
                       f"{', '.join(INFERENCE_PARAMETERS)}")
    given = {"checkpoint": checkpoint, **({"threshold": threshold} if threshold is not None else {}), **inference}
    for name, value in given.items():
        kind = {"checkpoint": str, "threshold": float, **INFERENCE_PARAMETERS}[name]
        wrong = isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else kind)
        if wrong:
            raise _refused(f"parameter {name} must be given as {name}={kind.__name__}:VALUE, got {type(value).__name__} {value!r}")
    if threshold is not None and not (math.isfinite(threshold) and 0 <= threshold <= 1):
        raise _refused(f"parameter threshold must be in [0, 1], got {threshold!r}")
    try:
        options = InferenceOptions(**inference)
    except InputError as error:  # its message names the flag (--batch-size); a -p parameter is named batch_size
        raise _refused("parameter " + re.sub(r"^--([a-z-]+)", lambda flag: flag.group(1).replace("-", "_"), str(error))) from None
    return CrackDetector(Path(checkpoint), threshold, options)


def _refused(message: str) -> InputError:
    """A parameter error that is both crackseg's InputError and CVAT's BadFunctionError (what cvat-cli reports as the
    function's fault)."""
    cvataa = require("cvat_sdk.auto_annotation", "cvat", "the CVAT auto-annotation function")
    return type("ParameterError", (InputError, cvataa.BadFunctionError), {})(message)


class CrackDetector:
    """cvat-sdk's detection function interface: ``spec`` and ``detect(context, image)``."""

    def __init__(self, checkpoint: Path, threshold: float | None, inference: InferenceOptions):
        self._cvataa = require("cvat_sdk.auto_annotation", "cvat", "the CVAT auto-annotation function")
        from crackseg.prediction.session import PredictionSession  # loads torch: only once CVAT runs the function

        self._session = PredictionSession(checkpoint, inference, threshold)
        self.spec = self._cvataa.DetectionFunctionSpec(labels=[self._cvataa.label_spec(CRACK, _LABEL_ID, type="mask")])

    def detect(self, context, image) -> list:
        """The cracks of one frame, as masks or, when ``context.conv_mask_to_poly``, as polygons."""
        probabilities = self._session.probabilities(image)
        threshold = self._session.threshold if context.conf_threshold is None else context.conf_threshold
        return crack_shapes(self._cvataa, probabilities >= threshold, context.conv_mask_to_poly)


def crack_shapes(cvataa, mask: np.ndarray, polygons: bool) -> list:
    """A shape per crack: CVAT's mask points (runs of the crack's box, then its inclusive corners) or a polygon."""
    shapes = []
    for component, (left, top) in crack_components(mask):
        if polygons:
            shapes.append(cvataa.polygon(_LABEL_ID, edge_polygon(component, (left, top)).ravel().tolist()))
        else:
            height, width = component.shape
            box = [left, top, left + width - 1, top + height - 1]
            shapes.append(cvataa.mask(_LABEL_ID, cvat_rle_encode(component) + box))
    return shapes
