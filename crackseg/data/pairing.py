"""Pairing photos with masks by file stem, never by position in a listing, in a local folder or below an s3:// prefix.

Two files with one stem, a mask without a photo, a photo without a mask, images in subfolders that pairing does not
read: each is a :class:`Problem` naming the file, never a pair guessed or a file left out in silence.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from crackseg.core.errors import InputError
from crackseg.core.storage import RemoteFile, list_files, list_keys
from crackseg.core.urls import is_url
from crackseg.data.images import IMAGE_SUFFIXES, OTHER_PHOTO_SUFFIXES
from crackseg.data.inputs import paths_below

Folder = Path | str  # a local folder, or an s3:// prefix as text (Path would fold s3:// into s3:/)
File = Path | RemoteFile


@dataclass(frozen=True)
class Sample:
    stem: str
    image: File
    mask: File | None  # None: a crack-free photo without a mask file (all background)


@dataclass(frozen=True)
class Problem:
    path: File | Folder
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def files_in(folder: Folder) -> list[File]:
    """The files right in a local folder, or right below an s3:// prefix (a missing one is a StorageError naming it), sorted."""
    if is_url(str(folder)):
        return [file for file, _ in list_files(str(folder).rstrip("/") + "/", (*IMAGE_SUFFIXES, *OTHER_PHOTO_SUFFIXES, ".txt"))]
    return sorted(path for path in Path(folder).iterdir() if path.is_file())


def find_samples(
    images: Folder, masks: Folder, mask_pattern: str = "{stem}", crack_free: Collection[str] = ()
) -> tuple[list[Sample], list[Problem]]:
    """Pair every image with the mask named ``mask_pattern`` with its stem for ``{stem}``, plus any image suffix.

    Returns the pairs sorted by stem, and one problem per unmatched file. Two files with
    one stem in a folder (``001.png`` and ``001.bmp``) are a problem naming both, and that
    stem is not paired at all: crackseg never guesses which one was meant. Images whose stem
    is in ``crack_free`` need no mask: they follow the pairs, with their mask file or None.
    """
    for folder, flag in ((images, "--images"), (masks, "--masks")):
        if not is_url(str(folder)) and not Path(folder).is_dir():
            raise InputError(f"{folder} is not a folder ({flag})")
    if "{stem}" not in mask_pattern:
        raise InputError(f"--mask-pattern must contain {{stem}}, got {mask_pattern!r}")
    same = str(images) == str(masks) if is_url(str(images)) else Path(images).resolve() == Path(masks).resolve()
    if same and mask_pattern == "{stem}":
        raise InputError(f"--images and --masks are one folder ({images}): every photo would be its own mask; give the masks' "
                         "folder, or a --mask-pattern such as {stem}_mask")
    prefix, suffix = mask_pattern.split("{stem}", 1)
    mask_name = re.compile(re.escape(prefix) + "(?P<stem>.+)" + re.escape(suffix) + "$")

    image_files, image_twins, unread = _by_stem(images, lambda stem: stem)
    mask_files, mask_twins, unread_masks = _by_stem(masks, lambda stem: (m := mask_name.match(stem)) and m["stem"])
    unread += [] if same else unread_masks
    if same:  # the masks beside the photos are no photos
        image_files = {stem: path for stem, path in image_files.items() if not mask_name.match(stem)}
        image_twins = {stem: paths for stem, paths in image_twins.items() if not mask_name.match(stem)}
    problems = [Problem(paths[0], _twins_message(paths)) for paths in [*image_twins.values(), *mask_twins.values()]]
    problems += [Problem(path, _unread_message(path)) for path in unread]
    problems += _unread_subfolders(images, masks) + ([] if same else _unread_subfolders(masks, images))
    problems += [Problem(link, f"a broken link (to {link.readlink()}): its file is missing")
                 for folder in ([images] if same else [images, masks]) for link in _broken_links(folder)]
    ambiguous = image_twins.keys() | mask_twins.keys()
    crack_free = set(crack_free)
    for stem in sorted(image_files.keys() - mask_files.keys() - ambiguous - crack_free):
        problems.append(Problem(image_files[stem], f"no mask for this image in {masks}"))
    for stem in sorted(mask_files.keys() - image_files.keys() - ambiguous):
        problems.append(Problem(mask_files[stem], f"no image for this mask in {images}"))
    paired = (image_files.keys() & mask_files.keys()) - crack_free
    samples = [Sample(stem, image_files[stem], mask_files[stem]) for stem in sorted(paired)]
    samples += [Sample(stem, image_files[stem], mask_files.get(stem)) for stem in sorted(image_files.keys() & crack_free)]
    return samples, problems


