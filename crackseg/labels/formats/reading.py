"""Which annotation formats crackseg labels reads and writes, and the reader of each.

Cheap to import (the standard library only): the CLI builds its ``--format`` choices from
LABEL_FORMATS; a tool's module (numpy, PIL, scipy) is imported when a file is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from crackseg.core.errors import InputError

if TYPE_CHECKING:
    from crackseg.labels.formats.shapes import Annotations

LABEL_FORMATS = ("coco", "labelme", "cvat", "labelstudio")  # annotation files crackseg labels import / export
_EXPECTED = {"coco": "a COCO .json file", "cvat": "a CVAT for images 1.1 .xml file", "labelstudio": "a Label Studio JSON export (.json)"}


def read_annotations(path: Path, fmt: str, skip: Path | None = None) -> Annotations:
    """The images and shapes of an annotation file (a labelme folder: every labelme .json below it but ``skip``, the
    labels.json of the dataset being written)."""
    # imported here, not above: the CLI reads LABEL_FORMATS for its --format choices without numpy
    from crackseg.labels.formats.coco import read_coco
    from crackseg.labels.formats.cvat import read_cvat
    from crackseg.labels.formats.label_studio import read_labelstudio
    from crackseg.labels.formats.labelme import read_labelme

    readers = {"coco": read_coco, "cvat": read_cvat, "labelstudio": read_labelstudio}
    if fmt not in LABEL_FORMATS:
        raise InputError(f"--format must be one of {', '.join(LABEL_FORMATS)}, got {fmt!r}")
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir() and fmt != "labelme":
        raise InputError(f"{path} is a folder; --format {fmt} expects {_EXPECTED[fmt]}")
    try:
        return read_labelme(path, skip) if fmt == "labelme" else readers[fmt](path)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError) as error:
        reason = f"missing {error}" if isinstance(error, KeyError) else str(error)
        raise InputError(f"{path}: not a valid {fmt} file: {reason}") from None
