"""The work of one predict run: its inputs listed (:func:`collect_inputs`), what was decided before any of it was done
(:class:`Plan`), and how the engines split it.

Every engine splits one list (:func:`work_list`): each photo is an item, and each raster predicted by windows is
``bands`` items, bands of its tile rows (:func:`crackseg.model.inference.part_rows`) that are joined afterwards
(:func:`crackseg.prediction.streamed.join_raster`). The local engine takes every item; each torchrun process takes
its :func:`share` (every WORLD_SIZE-th photo, and band RANK of every raster); Ray's actors take items as they free up.
"""

from __future__ import annotations

import glob
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from crackseg.core.errors import InputError
from crackseg.core.storage import RemoteFile, display_url, is_url, list_files
from crackseg.data.images import IMAGE_SUFFIXES
from crackseg.prediction.outputs import OutputSpec, PredictionsFolder
from crackseg.prediction.remote_out import RemoteOutputs
from crackseg.prediction.streamed import Raster


def collect_inputs(inputs: list[str], recursive: bool = False, out: Path | str | None = None) -> list[tuple[Path | RemoteFile, str]]:
    """(image path or remote file, output name) for every input file, folder, glob or URL, in a stable order.

    Output names mirror the inputs: a folder's files (an s3:// prefix's) keep their path below it (without suffix),
    single files, objects, http(s):// URLs and glob matches keep their stem. Two inputs with one output name are an error.
    Nothing inside ``out`` is ever an input: walks and listings skip it, and naming a local file there is an error.
    """
    inside_out = (lambda p: Path(p).resolve().is_relative_to(Path(out).resolve())) if isinstance(out, Path) else (lambda p: False)
    below_out = f"{str(out).rstrip('/')}/" if isinstance(out, str) else None
    found: list[tuple[Path | RemoteFile, str]] = []
    for text in inputs:
        path = Path(text)
        if is_url(text):
            found += [(file, name) for file, name in list_files(text, IMAGE_SUFFIXES, recursive) if not (below_out and file.url.startswith(below_out))]
        elif path.is_dir():
            pattern = "**/*" if recursive else "*"
            files = sorted(
                p for p in path.glob(pattern) if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES and not inside_out(p)
            )
            found += [(p, p.relative_to(path).with_suffix("").as_posix()) for p in files]
        elif path.is_file():
            if inside_out(path):
                raise InputError(f"{path}: is inside --out {out}, where predict writes; it is never read as input")
            found.append((path, path.stem))
        else:
            matches = sorted(Path(p) for p in glob.glob(text, recursive=recursive) if Path(p).is_file() and not inside_out(p))
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
    return unique


@dataclass
class Plan:
    """The run decided before any work: photos (key, path, output name), open rasters, spec, outputs, the store's uploader."""

    folder: PredictionsFolder
    remote: RemoteOutputs | None
    photos: list[tuple[int, Path | RemoteFile, str]]
    rasters: list[Raster]
    spec: OutputSpec
    outputs: dict[int, list[Path]]  # every input's files, its mask first
    warnings: list[str]
    skip_existing: bool = False

    def kept(self, key: int) -> bool:
        """Whether ``--skip-existing`` keeps an input's outputs of an earlier run: all of them in the folder, or on the
        store when this run began (the mask is then fetched, to be summarised as a local one)."""
        if not self.skip_existing:
            return False
        if self.remote:
            return self.remote.fetch_if_done(self.outputs[key])
        return all(path.exists() for path in self.outputs[key])

    def upload(self, key: int) -> None:
        """For an --out in object storage: upload an input's files, each whole, as soon as all are written."""
        if self.remote:
            self.remote.upload(self.outputs[key])


@dataclass(frozen=True)
class Work:
    """One item of the work list: a photo, or one band of a raster's tile rows."""

    key: int  # the input's row in predictions.csv
    path: Path | RemoteFile
    name: str  # the output name
    band: tuple[int, int] | None = None  # a raster's (index, count) of bands; None: a photo, decoded whole


def work_list(plan: Plan, bands: int) -> list[Work]:
    """Every photo, then each raster as ``bands`` bands of its tile rows (bands with no rows of their own are empty)."""
    photos = [Work(key, path, name) for key, path, name in plan.photos]
    return photos + [Work(raster.key, raster.path, raster.name, (index, bands)) for raster in plan.rasters for index in range(bands)]


def share(work: list[Work], rank: int, world_size: int) -> list[Work]:
    """Process ``rank``'s items of a list made with ``bands=world_size``: every ``world_size``-th photo, from the
    ``rank``-th, and band ``rank`` of every raster."""
    photos = [item for item in work if item.band is None]
    return photos[rank::world_size] + [item for item in work if item.band is not None and item.band[0] == rank]
