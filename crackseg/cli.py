"""``crackseg <command>``: argument parsing only; each command calls one library function.

User mistakes raise :class:`~crackseg.errors.InputError` and end as one line on stderr
with exit status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from crackseg import __version__
from crackseg.errors import InputError


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows defaults after each option and keeps the layout of descriptions."""


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _size(text: str) -> tuple[int, int]:
    from crackseg.synth import parse_size

    try:
        return parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _cmd_synth(args: argparse.Namespace) -> int:
    from crackseg.synth import write_dataset

    stems = write_dataset(
        args.out, args.count, args.size, args.seed, truth=args.truth, overwrite=args.overwrite, workers=args.workers
    )
    height, width = args.size
    print(f"wrote {len(stems)} images of {height}x{width} px and their masks to {args.out}")
    return 0


def _add_data_options(parser: argparse.ArgumentParser, root_required: bool) -> None:
    group = parser.add_argument_group("dataset")
    if root_required:
        group.add_argument("root", type=Path, nargs="?", help="dataset folder holding images/ and masks/ (see data/README.md)")
    group.add_argument("--images", type=Path, help="image folder (default ROOT/images)")
    group.add_argument("--masks", type=Path, help="mask folder (default ROOT/masks)")
    group.add_argument(
        "--mask-pattern", default="{stem}", help="mask file name without suffix, e.g. '{stem}_mask' for 001.jpg <-> 001_mask.png"
    )
    group.add_argument("--val-fraction", type=float, default=0.1, help="share of training stems held out for validation when there is no val.txt")
    group.add_argument("--seed", type=int, default=0, help="seed of the train/val draw")


def _cmd_inspect(args: argparse.Namespace) -> int:
    from crackseg.data import inspection_report, make_split, open_dataset

    found = open_dataset(args.root, args.images, args.masks, args.mask_pattern)
    split = make_split([sample.stem for sample in found.samples], args.val_fraction, args.seed, found.listed)
    print(inspection_report(found, split, args.val_fraction))
    return 1 if found.problems else 0


def _cmd_convert(args: argparse.Namespace) -> int:
    from crackseg.checkpoint import convert_classic

    model = convert_classic(args.classic, args.arch, args.out, threshold=args.threshold, overwrite=args.overwrite)
    print(f"wrote {args.out}: {model.arch} ({model.encoder} encoder), threshold {model.threshold}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="crackseg",
        description="Train UNets that find cracks in photos, predict crack masks, and score them.",
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"crackseg {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    synth = commands.add_parser(
        "synth",
        help="write a synthetic crack dataset (demo data, test fixtures)",
        description=(
            "Write OUT/images/<stem>.jpg and OUT/masks/<stem>.png (0 = background, 255 = crack):\n"
            "concrete/asphalt textures with branching cracks 1-10 px wide, crack-like distractors\n"
            "that are not labelled, and about 15% crack-free images. The same seed gives\n"
            "byte-identical files."
        ),
        formatter_class=_HelpFormatter,
    )
    synth.add_argument("out", type=Path, help="output folder (created if missing)")
    synth.add_argument("--count", type=_positive_int, default=64, help="number of images")
    synth.add_argument("--size", type=_size, default=(256, 256), help="image size in px: N or HxW (height x width)")
    synth.add_argument("--seed", type=int, default=0, help="random seed")
    synth.add_argument("--truth", action="store_true", help="also write truth.json: each crack's length and width in px")
    synth.add_argument("--workers", type=_positive_int, default=1, help="processes generating images in parallel")
    synth.add_argument("--overwrite", action="store_true", help="replace files already in OUT")
    synth.set_defaults(handler=_cmd_synth)

    inspect = commands.add_parser(
        "inspect",
        help="check a dataset and summarize it",
        description=(
            "Pair images and masks by file stem, decode every file completely, and report: counts per\n"
            "split, image sizes, crack-pixel fraction, the crack pixel weight training would use, and\n"
            "every problem (unmatched files, size mismatches, unreadable or truncated files).\n"
            "Exit status 0 when clean, 1 when problems were found."
        ),
        formatter_class=_HelpFormatter,
    )
    _add_data_options(inspect, root_required=True)
    inspect.set_defaults(handler=_cmd_inspect)

    convert = commands.add_parser(
        "convert",
        help="turn a classic crack-segmentation checkpoint into a crackseg model file",
        description=(
            "Read a checkpoint of the classic crack-segmentation project\n"
            "({'model': state_dict, 'epoch': ..., 'valid_loss': ...}), check every tensor against\n"
            "--arch, and write a self-describing crackseg model file that predict, evaluate and\n"
            "fine-tuning take like any other."
        ),
        formatter_class=_HelpFormatter,
    )
    convert.add_argument("classic", type=Path, help="classic checkpoint, e.g. model_best.pt or model_epoch_N.pt")
    convert.add_argument("--arch", required=True, choices=["unet16", "unet_resnet34", "unet_resnet101", "unet_resnet152"], help="architecture it holds")
    convert.add_argument("--out", type=Path, required=True, help="crackseg model file to write")
    convert.add_argument("--threshold", type=float, default=0.2, help="decision threshold on crack probability stored in the file (the classic inference default)")
    convert.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    convert.set_defaults(handler=_cmd_convert)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except InputError as error:
        parser.exit(2, f"crackseg: error: {error}\n")
    except KeyboardInterrupt:
        print("crackseg: interrupted", file=sys.stderr)
        return 130
