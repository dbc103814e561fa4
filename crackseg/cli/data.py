"""``crackseg synth`` and ``crackseg inspect``: datasets written and checked."""

from __future__ import annotations

from pathlib import Path

from crackseg.cli.options import add_command
from crackseg.data.options import SynthCommand
from crackseg.training.options import InspectOptions


def add_commands(commands) -> None:
    add_command(
        commands, "synth", "write a synthetic crack dataset (demo data, test fixtures)",
        (
            "Write OUT/images/<stem>.jpg and OUT/masks/<stem>.png (0 = background, 255 = crack):\n"
            "concrete/asphalt textures with branching cracks 1-10 px wide, crack-like distractors\n"
            "that are not labelled, and about 15% crack-free images (--crack-free). --hard-negatives\n"
            "adds stronger look-alikes to every image; with --crack-free 1 it writes crack-free\n"
            "look-alike photos with empty masks, hard negatives for training. The same seed gives\n"
            "byte-identical files."
        ),
        SynthCommand, _cmd_synth,
    )

    add_command(
        commands, "inspect", "check a dataset and summarize it",
        (
            "Pair images and masks by file stem, decode every file completely, and report: counts per\n"
            "split, image sizes, crack-pixel fraction, the crack pixel weights training would use, and\n"
            "every problem (unmatched files, size mismatches, unreadable or truncated files).\n"
            "Exit status 0 when clean, 1 when problems were found."
        ),
        InspectOptions, _cmd_inspect, "dataset",
    )


def _cmd_synth(command: SynthCommand) -> int:
    from crackseg.data.later_visit import write_later_visit
    from crackseg.data.synth import write_dataset

    if command.later_visit is not None:
        stems = write_later_visit(command.out, command.later_visit, command.seed, overwrite=command.overwrite,
                                  workers=command.workers)
        print(f"wrote a later visit of the {len(stems)} images of {command.later_visit}, their masks and truth.json to {command.out}")
        return 0
    stems = write_dataset(command.out, command.count, command.size, command.seed, command.options, overwrite=command.overwrite,
                          workers=command.workers)
    height, width = command.size
    print(f"wrote {len(stems)} images, {width} px wide and {height} px high, and their masks to {command.out}")
    return 0


def _cmd_inspect(options: InspectOptions) -> int:
    from crackseg.data.datasets import inspection_report, open_dataset
    from crackseg.data.splits import make_split

    images, masks = (None if value is None else Path(value) for value in (options.images, options.masks))
    found = open_dataset(options.root, images, masks, options.mask_pattern)
    split = make_split([sample.stem for sample in found.samples], options.val_fraction, options.seed, found.listed)
    print(inspection_report(found, split, options.val_fraction))
    return 1 if found.problems else 0
