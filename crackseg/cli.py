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
