"""What the command modules share: the help layout, one-line parse errors, argparse types and checks, flag groups.

A flag group declared here (the dataset options, the inference options of predict and evaluate)
is declared once; its defaults, choices and ranges come from :mod:`crackseg.core.config`.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from crackseg.core.config import (
    AMP_CHOICES,
    AT_LEAST_ONE,
    BACKENDS,
    NON_NEGATIVE,
    TILE,
    TILE_OVERLAP,
    TTA_CHOICES,
    InferenceOptions,
    Range,
    flag,
    option_fields,
    parse_length,
)
from crackseg.cracks.widths import WIDTH_CLASS_PRESETS, WidthClasses


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the layout of descriptions; appends an option's default where it tells something."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default is None or action.default is False or action.default == argparse.SUPPRESS \
                or not action.option_strings:
            return text
        return text + " (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """A mistake on the command line is one line, like every other user error; the usage is for --help."""

    def error(self, message: str):
        self.exit(2, f"crackseg: error: {message} (see {self.prog} --help)\n")


def local_path(text: str) -> Path:
    """An argparse ``type`` for a path on this machine: a URL (s3://, https://) would become a local folder named after its
    scheme (pathlib folds the slashes), so it is refused; predict, evaluate and compare take object storage where they can."""
    from crackseg.core.storage import display_url, is_url

    if is_url(text):
        raise argparse.ArgumentTypeError(f"{display_url(text)}: a local path is needed here (object storage is read and written "
                                         "by predict, evaluate and compare; docs/predict.md)")
    return Path(text)


def image_size(text: str) -> tuple[int, int]:
    """N or HxW px -> (height, width)."""
    from crackseg.data.synth import parse_size

    try:
        return parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def length(text: str) -> str:
    """A length like 12px or 3mm, checked and kept as text."""
    try:
        parse_length(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def width_classes(text: str) -> str:
    """A preset of :data:`~crackseg.cracks.widths.WIDTH_CLASS_PRESETS` or increasing edges in mm, checked by their owner
    and kept as text."""
    try:
        WidthClasses.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def width_classes_help(what: str) -> str:
    """--width-classes' help for predict and compare: ``what`` they do with the classes, then every preset with its
    standard, edges and graded width, from the presets themselves."""
    presets = ", ".join(f"{name} ({preset.title}: {', '.join(f'{edge:g}' for edge in preset.edges_mm)} mm, {preset.graded} width)"
                        for name, preset in WIDTH_CLASS_PRESETS.items())
    return (f"{what}: {presets}; or your own edges in mm, e.g. 0.1,0.2,0.3,1.0 (max width, a width on an edge in the lower "
            "class). docs/predict.md gives each standard's classes and source; needs a pixel size, see --px-size")


def checked(kind: type, valid: Range | None, parse=None):
    """An argparse ``type``: text -> ``kind`` (or ``parse(text)``), refused outside ``valid`` with its reason."""

    def convert(text: str):
        try:
            value = parse(text) if parse is not None else kind(text)
        except ValueError as error:
            expected = {int: "an integer", float: "a number"}.get(kind, kind.__name__)
            raise argparse.ArgumentTypeError(str(error) if parse is not None else f"must be {expected}, got {text!r}") from None
        problem = valid.problem(value) if valid is not None else None
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    return convert


def add_option(group, item: dataclasses.Field, kind: type) -> None:
    """The flag of one TrainConfig field: default, choices, range and help all come from crackseg.core.config."""
    meta = item.metadata
    text = meta["help"].replace("%", "%%")
    if kind is bool:
        group.add_argument(flag(item.name), action="store_true", help=text)
        return
    required = item.default is dataclasses.MISSING
    group.add_argument(
        flag(item.name), type=checked(kind, meta["valid"], meta["flag_type"]), choices=meta["choices"],
        default=None if required else item.default, required=required, help=text,
        metavar=None if meta["choices"] else item.name.upper(),
    )


def add_data_options(parser: argparse.ArgumentParser) -> None:
    """The dataset flags of crackseg inspect: a root folder and the TrainConfig fields that find and split its files."""
    group = parser.add_argument_group("dataset")
    group.add_argument("root", type=local_path, nargs="?", help="dataset folder holding images/ and masks/ (see data/README.md)")
    for item, kind in option_fields():
        if item.name in ("images", "masks", "mask_pattern", "val_fraction", "seed"):
            add_option(group, item, kind)


def add_inference_options(parser: argparse.ArgumentParser, title: str) -> None:
    """The flags of crackseg.core.config.InferenceOptions, declared once for predict and evaluate."""
    group = parser.add_argument_group(title)
    group.add_argument("--tile", type=checked(int, AT_LEAST_ONE), default=TILE, help="tile side in px; larger images run as overlapping tiles")
    group.add_argument("--overlap", type=checked(int, NON_NEGATIVE), default=TILE_OVERLAP,
                       help="overlap between neighbouring tiles in px, blended smoothly (less than --tile)")
    group.add_argument("--batch-size", type=checked(int, AT_LEAST_ONE), default=None,
                       help="tiles per forward pass; tiles of several images share a batch (default 8 on a GPU, 1 on CPU, where batches ran slower)")
    group.add_argument("--tta", choices=TTA_CHOICES, default="none", help="average probabilities over a horizontal flip, or all 8 flips and rotations")
    group.add_argument("--resize", type=image_size, default=None,
                       help="resize every image to N or HxW px first (for models trained on resized data); masks come back at the input size")
    group.add_argument("--backend", choices=BACKENDS, default="auto",
                       help="runtime of the forward pass; auto: torch for checkpoints and safetensors folders, "
                            "onnxruntime for .onnx, openvino for .xml (openvino also runs .onnx)")
    group.add_argument("--device", default="auto", help="auto (CUDA when present), cuda or cpu; exported models run on the CPU")
    group.add_argument("--amp", choices=AMP_CHOICES, default="auto",
                       help="mixed precision; auto = bf16 on GPUs that support it; bf16 also speeds up --backend openvino "
                            "on CPUs with bfloat16 (docs/benchmarks.md)")
    group.add_argument("--channels-last", action="store_true",
                       help="NHWC memory layout for --backend torch (on tensor cores; on the CPU it was slower end to end, docs/benchmarks.md)")


def inference_options(args: argparse.Namespace) -> InferenceOptions:
    return InferenceOptions(**{item.name: getattr(args, item.name) for item in dataclasses.fields(InferenceOptions)})
