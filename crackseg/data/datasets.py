"""Crack datasets on disk: validation, crack pixel weight; no torch (pairing: :mod:`crackseg.data.pairing`, splits:
:mod:`crackseg.data.splits`).

A dataset is a folder of photos and a folder of masks whose files share stems
(``images/001.jpg`` <-> ``masks/001.png``). :func:`scan` decodes every file once before training (in parallel threads;
JPEGs at 1/8 scale, which still decodes their whole stream, so truncation is caught)
and reads the crack pixel counts that :func:`crack_pixel_weight` needs.

A dataset in object storage (``s3://bucket/prefix/`` with ``images/``, ``masks/`` and the split files below it) is
listed and read through :mod:`crackseg.core.storage`, file by file, and paired, checked and decoded as on disk.

Crack-free photos (hard negatives) that ``ROOT/negatives.txt`` lists need no mask and stay out
of the pairs and the split; :mod:`crackseg.data.negatives` makes them a training pool.
"""

from __future__ import annotations

import math
import os
import unicodedata
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from crackseg.core.errors import InputError
from crackseg.core.urls import display_url, is_url
from crackseg.data.images import (
    CRACK_THRESHOLD,
    DECODE_ERRORS,
    check_photo_pixels,
    crack_mask,
    describe_error,
    displayed_size,
    mask_levels,
    open_picture,
    orientation,
    stored_size,
)
from crackseg.data.pairing import File, Folder, Problem, Sample, files_in, find_samples
from crackseg.data.splits import SPLITS, read_stems

NEGATIVES_FILE = "negatives.txt"  # stems of crack-free photos in ROOT/images/, masks optional (and empty)


@dataclass(frozen=True)
class MaskInfo:
    height: int
    width: int
    crack_pixels: int
    binary: bool  # only 0 and 255 (or 0 and 1) before thresholding


@dataclass
class Scan:
    """What :func:`scan` found: usable samples, the problems, and per-stem mask facts."""

    samples: list[Sample]
    problems: list[Problem]
    masks: dict[str, MaskInfo] = field(default_factory=dict)
    listed: dict[str, list[str]] = field(default_factory=dict)  # split files, usable stems only
    negatives: list[Sample] = field(default_factory=list)  # usable crack-free photos that negatives.txt lists

    @property
    def non_binary_masks(self) -> int:
        return sum(not info.binary for info in self.masks.values())

    @property
    def empty_masks(self) -> int:
        return sum(info.crack_pixels == 0 for info in self.masks.values())


def resolve_folders(root: Folder | None, images: Path | None, masks: Path | None) -> tuple[Folder, Folder]:
    """The image and mask folders: ``ROOT/images`` and ``ROOT/masks`` unless given explicitly."""
    if root is None and (images is None or masks is None):
        raise InputError("give a dataset ROOT, or both --images DIR and --masks DIR")
    if root is not None and is_url(str(root)):
        return _remote_folder(str(root), "images"), _remote_folder(str(root), "masks")
    if root is not None and not Path(root).is_dir():
        raise InputError(f"{root} is not a folder (dataset root)")
    return Path(images or Path(root) / "images"), Path(masks or Path(root) / "masks")


def _remote_folder(root: str, name: str) -> str:
    """``ROOT/name`` of a dataset in object storage; only s3:// can be listed, and credentials belong in the environment."""
    if not root.startswith("s3://"):
        raise InputError(f"{display_url(root)}: a dataset in object storage is read from s3://bucket/prefix/ (http(s):// cannot be listed)")
    if display_url(root) != root:
        raise InputError(f"{display_url(root)}: give credentials through AWS_PROFILE, AWS_ACCESS_KEY_ID or ~/.aws, not in the URL")
    return f"{root.rstrip('/')}/{name}"


def decoding_threads() -> int:
    """Threads that decode images side by side when the caller names no count: one per core, at most 16."""
    return min(16, os.cpu_count() or 1)


def scan(samples: list[Sample], workers: int | None = None) -> Scan:
    """Decode every image and mask completely and check that their sizes agree."""
    with ThreadPoolExecutor(workers or decoding_threads()) as pool:
        results = list(pool.map(_check_sample, samples))
    result = Scan([], [])
    for sample, (problems, info) in zip(samples, results):
        if problems:
            result.problems.extend(problems)
        else:
            result.samples.append(sample)
            result.masks[sample.stem] = info
    return result


def usable_samples(found: Scan, policy: str) -> list[Sample]:
    """Apply ``--on-bad-sample``: ``error`` raises, listing every problem; ``skip`` keeps the rest.

    No sample is ever replaced by another; under ``skip`` the caller records ``found.problems``.
    """
    if policy not in ("error", "skip"):
        raise InputError(f"--on-bad-sample must be error or skip, got {policy!r}")
    if found.problems and policy == "error":
        advice = "fix them, or pass --on-bad-sample skip" if found.samples else "nothing usable is left to train on"
        if len(found.problems) == 1:
            raise InputError(f"{found.problems[0]} ({advice.replace('them', 'it')})")
        listing = "\n".join(f"  {problem}" for problem in found.problems)
        raise InputError(f"{len(found.problems)} problems in the dataset ({advice}):\n{listing}")
    return found.samples


