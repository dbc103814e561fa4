"""A model loaded once for callers that predict one picture at a time: annotation tools and servers.

The mask is predict's: the same decoding (:func:`crackseg.data.images.picture_pixels`), the same
:class:`crackseg.model.inference.Predictor` under the same :class:`crackseg.model.options.InferenceOptions`,
and the same threshold rule (``>=`` the model's threshold unless one is given).
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from crackseg.model.options import InferenceOptions
from crackseg.core.errors import InputError
from crackseg.data.images import picture_pixels
from crackseg.model.inference import Predictor
from crackseg.model.runtimes import choose_runtime, load_runtime


class PredictionSession:
    """One loaded model; :meth:`mask` may be called from several threads (one picture runs at a time)."""

    def __init__(self, checkpoint: Path, inference: InferenceOptions = InferenceOptions(), threshold: float | None = None):
        if threshold is not None and not 0.0 <= threshold <= 1.0:
            raise InputError(f"threshold must be in [0, 1], got {threshold:g}")
        runtime = load_runtime(choose_runtime(Path(checkpoint), inference))
        self.threshold = runtime.threshold if threshold is None else threshold
        self._predictor = Predictor(runtime.model, runtime.device, inference, runtime.amp_dtype)
        self._lock = threading.Lock()

    def probabilities(self, picture: Image.Image | np.ndarray) -> np.ndarray:
        """(H, W) float32 crack probabilities of a PIL image, or of (H, W, 3) uint8 RGB pixels."""
        pixels = picture_pixels(picture) if isinstance(picture, Image.Image) else np.asarray(picture)
        if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
            raise InputError(f"pixels must be (height, width, 3) uint8 RGB, got {pixels.dtype} of shape {pixels.shape}")
        image = torch.from_numpy(np.array(pixels, copy=True)).permute(2, 0, 1)  # torch refuses read-only arrays
        with self._lock:
            ((_, prob),) = self._predictor.probabilities([(0, image)])
        return prob.numpy()

    def mask(self, picture: Image.Image | np.ndarray) -> np.ndarray:
        """(H, W) bool crack mask, as predict writes it for the same picture."""
        return self.probabilities(picture) >= self.threshold
