"""``crackseg labels import|export|rank``: the labelling tools' files in and out, and what to label next."""

from __future__ import annotations

import argparse

from crackseg.cli.options import HelpFormatter, checked, local_path
from crackseg.core.config import AT_LEAST_ONE, FRACTION
from crackseg.labels.formats.reading import LABEL_FORMATS


def add_commands(commands) -> None:
    labels = commands.add_parser(
        "labels",
        help="import annotations from labelling tools, export predictions as pre-annotations, rank what to label next",
        description=(
            "Your own labels, in the labelling tools' own files: COCO, labelme, CVAT for images 1.1\n"
            "and Label Studio JSON, each read in its tool's coordinates (a crack traced as a polygon\n"
            "comes back as wide as traced). Shapes labelled crack (any case) are crack by default\n"
            "(import --label picks others).\n\n"
            "  crackseg labels import annotations.xml --format cvat --images photos/ --out data/site\n"
            "  crackseg labels export predictions/ --format cvat --out pre-annotations.xml\n"
            "  crackseg labels rank predictions/ --top 20      (predict with --save-prob first)"
        ),
        formatter_class=HelpFormatter,
    )
    actions = labels.add_subparsers(dest="action", metavar="ACTION", required=True)
    imports = actions.add_parser(
        "import", help="annotation file + photos -> a crackseg dataset (images/, masks/, labels.json)",
        description=(
            "Write OUT/images/ (the photos, hard-linked), OUT/masks/<stem>.png (0 = background, 255 =\n"
            "crack) and OUT/labels.json (source, format, labels used, and counts: shapes per kind,\n"
            "clipped, zero-area, labels left out, images not listed), ready for inspect and train.\n"
            "Photos the file lists without a crack get empty masks; photos it does not list are left out."
        ),
        formatter_class=HelpFormatter,
    )
    imports.add_argument("annotations", type=local_path, help="COCO .json, labelme .json file or folder of them, CVAT for images 1.1 .xml, "
                         "or Label Studio JSON export")
    imports.add_argument("--format", required=True, choices=LABEL_FORMATS, help="the annotation file's format")
    imports.add_argument("--images", type=local_path, required=True, help="folder holding the photos the file names (sub-folders searched)")
    imports.add_argument("--out", type=local_path, required=True, help="dataset folder to write")
    imports.add_argument("--line-width", type=checked(int, AT_LEAST_ONE), default=None,
                         help="px: width to draw lines (CVAT polylines, labelme lines and linestrips) with; required when the "
                              "file has lines; a CVAT polyline's own 'width' attribute wins")
    imports.add_argument("--label", action="append", default=None, metavar="NAME",
                         help="a label name that is crack, compared case-insensitively; repeat for several (default: crack); "
                              "other labels are left out and counted")
    imports.add_argument("--overwrite", action="store_true", help="replace a dataset already in --out")
    imports.set_defaults(handler=_cmd_labels_import)

    exports = actions.add_parser(
        "export", help="a predictions folder -> pre-annotations to correct in the labelling tool",
        description=(
            "Turn PREDICTIONS/masks/ into one crack shape per connected crack: polygons, simplified by\n"
            "at most 0.2 px so they draw the mask back exactly (holes: a zero-width cut in COCO, CVAT\n"
            "and Label Studio polygons; a mask shape in labelme), or with --rle COCO RLE, CVAT <mask>,\n"
            "labelme masks, Label Studio brushes. Images are named by their path below predict's input.\n"
            "coco, cvat, labelstudio: OUT is one file; labelme: OUT is a folder of <name>.json, to sit\n"
            "beside the photos (e.g. --out photos/)."
        ),
        formatter_class=HelpFormatter,
    )
    exports.add_argument("predictions", type=local_path, help="folder written by crackseg predict")
    exports.add_argument("--format", required=True, choices=LABEL_FORMATS, help="the labelling tool's format")
    exports.add_argument("--out", type=local_path, required=True, help="file to write (a folder for labelme)")
    shapes = exports.add_mutually_exclusive_group()
    shapes.add_argument("--polygons", dest="rle", action="store_false", default=False, help="crack outlines as polygons, editable by vertex (the default)")
    shapes.add_argument("--rle", dest="rle", action="store_true", help="crack pixels exactly, as masks / brushes")
    exports.add_argument("--image-prefix", default="", help="text put before every image name in the file, e.g. "
                         "/data/local-files/?d=photos/ for Label Studio's local storage")
    exports.add_argument("--overwrite", action="store_true", help="replace files already at --out")
    exports.set_defaults(handler=_cmd_labels_export)

    rank = actions.add_parser(
        "rank", help="order predicted photos by how unsure the model was: label the top first",
        description=(
            "Read PREDICTIONS/probs/ (predict --save-prob) and write PREDICTIONS/rank.csv, most unsure\n"
            "first. uncertainty: the share of the photo's pixels whose crack probability is nearer the\n"
            "decision threshold t than the sure answer (between t/2 and (1+t)/2); unsure_crack_share:\n"
            "the share of its crack pixels that are unsure. predictions.csv has the same columns."
        ),
        formatter_class=HelpFormatter,
    )
    rank.add_argument("predictions", type=local_path, help="folder written by crackseg predict --save-prob 8|16")
    rank.add_argument("--top", type=checked(int, AT_LEAST_ONE), default=10, help="photos to print; rank.csv lists all")
    rank.add_argument("--threshold", type=checked(float, FRACTION), default=None,
                      help="decision threshold on crack probability (default: the one predict used, from summary.json)")
    rank.set_defaults(handler=_cmd_labels_rank)


def _cmd_labels_import(args: argparse.Namespace) -> int:
    from crackseg.labels.loop import ImportOptions, import_labels, import_summary

    options = ImportOptions(args.line_width, tuple(args.label or ["crack"]), args.overwrite)
    provenance = import_labels(args.annotations, args.format, args.images, args.out, options)
    print(import_summary(provenance, args.out))
    return 0


def _cmd_labels_export(args: argparse.Namespace) -> int:
    from crackseg.labels.loop import export_labels

    written = export_labels(args.predictions, args.format, args.out, args.rle, args.overwrite, args.image_prefix)
    print(f"wrote {written['out']}: {written['images']} images as {args.format} {written['shapes']}"
          + (f"; {written['rasters_left_out']} rasters predicted by windows left out" if written["rasters_left_out"] else ""))
    return 0


def _cmd_labels_rank(args: argparse.Namespace) -> int:
    from crackseg.labels.loop import rank_predictions

    ranked, rasters = rank_predictions(args.predictions, args.threshold)
    for row in ranked[: args.top]:
        print(f"{row['rank']:>4}  {row['uncertainty']:.4f}  {row['unsure_crack_share']:.3f}  {row['path']}")
    print(f"rank.csv written to {args.predictions} ({len(ranked)} images, columns: rank, path, uncertainty, unsure_crack_share)"
          + (f"; {rasters} rasters predicted by windows left out" if rasters else ""))
    return 0