def check_crack_free(samples: list[Sample], workers: int | None = None) -> tuple[list[Sample], list[Problem]]:
    """Decode crack-free photos (and their masks, where given) completely: the usable ones, and the problems.

    Such a photo needs no mask, being all background; a mask given with it must be empty. Crack
    pixels in it are a labelling mistake: an InputError naming the mask, never trained on as background.
    """
    with ThreadPoolExecutor(workers or decoding_threads()) as pool:
        problems = list(pool.map(_check_crack_free, samples))
    return [s for s, problem in zip(samples, problems) if problem is None], [p for p in problems if p is not None]


def _check_crack_free(sample: Sample) -> Problem | None:
    try:
        decoded = _decode_image(sample.image)
    except DECODE_ERRORS as error:
        return Problem(sample.image, describe_error(error))
    if sample.mask is None:
        return None
    try:
        mask = crack_mask(sample.mask)
    except DECODE_ERRORS as error:
        return Problem(sample.mask, describe_error(error))
    mismatch = _size_problem(sample.mask, (mask.shape[1], mask.shape[0]), *decoded)
    if mismatch is not None:
        return mismatch
    cracked = int(mask.sum())
    if cracked:
        raise InputError(f"{sample.mask}: {cracked} crack pixels in the mask of a crack-free image (a negative); "
                         f"fix the mask, or take {sample.image.name} out of the negatives")
    return None


