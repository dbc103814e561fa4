"""Which photo of ``--images`` each image an annotation file lists is, and the size it is shown at.

A listed name is matched, in either Unicode form, by its path's longest tail, else its file name (in a Label Studio
export also as Label Studio stores an upload), else its stem for a name without an image suffix; a name that fits two
photos, two names that find one photo and one photo listed at two sizes are errors, since one of them would be drawn on
another photo. A labelme image whose photo ``--images`` lacks is the photo its file embeds.
"""

from __future__ import annotations

import io
import unicodedata
from collections import Counter
from pathlib import Path, PurePosixPath

from PIL import Image

from crackseg.core.errors import InputError
from crackseg.data.images import DECODE_ERRORS, IMAGE_SUFFIXES, describe_error, displayed_size, orientation, stored_size
from crackseg.data.inputs import paths_below
from crackseg.labels.formats.label_studio import stored_upload_name, upload_names
from crackseg.labels.formats.labelme import embedded_photo
from crackseg.labels.formats.shapes import LabelledImage


def photos_below(folder: Path, out: Path) -> dict[str, Path]:
    """Every image below ``folder`` by its path relative to it, but those of the dataset being written."""
    if not folder.is_dir():
        raise InputError(f"--images {folder}: not a folder")
    written = {(out / "images").resolve(), (out / "masks").resolve()} - {folder.resolve()}  # --out inside --images
    return {path.relative_to(folder).as_posix(): path for path in paths_below(folder)
            if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file() and path.parent.resolve() not in written}


class PhotoIndex:
    """--images' photos by path relative to it, each tail of that path, the name Label Studio stores an upload under, and stem.

    ``uploads``: names may be Label Studio uploads (``abcd1234-IMG_1.jpg``), found without their prefix; in other
    formats such a name (``20230514-IMG_1.jpg``) is the file's whole name, and finding ``IMG_1.jpg`` would draw one
    photo's cracks on another."""

    def __init__(self, photos: dict[str, Path], uploads: bool = False):
        self.photos, self.uploads = {}, uploads
        for key, path in photos.items():
            if _same_form(key) in self.photos:  # names differing in Unicode form alone: which one a file means is a guess
                raise InputError(f"{self.photos[_same_form(key)]} and {path} in --images: one name, written in two Unicode "
                                 "forms (composed and decomposed accents); rename one")
            self.photos[_same_form(key)] = path
        self.by_tail: dict[str, list[str]] = {}  # every tail of each path: a/b/c.jpg under c.jpg, b/c.jpg and a/b/c.jpg
        self.by_upload: dict[str, list[str]] = {}
        self.by_stem: dict[str, list[str]] = {}
        for key in self.photos:
            parts = PurePosixPath(key).parts
            for start in range(len(parts)):
                self.by_tail.setdefault("/".join(parts[start:]), []).append(key)
            name = parts[-1]
            self.by_upload.setdefault(stored_upload_name(name), []).append(key)
            self.by_stem.setdefault(PurePosixPath(key).stem, []).append(key)

    def find(self, name: str, source: Path) -> Path | None:
        """The photo ``name`` refers to: the one whose path shares the longest tail with it (a path relative to
        --images that is that tail first: ``site1/a.jpg`` is ``site1/a.jpg``, else ``new/site1/a.jpg`` before ``a.jpg``),
        else for a Label Studio upload the one photo Label Studio stores under its name without the prefix (``IMG 1.jpg``
        and ``IMG_1.jpg`` both as ``IMG_1.jpg``), else the one so named, else, for a name without an image suffix (CVAT's
        video frames: frame_000000), the one photo of that stem."""
        name = _same_form(name)
        parts = PurePosixPath(name.replace("\\", "/")).parts
        for start in range(len(parts)):
            tail = "/".join(parts[start:])
            if tail in self.photos:
                return self.photos[tail]
            found = self._one(self.by_tail, tail, name, "give the folder the names are relative to", source)
            if found is not None:
                return found
        names = upload_names(name) if self.uploads else [name]
        if len(names) > 1:  # every photo Label Studio would store under that upload name, the one named so exactly too
            advice = f"Label Studio stores an upload of each as {names[1]}: rename all but one"
            found = self._one(self.by_upload, names[1], name, advice, source) or self._one(self.by_tail, names[1], name, advice, source)
            if found is not None:
                return found
        base = PurePosixPath(name.replace("\\", "/")).name
        if PurePosixPath(base).suffix.lower() not in IMAGE_SUFFIXES:
            return self._one(self.by_stem, base, name, "the name has no image suffix: keep one photo of that stem", source)
        return None

    def _one(self, index: dict[str, list[str]], key: str, name: str, advice: str, source: Path) -> Path | None:
        same = index.get(key, [])
        if len(same) > 1:
            raise InputError(f"{source}: {name} could be any of {', '.join(same[:3])} in --images; {advice}")
        return self.photos[same[0]] if same else None


