"""Several datasets trained as one: their names, their stems kept apart as ``NAME/stem``, one Scan of them all, and a
checksum of each, which a run records to tell later whether a dataset changed."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import PurePosixPath

from crackseg.data.datasets import Scan
from crackseg.data.pairing import Folder, Sample


def dataset_names(roots: list[Folder | None]) -> list[str]:
    """The name each dataset's stems carry when a run trains on several (``NAME/stem``): its folder's name, numbered
    where two share one; a single dataset's stems carry none ("")."""
    if len(roots) < 2:
        return [""]
    names: list[str] = []
    for root in roots:
        base = PurePosixPath(str(root).rstrip("/")).name or "data"
        name, number = base, 1
        while name in names:
            number += 1
            name = f"{base}-{number}"
        names.append(name)
    return names


def named(name: str, stem: str) -> str:
    """A stem as a run on several datasets knows it."""
    return f"{name}/{stem}" if name else stem


def dataset_of(stem: str) -> str:
    """The dataset name a stem carries ("" for a run on one dataset)."""
    return stem.split("/", 1)[0] if "/" in stem else ""


def combine(scans: dict[str, Scan]) -> Scan:
    """Several checked datasets as one, every stem (samples, masks, split files, crack-free photos) :func:`named`."""
    if list(scans) == [""]:
        return scans[""]
    combined = Scan([], [])
    for name, found in scans.items():
        combined.samples += [dataclasses.replace(sample, stem=named(name, sample.stem)) for sample in found.samples]
        combined.problems += found.problems
        combined.masks |= {named(name, stem): info for stem, info in found.masks.items()}
        for split, stems in found.listed.items():
            combined.listed.setdefault(split, []).extend(named(name, stem) for stem in stems)
        combined.negatives += [dataclasses.replace(sample, stem=named(name, sample.stem)) for sample in found.negatives]
    return combined


def dataset_checksum(samples: list[Sample]) -> str:
    """SHA-256 over the samples' stems and the bytes of their photos and masks: what a run trained on."""
    digest = hashlib.sha256()
    for sample in sorted(samples, key=lambda sample: sample.stem):
        digest.update(sample.stem.encode() + b"\0")
        for file in (sample.image, sample.mask):
            digest.update(hashlib.sha256(file.read_bytes()).digest() if file is not None else b"-")
    return digest.hexdigest()
