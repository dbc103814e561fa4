"""The crack-free pool of a training run (hard negatives): from ``--negatives DIR`` and ``ROOT/negatives.txt``; no torch.

Joints, shadows, paint lines, stains, plant stems and edges look like cracks; photos of them with
nothing to find teach a model to leave them alone. Such a photo needs no mask: its mask is all
background at the photo's displayed size, and a mask given with it must be empty
(:func:`crackseg.data.datasets.check_crack_free`). The pool is the photos that ``negatives.txt``
lists (read with the dataset), then those of ``DIR``, each sorted by stem. ``split.json`` records
it (``negatives``: stems, ``negative_files``: file names in DIR) and a resumed run takes exactly
that pool again, as it takes the saved train / val / test stems.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from crackseg.core.errors import InputError
from crackseg.data.datasets import Scan, check_crack_free
from crackseg.data.images import IMAGE_SUFFIXES
from crackseg.data.pairing import Problem, Sample, files_by_stem


def folder_negatives(folder: Path) -> list[Sample]:
    """The photos of ``folder``, or of ``folder/images``, by stem, with the masks (same stem) of the ``masks`` folder
    beside their ``images`` folder where there is one: such masks must be empty too."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"{folder} is not a folder (--negatives)")
    images = folder / "images" if (folder / "images").is_dir() else folder
    beside = images.parent / "masks" if images.name == "images" else None
    masks = files_by_stem(beside) if beside is not None and beside.is_dir() else {}
    photos = files_by_stem(images)
    if not photos:
        raise InputError(f"{images} holds no photos ({' '.join(IMAGE_SUFFIXES)}) (--negatives)")
    return [Sample(stem, path, masks.get(stem)) for stem, path in sorted(photos.items())]


def negative_pool(
    found: Scan, folder: Path | None, saved: dict[str, list[str]] | None = None
) -> tuple[list[Sample], dict[str, list[str]], list[Problem]]:
    """The checked pool, its ``split.json`` entries (none when empty), and the problems of ``folder``'s photos.

    ``saved`` (a resumed run's split) fixes the pool: photos added since are left out, and a saved
    one that is gone or unreadable is an error, as a lost training image is.
    """
    listed = found.negatives
    pool = folder_negatives(folder) if folder else []
    kept = None if saved is None else set(saved.get("negative_files", []))
    _check_apart([sample for sample in pool if kept is None or sample.image.name in kept], found.samples + found.negatives, folder)
    files, problems = check_crack_free(pool) if pool else ([], [])
    if saved is not None:
        listed = _as_saved(listed, saved.get("negatives", []), lambda sample: sample.stem)
        files = _as_saved(files, saved.get("negative_files", []), lambda sample: sample.image.name)
        problems = []  # the photos that have them are not in the saved pool
    entries = {"negatives": [sample.stem for sample in listed], "negative_files": [sample.image.name for sample in files]}
    return listed + files, {name: names for name, names in entries.items() if names}, problems


def _check_apart(pool: list[Sample], dataset: list[Sample], folder: Path) -> None:
    """Refuse a pool holding photos of the dataset itself (the same file, or a copy of its bytes): they have cracks, or
    are the dataset's own crack-free photos, and would be trained as background or twice."""
    by_size: dict[int, list[Path]] = {}
    for sample in dataset:
        by_size.setdefault(sample.image.stat().st_size, []).append(sample.image)
    digests: dict[Path, bytes] = {}

    def digest(path: Path) -> bytes:
        if path not in digests:
            digests[path] = hashlib.sha256(path.read_bytes()).digest()
        return digests[path]

    shared = []
    for sample in pool:
        same = [path for path in by_size.get(sample.image.stat().st_size, [])
                if path.resolve() == sample.image.resolve() or digest(path) == digest(sample.image)]
        if same:
            shared.append((sample.image, same[0]))
    if shared:
        negative, photo = shared[0]
        raise InputError(f"--negatives {folder}: {len(shared)} of its {len(pool)} photos are photos of the training data "
                         f"(e.g. {negative} is {photo}); negatives are crack-free photos from outside the dataset")


def _as_saved(pool: list[Sample], names: list[str], name_of) -> list[Sample]:
    by_name = {name_of(sample): sample for sample in pool}
    lost = [name for name in names if name not in by_name]
    if lost:
        raise InputError(f"{len(lost)} crack-free photos of the saved split are no longer usable (e.g. {lost[0]}); "
                         "see the problems with crackseg inspect")
    return [by_name[name] for name in names]