def match_photos(listed: list[LabelledImage], index: PhotoIndex, source: Path, out: Path) -> dict[Path, LabelledImage]:
    """Each listed image's photo (an image listed twice, under one name and at one size, gets the shapes of both; two
    names finding one photo are an error, since one of them is another photo); a labelme image whose photo --images
    lacks is the photo its file embeds, keyed by where it will be written (``out``/images/)."""
    matched: dict[Path, LabelledImage] = {}
    missing = []
    for image in listed:
        if not isinstance(image.name, str) or not image.name:
            raise InputError(f"{source}: an image named {image.name!r}; a file names each image's file as text")
        photo = index.find(image.name, source)
        embedded_in = image.embedded_in if photo is None else None  # the photo itself, when there is one
        if photo is None and embedded_in is not None:
            photo = out / "images" / PurePosixPath(image.name).name
            if photo.suffix.lower() not in IMAGE_SUFFIXES:
                raise InputError(f"{embedded_in}: its photo {image.name} is only embedded (imageData), and crackseg datasets hold "
                                 f"{', '.join(IMAGE_SUFFIXES)} files: give --images a folder holding the photo in one of those")
            if photo in matched and matched[photo].name != image.name:
                raise InputError(f"{source}: {matched[photo].name} and {image.name} embed photos of one name, {photo.name}, and "
                                 "--images has neither; a dataset pairs masks by stem: give the folder holding them")
        if photo is None:
            missing.append(image.name)
        elif photo in matched:
            first = matched[photo]
            if _listed_name(first.name) != _listed_name(image.name):
                raise InputError(f"{source}: {first.name} and {image.name} both match {photo} in --images; give the folder "
                                 "the names are relative to, holding each photo")
            if first.size is not None and image.size is not None and tuple(first.size) != tuple(image.size):
                raise InputError(f"{source}: {image.name} is listed at {first.size[0]}x{first.size[1]} px and at "
                                 f"{image.size[0]}x{image.size[1]} px; one photo has one size")
            first.shapes += image.shapes
            first.size = first.size or image.size
        else:
            matched[photo] = LabelledImage(image.name, image.size, list(image.shapes), embedded_in)
    if missing:
        raise InputError(f"{source} refers to {len(missing)} images that are not in --images (e.g. {missing[0]}); "
                         "give the folder holding them")
    stems = Counter(photo.stem for photo in matched)
    clash = next((stem for stem, count in stems.items() if count > 1), None)
    if clash is not None:
        first, second = [photo for photo in matched if photo.stem == clash][:2]
        raise InputError(f"{first} and {second} share the stem {clash!r}; a dataset pairs masks by stem: rename one")
    return matched


def _listed_name(name: str) -> str:
    """A listed name as the photo it names: / for \\, without ./ or doubled slashes, in one Unicode form."""
    return PurePosixPath(_same_form(name).replace("\\", "/")).as_posix()


def _same_form(name: str) -> str:
    """``name`` in Unicode's composed form (NFC): macOS and some tools write é as e and an accent (NFD), others as one
    character, and a name must find its photo either way."""
    return unicodedata.normalize("NFC", name)


def shown_size(photo: Path, image: LabelledImage, source: Path) -> tuple[int, int]:
    """The photo's (width, height) as shown, which must be the size the file states."""
    shown_as = f"the photo in {image.embedded_in}'s imageData" if image.embedded_in is not None else str(photo)
    try:
        with Image.open(io.BytesIO(embedded_photo(image)) if image.embedded_in is not None else photo) as picture:
            shown, stored, turn = displayed_size(picture), stored_size(picture), orientation(picture)
    except DECODE_ERRORS as error:
        raise InputError(f"{shown_as}: {describe_error(error)}") from None
    if image.size is None or tuple(image.size) == shown:
        return shown
    message = f"{source}: {image.name} is {image.size[0]}x{image.size[1]} px there but {shown_as} is {shown[0]}x{shown[1]} as shown"
    if turn != 1 and tuple(image.size) == stored:
        message += (f"; its EXIF orientation tag ({turn}) explains it: it was labelled on the stored, unturned pixels "
                    "(label the photo as viewers show it, or remove the tag)")
    else:
        message += f" (no EXIF orientation explains it{f'; tag {turn}' if turn != 1 else ''}): is it the same photo?"
    raise InputError(message)
