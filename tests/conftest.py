"""Shared fixtures: tiny synthetic datasets built in tmp_path, the real CFD data when present."""

from __future__ import annotations

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
