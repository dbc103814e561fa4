"""``crackseg labels import|export|rank``: the labelling tools' files in and out, and what to label next."""

from __future__ import annotations

from crackseg.cli.options import add_command
from crackseg.labels.options import LabelExport, LabelImport, LabelRank


def add_commands(commands) -> None:
    labels = add_command(
        commands, "labels", "import annotations from labelling tools, export predictions as pre-annotations, rank what to label next",
        (
            "Your own labels, in the labelling tools' own files: COCO, labelme, CVAT for images 1.1\n"
            "and Label Studio JSON, each read in its tool's coordinates (a crack traced as a polygon\n"
            "comes back as wide as traced). Shapes labelled crack (any case) are crack by default\n"
            "(import --label picks others).\n\n"
            "  crackseg labels import annotations.xml --format cvat --images photos/ --out data/site\n"
            "  crackseg labels export predictions/ --format cvat --out pre-annotations.xml\n"
            "  crackseg labels rank predictions/ --top 20      (predict with --save-prob first)"
        ),
    )
    actions = labels.add_subparsers(dest="action", metavar="ACTION", required=True)
    add_command(
        actions, "import", "annotation file + photos -> a crackseg dataset (images/, masks/, labels.json)",
        (
            "Write OUT/images/ (the photos, hard-linked), OUT/masks/<stem>.png (0 = background, 255 =\n"
            "crack) and OUT/labels.json (source, format, labels used, and counts: shapes per kind,\n"
            "clipped, zero-area, labels left out, images not listed), ready for inspect and train.\n"
            "Photos the file lists without a crack get empty masks; photos it does not list are left out."
        ),
        LabelImport, _cmd_labels_import,
    )

    add_command(
        actions, "export", "a predictions folder -> pre-annotations to correct in the labelling tool",
        (
            "Turn PREDICTIONS/masks/ into one crack shape per connected crack: polygons, simplified by\n"
            "at most 0.2 px so they draw the mask back exactly (holes: a zero-width cut in COCO, CVAT\n"
            "and Label Studio polygons; a mask shape in labelme), or with --rle COCO RLE, CVAT <mask>,\n"
            "labelme masks, Label Studio brushes. Images are named by their path below predict's input.\n"
            "coco, cvat, labelstudio: OUT is one file; labelme: OUT is a folder of <name>.json, to sit\n"
            "beside the photos (e.g. --out photos/)."
        ),
        LabelExport, _cmd_labels_export,
    )

    add_command(
        actions, "rank", "order predicted photos by how unsure the model was: label the top first",
        (
            "Read PREDICTIONS/probs/ (predict --save-prob) and write PREDICTIONS/rank.csv, most unsure\n"
            "first. uncertainty: the share of the photo's pixels whose crack probability is nearer the\n"
            "decision threshold t than the sure answer (between t/2 and (1+t)/2); unsure_crack_share:\n"
            "the share of its crack pixels that are unsure. predictions.csv has the same columns."
        ),
        LabelRank, _cmd_labels_rank,
    )


def _cmd_labels_import(command: LabelImport) -> int:
    from crackseg.labels.loop import import_labels, import_summary

    provenance = import_labels(command.annotations, command.format, command.images, command.out, command.options)
    print(import_summary(provenance, command.out))
    return 0


def _cmd_labels_export(command: LabelExport) -> int:
    from crackseg.labels.loop import export_labels

    written = export_labels(command.predictions, command.format, command.out, command.rle, command.overwrite, command.image_prefix)
    print(f"wrote {written['out']}: {written['images']} images as {command.format} {written['shapes']}"
          + (f"; {written['rasters_left_out']} rasters predicted by windows left out" if written["rasters_left_out"] else ""))
    return 0


def _cmd_labels_rank(command: LabelRank) -> int:
    from crackseg.labels.loop import rank_predictions

    ranked, rasters = rank_predictions(command.predictions, command.threshold)
    for row in ranked[: command.top]:
        print(f"{row['rank']:>4}  {row['uncertainty']:.4f}  {row['unsure_crack_share']:.3f}  {row['path']}")
    print(f"rank.csv written to {command.predictions} ({len(ranked)} images, columns: rank, path, uncertainty, unsure_crack_share)"
          + (f"; {rasters} rasters predicted by windows left out" if rasters else ""))
    return 0
