"""Splits of a dataset: the split files that list stems, the seeded train / val / test draw, and split.json.

A dataset's ``ROOT/{train,val,test}.txt`` (and ``ROOT/negatives.txt``) list stems one per line; :func:`make_split`
takes them where given and otherwise draws by stem, so that the split depends on (seed, stem) alone; a training run
saves what it used as split.json and reads it back on resume. Apart from :mod:`crackseg.data.datasets`, which pairs
and checks the files: a split is a choice of stems, made and kept the same way whatever the files hold.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from crackseg.core.errors import InputError
from crackseg.core.files import decoded_text, write_atomic
from crackseg.core.storage import RemoteFile

if TYPE_CHECKING:
    from crackseg.data.pairing import File

SPLITS = ("train", "val", "test")
CRACK_FREE_ENTRIES = ("negatives", "negative_files")  # split.json: negatives.txt's stems, --negatives' file names


def read_stems(path: File) -> list[str]:
    """The stems a split file lists, one per line (blank lines ignored); empty files and repeats are errors."""
    if isinstance(path, RemoteFile):
        data = path.read_bytes()
    else:
        path = Path(path)
        if not path.is_file():
            raise InputError(f"{path}: no such split file (one stem per line)")
        data = path.read_bytes()
    try:
        text = decoded_text(data)
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text; save it as UTF-8, one stem per line") from None
    stems = [line.strip() for line in text.splitlines() if line.strip()]
    if not stems:
        raise InputError(f"{path}: lists no stems (one per line)")
    repeated = [stem for stem, count in Counter(stems).items() if count > 1]
    if repeated:
        raise InputError(f"{path}: lists {repeated[0]!r} more than once ({len(repeated)} repeated stems); list each stem once")
    return stems


def make_split(
    stems: list[str], val_fraction: float, seed: int, listed: dict[str, list[str]] | None = None
) -> dict[str, list[str]]:
    """Train / val / test stems: from split files where given (usable stems only), else a seeded draw by stem.

    A stem's place in the draw depends only on (seed, stem), so neither listing order nor
    new files reshuffle it. Without ``val.txt``, validation is carved from the training
    stems (``train.txt`` or all stems not in ``test.txt``).
    """
    if not 0.0 <= val_fraction < 1.0:
        raise InputError(f"--val-fraction must be in [0, 1), got {val_fraction}")
    listed = listed or {}
    available = set(stems)
    test = sorted(listed.get("test", []))
    if "val" in listed:
        val = sorted(listed["val"])
        train = sorted(listed.get("train", available - set(val) - set(test)))
    else:
        pool = sorted(listed.get("train", available - set(test)))
        count = round(len(pool) * val_fraction)
        if val_fraction > 0 and len(pool) >= 2:
            count = min(max(count, 1), len(pool) - 1)
        ranked = sorted(pool, key=lambda stem: hashlib.sha256(f"{seed}:{stem}".encode()).hexdigest())
        val = sorted(ranked[:count])
        train = sorted(set(pool) - set(val))
    overlap = (set(train) & set(val)) | (set(train) & set(test)) | (set(val) & set(test))
    if overlap:
        raise InputError(f"split files list {len(overlap)} stems in more than one split: {', '.join(sorted(overlap)[:5])}")
    return {"train": train, "val": val, "test": test}


def save_split(path: Path, split: dict[str, list[str]]) -> None:
    write_atomic(path, json.dumps(split, indent=1) + "\n")


def load_split(path: Path) -> dict[str, list[str]]:
    try:
        split = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise InputError(f"{path}: cannot read the saved split ({error})") from None
    crack_free = {name: list(split[name]) for name in CRACK_FREE_ENTRIES if name in split}
    return {name: list(split.get(name, [])) for name in SPLITS} | crack_free