def _decode_image(path: File) -> tuple[tuple[int, int], tuple[int, int], int]:
    """Decode ``path`` completely (a JPEG at 1/8 scale): its stored size, displayed size and EXIF orientation."""
    with open_picture(path) as image:
        stored, shown, turn = stored_size(image), displayed_size(image), orientation(image)
        if image.format == "JPEG":
            image.draft(image.mode, (max(1, image.width // 8), max(1, image.height // 8)))
        image.load()
        check_photo_pixels(image)
    return stored, shown, turn


def _size_problem(mask_path: File, mask_size: tuple[int, int], stored: tuple[int, int], shown: tuple[int, int],
                  turn: int) -> Problem | None:
    """A mask whose (width, height) is not its image's as shown, naming the EXIF tag where that explains it."""
    if shown == mask_size:
        return None
    message = f"mask is {mask_size[0]}x{mask_size[1]} px but its image is {shown[0]}x{shown[1]}"
    if stored == mask_size:
        message += (f" as shown: the image's EXIF orientation tag ({turn}) turns its stored {stored[0]}x{stored[1]} pixels; "
                    "trace the mask on the photo as viewers show it, or remove the tag")
    return Problem(mask_path, message)


def _check_sample(sample: Sample) -> tuple[list[Problem], MaskInfo | None]:
    problems = []
    try:
        stored, shown, turn = _decode_image(sample.image)
    except DECODE_ERRORS as error:
        problems.append(Problem(sample.image, describe_error(error)))
        shown = None
    try:
        mask = mask_levels(sample.mask)
    except DECODE_ERRORS as error:
        problems.append(Problem(sample.mask, describe_error(error)))
        return problems, None
    mismatch = _size_problem(sample.mask, (mask.shape[1], mask.shape[0]), stored, shown, turn) if shown is not None else None
    if mismatch is not None:
        problems.append(mismatch)
    if problems:
        return problems, None
    values = np.bincount(mask.ravel(), minlength=256)
    binary = set(np.flatnonzero(values).tolist()) <= {0, 255}
    return [], MaskInfo(mask.shape[0], mask.shape[1], int(values[CRACK_THRESHOLD + 1 :].sum()), binary)


def open_dataset(
    root: Folder | None,
    images: Path | None = None,
    masks: Path | None = None,
    mask_pattern: str = "{stem}",
    workers: int | None = None,
) -> Scan:
    """Pair, decode and check a whole dataset, and read its split files (``ROOT/{train,val,test}.txt``)
    and the crack-free photos that ``ROOT/negatives.txt`` lists (kept out of the split)."""
    image_dir, mask_dir = resolve_folders(root, images, masks)
    root_files = _listing_files(root) if root is not None else {}
    negatives_file = root_files.get(NEGATIVES_FILE)
    crack_free = set(read_stems(negatives_file)) if negatives_file is not None else set()
    found_files, problems = find_samples(image_dir, mask_dir, mask_pattern, crack_free)
    samples = [sample for sample in found_files if sample.stem not in crack_free]
    found = scan(samples, workers)
    found.problems[:0] = problems
    if not samples:
        found.problems.append(Problem(image_dir, f"no image/mask pairs (images in {image_dir}, masks in {mask_dir})"))
    negatives = [sample for sample in found_files if sample.stem in crack_free]
    found.negatives, unusable = check_crack_free(negatives, workers)
    missing = sorted(crack_free - {sample.stem for sample in negatives})
    found.problems += [Problem(negatives_file, f"lists {stem!r}, which has no image in {image_dir}") for stem in missing] + unusable
    paired = {sample.stem for sample in samples}
    usable = {sample.stem for sample in found.samples}
    for name in SPLITS:
        path = root_files.get(f"{name}.txt")
        if path is None:
            continue
        stems = read_stems(path)
        if both := sorted(crack_free & set(stems)):
            raise InputError(f"{path}: lists {both[0]!r}, which {NEGATIVES_FILE} lists as crack-free ({len(both)} such stems); "
                             "list each stem in one split only")
        unmatched = [stem for stem in stems if stem not in paired]
        _refuse_other_forms(path, unmatched, paired, mask_pattern)
        found.problems += [Problem(path, f"lists {stem!r}, which has no image/mask pair") for stem in unmatched]
        found.listed[name] = [stem for stem in stems if stem in usable]
    return found


def _listing_files(root: Folder) -> dict[str, File]:
    """ROOT's split files and negatives.txt by name. One that is there but cannot be read (a broken link, a folder) or
    is named in another case (``Test.txt``) is an error: passed over, the photos it lists would be drawn into training."""
    named = {NEGATIVES_FILE, *(f"{name}.txt" for name in SPLITS)}
    if is_url(str(root)):
        entries = files_in(root)
    else:
        entries = sorted(Path(root).iterdir()) if Path(root).is_dir() else []
    found = {}
    for entry in entries:
        if entry.name in named:
            if isinstance(entry, Path) and not entry.is_file():
                raise InputError(f"{entry}: not a file ({'a folder' if entry.is_dir() else 'a broken link'}); "
                                 "a split file lists stems, one per line")
            found[entry.name] = entry
        elif entry.name.casefold() in named:
            raise InputError(f"{entry}: crackseg reads it only as {entry.name.casefold()}, in lower case; rename it")
    return found


def _refuse_other_forms(path: File, unmatched: list[str], paired: set[str], mask_pattern: str) -> None:
    """A split file's line that names a pair in another form (its file name, its mask's name, a path, another case or
    Unicode form) is an error whatever --on-bad-sample says: skipped, a photo meant for test.txt would be drawn into
    training."""
    def form(text: str) -> str:
        return unicodedata.normalize("NFC", text).casefold()

    forms = {form(mask_pattern.replace("{stem}", stem, 1)): stem for stem in paired} | {form(stem): stem for stem in paired}
    for line in unmatched:
        name = line.replace("\\", "/").rsplit("/", 1)[-1]
        base = name.rsplit(".", 1)[0] if "." in name else name
        meant = forms.get(form(name)) or forms.get(form(base))
        if meant is not None:
            raise InputError(f"{path}: lists {line!r}, the pair {meant!r} in another form; list stems as the files are named, "
                             "without folder or extension")


def crack_pixel_weight(masks: list[MaskInfo]) -> float:
    """The ``auto`` crack pixel weight: background pixels / crack pixels over ``masks`` (``sqrt`` takes its root)."""
    crack = sum(info.crack_pixels for info in masks)
    total = sum(info.height * info.width for info in masks)
    if crack == 0:
        raise InputError("the training masks hold no crack pixels: nothing to learn (check the mask files)")
    return (total - crack) / crack


def inspection_report(found: Scan, split: dict[str, list[str]], val_fraction: float) -> str:
    """The text ``crackseg inspect`` prints: counts, sizes, crack fraction, crack weight, problems."""
    infos = found.masks
    sizes = Counter(f"{info.width}x{info.height}" for info in infos.values())
    crack = sum(info.crack_pixels for info in infos.values())
    total = sum(info.height * info.width for info in infos.values())
    train = [infos[stem] for stem in split["train"]]
    source = ", ".join(f"{name}.txt" for name in found.listed) if found.listed else f"seeded, val fraction {val_fraction}"
    lines = [
        f"pairs: {len(found.samples)} usable: " + ", ".join(f"{name} {len(stems)}" for name, stems in split.items()) + f" (split: {source})",
        "sizes: " + ", ".join(f"{size} px: {count}" for size, count in sizes.most_common(8)) + (" ..." if len(sizes) > 8 else ""),
        f"crack pixels: {100 * crack / max(total, 1):.2f}% of all pixels; {found.empty_masks} masks without cracks",
    ]
    if found.negatives:
        lines.append(f"crack-free: {len(found.negatives)} photos listed in {NEGATIVES_FILE}, kept out of the split "
                     "(training mixes them in, --negative-share)")
    if found.non_binary_masks:
        lines.append(f"warning: {found.non_binary_masks} masks are not pure 0/255 (lossy JPEG?); values above {CRACK_THRESHOLD} count as crack")
    if any(info.crack_pixels for info in train):
        ratio = crack_pixel_weight(train)
        lines.append(f"crack pixel weight: {math.sqrt(ratio):.2f} (--pos-weight sqrt, the default); {ratio:.2f} (auto)")
    else:
        lines.append("crack pixel weight: none, the training masks hold no crack pixels")
    lines += [f"problem: {problem}" for problem in found.problems]
    lines.append(f"{len(found.problems)} problems found")
    return "\n".join(lines)
