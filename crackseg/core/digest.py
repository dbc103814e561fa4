"""A model file's identity: what tells two models apart whatever their files are called, without loading them."""

from __future__ import annotations

import hashlib
from pathlib import Path


def model_file_digest(path: Path) -> str:
    """SHA-256 over what a model file is made of: the file (an OpenVINO .xml with its .bin), or each file of a
    safetensors folder with its name, in name order. Two runs with one digest ran the same model, whatever its name."""
    path = Path(path)
    if path.is_dir():
        files = {file.relative_to(path).as_posix(): file for file in sorted(path.rglob("*")) if file.is_file()}
    else:
        weights = path.with_suffix(".bin")
        files = {"": path} | ({".bin": weights} if path.suffix.lower() == ".xml" and weights.is_file() else {})
    digest = hashlib.sha256()
    for name, file in files.items():
        digest.update(name.encode() + b"\n")
        with open(file, "rb") as stream:
            for chunk in iter(lambda: stream.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()
