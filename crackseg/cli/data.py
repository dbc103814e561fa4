"""``crackseg synth`` and ``crackseg inspect``: datasets written and checked."""

from __future__ import annotations

import argparse
from pathlib import Path

from crackseg.cli.options import HelpFormatter, add_data_options, checked, image_size, local_path
from crackseg.core.config import AT_LEAST_ONE, FRACTION, NON_NEGATIVE

CRACK_FREE_DEFAULT = 0.15  # crackseg.data.synth.CRACK_FREE_FRACTION, not imported here: the CLI loads numpy only inside a command


def add_commands(commands) -> None:
    synth = commands.add_parser(
        "synth",
        help="write a synthetic crack dataset (demo data, test fixtures)",
        description=(
            "Write OUT/images/<stem>.jpg and OUT/masks/<stem>.png (0 = background, 255 = crack):\n"
            "concrete/asphalt textures with branching cracks 1-10 px wide, crack-like distractors\n"
            "that are not labelled, and about 15% crack-free images (--crack-free). --hard-negatives\n"
            "adds stronger look-alikes to every image; with --crack-free 1 it writes crack-free\n"
            "look-alike photos with empty masks, hard negatives for training. The same seed gives\n"
            "byte-identical files."
        ),
        formatter_class=HelpFormatter,
    )
    synth.add_argument("out", type=local_path, help="output folder (created if missing)")
    synth.add_argument("--count", type=checked(int, AT_LEAST_ONE), default=64, help="number of images")
    synth.add_argument("--size", type=image_size, default="256", help="image size in px: N or HxW (height x width)")
    synth.add_argument("--seed", type=checked(int, NON_NEGATIVE), default=0, help="random seed")
    synth.add_argument("--truth", action="store_true", help="also write truth.json (each crack's nominal length and width in px) and truth/<stem>.png (each crack pixel labelled with its crack's number)")
    synth.add_argument("--crack-free", type=checked(float, FRACTION), default=CRACK_FREE_DEFAULT, metavar="FRACTION",
                       help="share of images with no crack, in [0, 1]")
    synth.add_argument("--hard-negatives", action="store_true",
                       help="draw 1-4 unlabelled crack look-alikes of random kinds on every image: paving-stone and tile joints, "
                            "cast shadows and dark openings, road paint, stains, plant stems and leaves, dark frame edges, "
                            "watermark bars and vignetting; masks still label crack pixels only")
    synth.add_argument("--workers", type=checked(int, AT_LEAST_ONE), default=1, help="processes generating images in parallel")
    synth.add_argument("--overwrite", action="store_true", help="replace files already in OUT")
    synth.add_argument("--later-visit", type=local_path, metavar="EARLIER", help="instead, write a later inspection of the spots of EARLIER (a dataset written by crackseg synth) under the same names: the camera moved a little, some cracks grew wider or longer, some were repaired, now and then a new one appeared; OUT/truth.json lists these true changes per image (--count, --size, --truth, --crack-free and --hard-negatives do not apply)")
    synth.set_defaults(handler=_cmd_synth)

    inspect = commands.add_parser(
        "inspect",
        help="check a dataset and summarize it",
        description=(
            "Pair images and masks by file stem, decode every file completely, and report: counts per\n"
            "split, image sizes, crack-pixel fraction, the crack pixel weights training would use, and\n"
            "every problem (unmatched files, size mismatches, unreadable or truncated files).\n"
            "Exit status 0 when clean, 1 when problems were found."
        ),
        formatter_class=HelpFormatter,
    )
    add_data_options(inspect)
    inspect.set_defaults(handler=_cmd_inspect)


def _cmd_synth(args: argparse.Namespace) -> int:
    from crackseg.data.later_visit import write_later_visit
    from crackseg.data.synth import SynthOptions, write_dataset

    if args.later_visit is not None:
        stems = write_later_visit(args.out, args.later_visit, args.seed, overwrite=args.overwrite, workers=args.workers)
        print(f"wrote a later visit of the {len(stems)} images of {args.later_visit}, their masks and truth.json to {args.out}")
        return 0
    options = SynthOptions(truth=args.truth, crack_free=args.crack_free, hard_negatives=args.hard_negatives)
    stems = write_dataset(args.out, args.count, args.size, args.seed, options, overwrite=args.overwrite, workers=args.workers)
    height, width = args.size
    print(f"wrote {len(stems)} images of {height}x{width} px and their masks to {args.out}")
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from crackseg.data.datasets import inspection_report, make_split, open_dataset

    found = open_dataset(args.root, args.images and Path(args.images), args.masks and Path(args.masks), args.mask_pattern)
    split = make_split([sample.stem for sample in found.samples], args.val_fraction, args.seed, found.listed)
    print(inspection_report(found, split, args.val_fraction))
    return 1 if found.problems else 0