def _broken_links(folder: Folder) -> list[Path]:
    """The links right in a local folder whose target is gone, which :func:`files_in` cannot list as files."""
    if is_url(str(folder)):
        return []
    return sorted(path for path in Path(folder).iterdir() if path.is_symlink() and not path.exists())


def _unread_subfolders(folder: Folder, other: Folder) -> list[Problem]:
    """A folder's subfolders (or an s3:// prefix's sub-prefixes) that hold images, hidden ones aside, and the other
    folder of the pairs, which is read: pairing reads only the files right in it."""
    counts = _images_below(str(folder), str(other)) if is_url(str(folder)) else _images_in_subfolders(Path(folder), Path(other))
    return [Problem(sub, f"{count} image{'s' * (count != 1)} in a subfolder, which crackseg does not read (it pairs the files "
                         f"right in {folder}); move them up, or make each site a dataset of its own (train takes --data once per dataset)")
            for sub, count in counts.items()]


def _images_in_subfolders(folder: Path, other: Path) -> dict[Folder, int]:
    counts, read = {}, other.resolve()
    for sub in sorted(path for path in folder.iterdir() if path.is_dir() and not path.name.startswith(".")):
        if not read.is_relative_to(sub.resolve()):
            counts[sub] = sum(path.suffix.lower() in IMAGE_SUFFIXES and path.is_file() for path in paths_below(sub))
    return {sub: count for sub, count in counts.items() if count}


def _images_below(prefix: str, other: str) -> dict[Folder, int]:
    counts: Counter[str] = Counter()
    for key in list_keys(prefix):
        first, _, rest = key.partition("/")
        sub = f"{prefix.rstrip('/')}/{first}"
        if rest and not first.startswith(".") and not f"{other.rstrip('/')}/".startswith(f"{sub}/") \
                and PurePosixPath(rest).suffix.lower() in IMAGE_SUFFIXES:
            counts[sub] += 1
    return dict(sorted(counts.items()))


def files_by_stem(folder: Path) -> dict[str, Path]:
    """Every image file of ``folder`` by stem; two files with one stem are an error naming both, and so is a photo in a
    format crackseg does not read, which would otherwise be passed over in silence."""
    found, twins, unread = _by_stem(Path(folder), lambda stem: stem)
    if twins:
        paths = next(iter(twins.values()))
        raise InputError(f"{paths[0]}: {_twins_message(paths)}" + (f" ({len(twins)} such stems)" if len(twins) > 1 else ""))
    if unread:
        raise InputError(f"{unread[0]}: {_unread_message(unread[0])}" + (f" ({len(unread)} such files)" if len(unread) > 1 else ""))
    return found


def _by_stem(folder: Folder, stem_of) -> tuple[dict[str, File], dict[str, list[File]], list[File]]:
    """Unambiguous files by stem, the stems that several files share (left out of the first), and the photos in
    formats crackseg does not read (WebP, GIF, HEIC, camera raw and the like)."""
    every: dict[str, list[File]] = {}
    files = files_in(folder)
    for path in files:
        if path.suffix.lower() in IMAGE_SUFFIXES and (stem := stem_of(path.stem)):
            every.setdefault(stem, []).append(path)
    unique = {stem: paths[0] for stem, paths in every.items() if len(paths) == 1}
    unread = [path for path in files if path.suffix.lower() in OTHER_PHOTO_SUFFIXES]
    return unique, {stem: paths for stem, paths in every.items() if len(paths) > 1}, unread


def _unread_message(path: File) -> str:
    return f"a {path.suffix} file, a format crackseg does not read: convert it to PNG, JPEG or TIFF ({', '.join(IMAGE_SUFFIXES)})"


def _twins_message(paths: list[File]) -> str:
    return f"shares its stem with {', '.join(p.name for p in paths[1:])}: cannot tell which to use; rename or remove one"
