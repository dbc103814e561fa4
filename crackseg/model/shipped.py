"""The models that ship inside crackseg, by name: ``--checkpoint general`` anywhere a model file is taken, and the model
predict uses when given none. No torch, so the command line resolves names without loading it.

Each is a safetensors folder (``config.json`` + ``model.safetensors``, float16) below ``crackseg/model/weights/``,
installed with the package: no download, no network. docs/models.md is each one's model card.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from crackseg.core.errors import InputError

WEIGHTS = Path(__file__).resolve().parent / "weights"


@dataclass(frozen=True)
class ShippedModel:
    summary: str  # what it was trained on, in one line
    terms: str  # the terms its weights come under


SHIPPED = {
    "general": ShippedModel(
        "EfficientNet-Lite0 UNet trained on four public crack datasets at once: road, pavement, masonry, walls",
        "research use only: trained on datasets licensed for research (docs/models.md)",
    ),
}
DEFAULT_MODEL = "general"  # what predict runs without --checkpoint
CRACKPOT_MODEL = Path("resources", "model", "my_model.keras")  # inside the crackpot package


def shipped_folder(name: str) -> Path:
    """The folder of the shipped model ``name``; one line when this install lacks it."""
    folder = WEIGHTS / name
    if not (folder / "config.json").is_file():
        raise InputError(f"the shipped {name} model is missing from this install ({folder}); reinstall crackseg, or pass --checkpoint")
    return folder


def model_file(value: str | Path) -> Path:
    """A model file or folder as given, or the shipped model of that name where no file or folder has it."""
    path = Path(value)
    if path.exists():
        return path
    if str(value) in SHIPPED:
        return shipped_folder(str(value))
    if len(path.parts) == 1 and not path.suffix:  # a bare name: a mistyped model name as likely as a missing file
        raise InputError(f"{value}: no such model file or folder, and no shipped model of that name "
                         f"({', '.join(SHIPPED)}; crackseg models lists them)")
    return path


def describe(name: str) -> str:
    """Where the shipped model ``name`` is, what it holds and its size, from its own config.json; or that it is missing."""
    folder = WEIGHTS / name
    try:
        config = json.loads((folder / "config.json").read_text())["model"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"missing or damaged in this install ({folder}); reinstall crackseg"
    size = sum(path.stat().st_size for path in folder.iterdir()) / 1e6
    return (f"{config.get('arch')} with the {config.get('encoder')} encoder, threshold {config.get('threshold'):.3g}, "
            f"{size:.1f} MB at {folder}")


def crackpot_model_file() -> Path:
    """``my_model.keras`` of the installed crackpot package (read by ``crackseg convert --from crackpot``), found without
    importing crackpot (it imports Qt)."""
    spec = importlib.util.find_spec("crackpot")
    if spec is None or not spec.submodule_search_locations:
        raise InputError("crackpot is not installed: pip install --no-deps crackpot==2.0 (its wheel holds the model; its GUI is "
                         "not needed), or give the path of its my_model.keras")
    path = Path(next(iter(spec.submodule_search_locations))) / CRACKPOT_MODEL
    if not path.is_file():
        raise InputError(f"{path}: missing from the installed crackpot; reinstall crackpot 2.0, or give the path of its my_model.keras")
    return path
