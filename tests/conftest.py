"""Shared fixtures: tiny synthetic datasets built in tmp_path, the real CFD data when present."""

from __future__ import annotations

import functools
import importlib
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from crackseg.synth import write_dataset

CFD_ROOT = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "cfd"


@pytest.fixture(scope="session")
def synth_root(tmp_path_factory) -> Path:
    """Twelve 64 px synthetic images with masks: read-only, shared by the session."""
    root = tmp_path_factory.mktemp("synth")
    write_dataset(root, count=12, size=(64, 64), seed=7)
    return root


@pytest.fixture
def cfd_root() -> Path:
    if not (CFD_ROOT / "images").is_dir():
        pytest.skip("../shared/datasets/cfd is not present")
    return CFD_ROOT


_ISOLATED: list = []  # the one spawned worker, started by the first isolated test


def isolated(test):
    """Run a test in another interpreter (spawned, so nothing of this process is inherited).

    For tests that run ONNX Runtime: after it ran in the test process, that process died of a
    segmentation fault in later, unrelated tests (always after the same mix of earlier tests,
    never in a short run or in a command-line run, which is one process per command). The
    test's fixture values must pickle; assertion errors come back as they are. One worker
    serves every isolated test (its imports are paid once); a worker that dies fails the test
    (BrokenProcessPool) rather than hanging it.
    """

    @functools.wraps(test)
    def run(*args, **kwargs):
        if not _ISOLATED or _ISOLATED[0]._broken:
            _ISOLATED[:] = [ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))]
        return _ISOLATED[0].submit(_call_unwrapped, test.__module__, test.__name__, args, kwargs).result()

    return run


def _call_unwrapped(module: str, name: str, args, kwargs):
    return getattr(importlib.import_module(module), name).__wrapped__(*args, **kwargs)


def dark_pixel_model(folder: Path) -> Path:
    """An OpenVINO model file that calls dark pixels cracks (a 1x1 convolution, threshold 0.5), so
    every mask is known in advance. A model of no registered architecture has no checkpoint form,
    and OpenVINO runs it because ONNX Runtime cannot run in the test process (see isolated)."""
    pytest.importorskip("openvino")
    import torch
    from torch import nn

    from crackseg.export import write_exported
    from crackseg.models import CrackSegModel

    net = nn.Conv2d(3, 1, 1)
    with torch.no_grad():
        net.weight.fill_(-1.0)
        net.bias.zero_()
    model = CrackSegModel(net, "unet", "dark-pixels", size_divisor=1)
    model.threshold = 0.5
    return write_exported(model, "openvino", Path(folder) / "dark.xml")
