"""The photos a run reads: files, folders, glob patterns and URLs (s3:// prefixes and objects, http(s)://), each with
the name its outputs take."""

from __future__ import annotations

import glob
import os
from collections import OrderedDict
from pathlib import Path
from typing import NamedTuple, TypeVar

from crackseg.core.errors import InputError
from crackseg.core.storage import RemoteFile, list_files
from crackseg.core.urls import display_url, is_url
from crackseg.data.images import IMAGE_SUFFIXES, OTHER_PHOTO_SUFFIXES

_File = TypeVar("_File", Path, RemoteFile)


class Inputs(NamedTuple):
    """What a run reads: (image path or remote file, output name) per photo, and the files of folders, patterns and
    s3:// prefixes that are photos in a format crackseg does not read (WebP, GIF, HEIC, camera raw and the like), passed
    over."""

    photos: list[tuple[Path | RemoteFile, str]]
    left_out: list[Path | RemoteFile]


def collect_inputs(inputs: list[str], recursive: bool = False, out: Path | str | None = None) -> Inputs:
    """The photos of every input file, folder, glob or URL, in a stable order, and the photos left out.

    Output names mirror the inputs: a folder's files (an s3:// prefix's) keep their path below it (without suffix),
    single files, objects, http(s):// URLs and glob matches keep their stem. Two inputs with one output name are an error.
    Nothing inside ``out`` is ever an input: walks and listings skip it, and naming a local file there is an error.
    """
    inside_out = (lambda p: Path(p).resolve().is_relative_to(Path(out).resolve())) if isinstance(out, Path) else (lambda p: False)
    below_out = f"{str(out).rstrip('/')}/" if isinstance(out, str) else None
    found: list[tuple[Path | RemoteFile, str]] = []
    left_out: list[Path | RemoteFile] = []
    for text in inputs:
        path = Path(text)
        if is_url(text):
            listed = [(file, name) for file, name in list_files(text, (*IMAGE_SUFFIXES, *OTHER_PHOTO_SUFFIXES), recursive)
                      if not (below_out and file.url.startswith(below_out))]
            unread = {file for file in _unread([file for file, _ in listed]) if file.url != text}  # an object named alone is read
            left_out += [file for file, _ in listed if file in unread]
            found += [(file, name) for file, name in listed if file not in unread]
        elif path.is_dir():
            if inside_out(path):
                raise InputError(f"{path}: is --out {out} or inside it, where predict writes; nothing there is read as input: "
                                 "choose another --out")
            every = _walk(path, recursive)
            left_out += _unread(every)
            files = [p for p in every if p.suffix.lower() in IMAGE_SUFFIXES and not inside_out(p)]
            found += [(p, p.relative_to(path).with_suffix("").as_posix()) for p in files]
        elif path.is_file():
            if inside_out(path):
                raise InputError(f"{path}: is inside --out {out}, where predict writes; it is never read as input")
            found.append((path, path.stem))
        else:
            every = _matches(text, recursive)
            left_out += _unread(every)
            matches = [p for p in every if not inside_out(p)]
            if every and not matches:
                raise InputError(f"{text}: every file it matches is inside --out {out}, where predict writes; they are never "
                                 "read as input: choose another --out")
            if not matches:
                raise InputError(f"{text}: no such file or folder, and no file matches it as a pattern")
            found += [(p, p.stem) for p in matches if p.suffix.lower() in IMAGE_SUFFIXES]
    names: dict[str, Path | RemoteFile] = {}
    for image, name in found:
        if name in names and names[name] != image:
            raise InputError(f"{image} and {names[name]} would both be written as {name}.png; predict them into different --out folders")
        names[name] = image
    unique = list(OrderedDict((image, name) for image, name in found).items())
    if not unique:
        raise InputError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in {', '.join(map(display_url, inputs))}")
    return Inputs(unique, left_out)


def _unread(files: list[_File]) -> list[_File]:
    """The photos among ``files`` in a format crackseg does not read."""
    return [p for p in files if p.suffix.lower() in OTHER_PHOTO_SUFFIXES]


def paths_below(folder: Path) -> list[Path]:
    """Every file and folder below ``folder``, sorted, as ``rglob("*")`` gives them but also through links to folders
    elsewhere (a site's photos linked into a survey): a linked folder is walked once, and not at all when it is one of
    ``folder``'s own, so a link back up ends and no photo comes twice under two names."""
    own = {_identity(Path(top)) for top, _, _ in os.walk(folder)}
    seen, found = set(own), []
    for top, folders, files in os.walk(folder, followlinks=True):
        found += [Path(top, name) for name in folders + files]
        kept = []
        for name in sorted(folders):
            path = Path(top, name)
            identity = _identity(path)
            if identity in own and not path.is_symlink():  # one of the folder's own, by its own path
                kept.append(name)
            elif identity is not None and identity not in seen:  # a linked folder not walked yet
                seen.add(identity)
                kept.append(name)
        folders[:] = kept
    return sorted(found)


def _identity(folder: Path) -> tuple[int, int] | None:
    """(device, inode) of the folder ``folder`` names or links to; None if it cannot be read."""
    try:
        status = folder.stat()
    except OSError:
        return None
    return status.st_dev, status.st_ino


def _walk(folder: Path, recursive: bool) -> list[Path]:
    """Every file in ``folder`` (and below it, linked folders included, when ``recursive``), sorted."""
    return sorted(p for p in (paths_below(folder) if recursive else folder.iterdir()) if p.is_file())


def _matches(pattern: str, recursive: bool) -> list[Path]:
    """Every file the glob ``pattern`` matches, sorted."""
    return sorted(Path(p) for p in glob.glob(pattern, recursive=recursive) if Path(p).is_file())
