"""``crackseg <command>``: argument parsing only; each command calls one library function.

User mistakes raise :class:`~crackseg.errors.InputError` and end as one line on stderr
with exit status 2; a run that cannot go on (:class:`~crackseg.errors.RunError`, or an
OSError such as a full disk) ends as one line with exit status 1; anything else is a
bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from crackseg import __version__
from crackseg.config import (
    AMP_CHOICES,
    AT_LEAST_ONE,
    BACKENDS,
    EXPORT_FORMATS,
    FRACTION,
    GROUPS,
    JOIN_GAP,
    LABEL_FORMATS,
    MAX_PIXELS,
    MIN_LENGTH,
    NON_NEGATIVE,
    POSITIVE,
    STREAM_ABOVE,
    TILE,
    TILE_OVERLAP,
    TOLERANCE,
    TTA_CHOICES,
    InferenceOptions,
    Range,
    flag,
    option_fields,
    parse_length,
)
from crackseg.errors import InputError, RunError


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the layout of descriptions; appends an option's default where it tells something."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default is None or action.default is False or action.default == argparse.SUPPRESS \
                or not action.option_strings:
            return text
        return text + " (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """A mistake on the command line is one line, like every other user error; the usage is for --help."""

    def error(self, message: str):
        self.exit(2, f"crackseg: error: {message} (see {self.prog} --help)\n")


def _size(text: str) -> tuple[int, int]:
    from crackseg.synth import parse_size

    try:
        return parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _length(text: str) -> str:
    from crackseg.config import parse_length

    try:
        parse_length(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _width_classes(text: str) -> str:
    from crackseg.measure import WidthClasses

    try:
        WidthClasses.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _cmd_synth(args: argparse.Namespace) -> int:
    from crackseg.synth import write_dataset, write_later_visit

    if args.later_visit is not None:
        stems = write_later_visit(args.out, args.later_visit, args.seed, overwrite=args.overwrite, workers=args.workers)
        print(f"wrote a later visit of the {len(stems)} images of {args.later_visit}, their masks and truth.json to {args.out}")
        return 0
    stems = write_dataset(
        args.out, args.count, args.size, args.seed, truth=args.truth, overwrite=args.overwrite, workers=args.workers
    )
    height, width = args.size
    print(f"wrote {len(stems)} images of {height}x{width} px and their masks to {args.out}")
    return 0


def _add_data_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("dataset")
    group.add_argument("root", type=Path, nargs="?", help="dataset folder holding images/ and masks/ (see data/README.md)")
    for item, kind in option_fields():
        if item.name in ("images", "masks", "mask_pattern", "val_fraction", "seed"):
            _add_option(group, item, kind)


def _cmd_inspect(args: argparse.Namespace) -> int:
    from crackseg.data import inspection_report, make_split, open_dataset

    found = open_dataset(args.root, args.images and Path(args.images), args.masks and Path(args.masks), args.mask_pattern)
    split = make_split([sample.stem for sample in found.samples], args.val_fraction, args.seed, found.listed)
    print(inspection_report(found, split, args.val_fraction))
    return 1 if found.problems else 0


def _cmd_convert(args: argparse.Namespace) -> int:
    from crackseg.checkpoint import convert_classic

    model = convert_classic(args.classic, args.arch, args.out, threshold=args.threshold, overwrite=args.overwrite)
    print(f"wrote {args.out}: {model.arch} ({model.encoder} encoder), threshold {model.threshold}")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from crackseg.export import export_model

    written = export_model(args.checkpoint, args.format, args.out, overwrite=args.overwrite)
    print(f"wrote {written} ({args.format})")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from crackseg.report import write_report

    print(f"report written to {write_report(args.predictions, args.evaluation)}")
    return 0


def _cmd_labels_import(args: argparse.Namespace) -> int:
    from crackseg.labels import ImportOptions, import_labels, import_summary

    options = ImportOptions(args.line_width, tuple(args.label or ["crack"]), args.overwrite)
    provenance = import_labels(args.annotations, args.format, args.images, args.out, options)
    print(import_summary(provenance, args.out))
    return 0


def _cmd_labels_export(args: argparse.Namespace) -> int:
    from crackseg.labels import export_labels

    written = export_labels(args.predictions, args.format, args.out, args.rle, args.overwrite, args.image_prefix)
    print(f"wrote {written['out']}: {written['images']} images as {args.format} {written['shapes']}"
          + (f"; {written['rasters_left_out']} rasters predicted by windows left out" if written["rasters_left_out"] else ""))
    return 0


def _cmd_labels_rank(args: argparse.Namespace) -> int:
    from crackseg.labels import rank_predictions

    ranked, rasters = rank_predictions(args.predictions, args.threshold)
    for row in ranked[: args.top]:
        print(f"{row['rank']:>4}  {row['uncertainty']:.4f}  {row['unsure_crack_share']:.3f}  {row['path']}")
    print(f"rank.csv written to {args.predictions} ({len(ranked)} images, columns: rank, path, uncertainty, unsure_crack_share)"
          + (f"; {rasters} rasters predicted by windows left out" if rasters else ""))
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from crackseg.compare import CompareOptions, compare_inspections

    if args.register is None and (args.before_date or args.after_date):
        raise InputError("--before-date and --after-date date the surveys of --register SITE.gpkg; give --register too")
    options = CompareOptions(args.px_size, args.width_classes, args.pairs, args.vectors, args.report, args.register,
                             (args.before_date, args.after_date), args.transform, args.overwrite)
    summary = compare_inspections(args.before, args.after, args.out, options)
    counts = ", ".join(f"{count} {status}" for status, count in summary["cracks"].items() if count)
    print(f"{summary['registered']} of {summary['pairs']} pairs compared ({counts or 'no cracks'}); "
          f"{len(summary['unregistered'])} not registered; written to {args.out}")
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from crackseg.config import TrainConfig
    from crackseg.train import fit

    names = {item.name for item, _ in option_fields()}
    fit(TrainConfig(**{key: value for key, value in vars(args).items() if key in names}))
    return 0


def _checked(kind: type, valid: Range | None, parse=None):
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


def _add_train_options(parser: argparse.ArgumentParser) -> None:
    """One flag per TrainConfig field, grouped as crackseg.config groups them."""
    groups = {name: parser.add_argument_group(name) for name in GROUPS}
    for item, kind in option_fields():
        _add_option(groups[item.metadata["group"]], item, kind)


def _add_option(group, item: dataclasses.Field, kind: type) -> None:
    """The flag of one TrainConfig field: default, choices, range and help all come from crackseg.config."""
    meta = item.metadata
    text = meta["help"].replace("%", "%%")
    if kind is bool:
        group.add_argument(flag(item.name), action="store_true", help=text)
        return
    required = item.default is dataclasses.MISSING
    group.add_argument(
        flag(item.name), type=_checked(kind, meta["valid"], meta["flag_type"]), choices=meta["choices"],
        default=None if required else item.default, required=required, help=text,
        metavar=None if meta["choices"] else item.name.upper(),
    )


def _add_inference_options(parser: argparse.ArgumentParser, title: str) -> None:
    """The flags of crackseg.config.InferenceOptions, declared once for predict and evaluate."""
    group = parser.add_argument_group(title)
    group.add_argument("--tile", type=_checked(int, AT_LEAST_ONE), default=TILE, help="tile side in px; larger images run as overlapping tiles")
    group.add_argument("--overlap", type=_checked(int, NON_NEGATIVE), default=TILE_OVERLAP,
                       help="overlap between neighbouring tiles in px, blended smoothly (less than --tile)")
    group.add_argument("--batch-size", type=_checked(int, AT_LEAST_ONE), default=None,
                       help="tiles per forward pass; tiles of several images share a batch (default 8 on a GPU, 1 on CPU, where batches ran slower)")
    group.add_argument("--tta", choices=TTA_CHOICES, default="none", help="average probabilities over a horizontal flip, or all 8 flips and rotations")
    group.add_argument("--resize", type=_size, default=None,
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


def _inference_options(args: argparse.Namespace) -> InferenceOptions:
    return InferenceOptions(**{item.name: getattr(args, item.name) for item in dataclasses.fields(InferenceOptions)})


def _cmd_predict(args: argparse.Namespace) -> int:
    from crackseg.predict import PredictOptions, predict_folder

    fields = {item.name for item in dataclasses.fields(PredictOptions)} - {"inference"}
    options = PredictOptions(inference=_inference_options(args), **{key: value for key, value in vars(args).items() if key in fields})
    return predict_folder(args.checkpoint, args.inputs, options)


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from crackseg.evaluate import Scoring, evaluate_checkpoint, evaluate_files, format_table, write_report
    from crackseg.files import ensure_writable_folder

    if args.out is not None and (args.out / "report.json").exists() and not args.overwrite:
        raise InputError(f"{args.out / 'report.json'} already exists; choose another --out or pass --overwrite")
    if args.out is not None:
        ensure_writable_folder(args.out, "--out")
    inference = _inference_options(args)
    scoring = Scoring(args.protocol, args.min_length, args.join_gap)
    if args.checkpoint is not None:
        if args.data is None:
            raise InputError("--checkpoint needs --data ROOT (and --split, default test)")
        report = evaluate_checkpoint(args.checkpoint, args.data, args.split or "test", args.tolerance, args.threshold, inference, scoring)
    elif args.pred is not None and args.gt is not None:
        split = Path(args.split) if args.split else None
        report = evaluate_files(args.pred, args.gt, split, args.tolerance, 0.5 if args.threshold is None else args.threshold, scoring)
    else:
        raise InputError("give --pred DIR and --gt DIR, or --checkpoint FILE and --data ROOT")
    print(format_table(report))
    if args.out is not None:
        write_report(report, args.out)
        print(f"report written to {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
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
    synth.add_argument("--count", type=_checked(int, AT_LEAST_ONE), default=64, help="number of images")
    synth.add_argument("--size", type=_size, default="256", help="image size in px: N or HxW (height x width)")
    synth.add_argument("--seed", type=_checked(int, NON_NEGATIVE), default=0, help="random seed")
    synth.add_argument("--truth", action="store_true", help="also write truth.json (each crack's nominal length and width in px) and truth/<stem>.png (each crack pixel labelled with its crack's number)")
    synth.add_argument("--workers", type=_checked(int, AT_LEAST_ONE), default=1, help="processes generating images in parallel")
    synth.add_argument("--overwrite", action="store_true", help="replace files already in OUT")
    synth.add_argument("--later-visit", type=Path, metavar="EARLIER", help="instead, write a later inspection of the spots of EARLIER (a dataset written by crackseg synth) under the same names: the camera moved a little, some cracks grew wider or longer, some were repaired, now and then a new one appeared; OUT/truth.json lists these true changes per image (--count, --size and --truth do not apply)")
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
        formatter_class=_HelpFormatter,
    )
    _add_data_options(inspect)
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
    convert.add_argument("--threshold", type=_checked(float, FRACTION), default=0.2, help="decision threshold on crack probability stored in the file (the classic inference default)")
    convert.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    convert.set_defaults(handler=_cmd_convert)

    train = commands.add_parser(
        "train",
        help="train a crack segmentation UNet (one process, or one per GPU via launch.sh)",
        description=(
            "Train on DATA with soft Dice plus pixel-weighted BCE (it beat weighted BCE alone in\n"
            "docs/results.md), validating every epoch on a held-out split with exact metrics over\n"
            "all processes. Checkpoints, config and split go to --run; an interrupted run\n"
            "continues from RUN/last.pt when started again.\n\n"
            "  crackseg train --data data/demo --run checkpoints/demo --encoder-weights none\n"
            "  CUDA_VISIBLE_DEVICES=0,1 ./launch.sh train --data data/cfd --run checkpoints/cfd\n"
            "  ./launch.sh --nproc 2 train --device cpu ...     (two CPU processes, gloo)"
        ),
        formatter_class=_HelpFormatter,
    )
    _add_train_options(train)
    train.set_defaults(handler=_cmd_train)

    predict = commands.add_parser(
        "predict",
        help="predict crack masks for images of any size",
        description=(
            "Write OUT/masks/<name>.png (0 = background, 255 = crack, the input's exact size) for every\n"
            "input, plus OUT/predictions.csv (per image: crack fraction, count, length, widths, area)\n"
            "and OUT/cracks.csv (per connected crack). Images larger than --tile run as overlapping,\n"
            "smoothly blended tiles; nothing is resized unless --resize is given. Unreadable inputs\n"
            "are listed in OUT/errors.csv and the exit status is 1; the rest are still written.\n\n"
            "  crackseg predict --checkpoint checkpoints/demo/best.pt data/photos --out predictions\n"
            "  ./launch.sh predict --checkpoint ... photos/ --out ...   (photos, and each raster's tiles, shared across GPUs)"
        ),
        formatter_class=_HelpFormatter,
    )
    predict.add_argument("inputs", nargs="+", help="image files, folders or glob patterns (quote them)")
    predict.add_argument("--checkpoint", "--model", dest="checkpoint", type=Path, required=True,
                         help="crackseg checkpoint or model file: best.pt, a converted classic file, a safetensors folder, "
                              "or an exported model.onnx / model.xml (see crackseg export)")
    predict.add_argument("--out", type=Path, required=True, help="output folder")
    predict.add_argument("--recursive", action="store_true", help="also read images in sub-folders (output names keep the sub-folders)")
    predict.add_argument("--threshold", type=_checked(float, FRACTION), default=None, help="crack probability threshold (default: the checkpoint's best validation F1 threshold)")
    predict.add_argument("--save-prob", type=int, choices=[8, 16], default=None, help="also write the probability map as 8- or 16-bit OUT/probs/<name>.png (a GeoTIFF, .tif, for rasters read by windows)")
    predict.add_argument("--overlay", action="store_true", help="also write OUT/overlays/<name>.jpg, the photo with cracks tinted red")
    predict.add_argument("--join-gap", type=_length, default=JOIN_GAP,
                         help="bridge gaps up to this long (px, or mm, e.g. 3mm: mm need a pixel size, see --px-size) between pieces of one crack: a skeleton end "
                              "must point at the other piece (within 30 degrees); 0 keeps every piece apart")
    predict.add_argument("--min-length", type=_length, default=MIN_LENGTH,
                         help="leave cracks shorter than this (px or mm) out of cracks.csv, the overlays and the counts; the mask keeps their pixels")
    predict.add_argument("--width-classes", type=_width_classes, default=None,
                         help="class each crack by its max and mean width: bre251 (BRE Digest 251: <=0.1, 1, 5, 15, 25, >25 mm), "
                              "aci224 (ACI 224R tolerable widths 0.10, 0.15, 0.18, 0.30, 0.41 mm) or your edges in mm, e.g. 0.1,0.2,0.3,1.0; needs a pixel size, see --px-size")
    predict.add_argument("--px-size", type=_checked(float, POSITIVE), default=None, help="pixel size in mm: measurements are also reported in mm; a georeferenced raster in a projected CRS "
                              "carries its own, which this overrides")
    predict.add_argument("--no-measure", dest="measure", action="store_false",
                         help="skip crack length and width measurements (no cracks.csv): the fastest way to masks (measuring costs CPU time per image, see docs/benchmarks.md)")
    predict.add_argument("--report", action="store_true", help="also write OUT/report.html (see crackseg report)")
    predict.add_argument("--vectors", choices=("geojson", "gpkg"), default=None,
                         help="also write OUT/vectors/<name>.geojson|gpkg: one feature per crack, its centreline in map coordinates "
                              "(pixel coordinates for photos), with cracks.csv's columns (needs the geo extra)")
    predict.add_argument("--max-pixels", type=_checked(int, AT_LEAST_ONE), default=MAX_PIXELS,
                         help=f"refuse rasters larger than this many pixels (default {MAX_PIXELS:.0e}); GeoTIFFs and TIFFs over "
                              f"{STREAM_ABOVE / 1e6:.0f} megapixels are predicted by windows, in memory that does not grow with their area")
    predict.add_argument("--overviews", action="store_true", help="add overviews to GeoTIFF outputs, so GIS software opens them fast")
    predict.add_argument("--skip-existing", action="store_true", help="keep masks already in OUT and predict the rest (finishes an interrupted batch)")
    predict.add_argument("--overwrite", action="store_true", help="replace outputs already in OUT")
    predict.add_argument("--workers", type=_checked(int, NON_NEGATIVE), default=None,
                         help="decoding processes and writer threads (0: all in the main process; default: 0 on CPU, where the model's threads use every core, else CPU cores / processes - 1, at most 8)")
    _add_inference_options(predict, "inference")
    predict.set_defaults(handler=_cmd_predict)

    export = commands.add_parser(
        "export",
        help="export a model to ONNX, OpenVINO IR or safetensors, for prediction without PyTorch",
        description=(
            "Write the model of CHECKPOINT for other runtimes. ONNX and OpenVINO models take uint8 RGB\n"
            "images (N, 3, H, W) of any size (normalization and padding inside) and return crack\n"
            "probabilities (N, 1, H, W); the threshold, architecture, encoder and size divisor are\n"
            "stored as metadata. safetensors writes a folder (config.json + model.safetensors) that\n"
            "predict, evaluate and crackseg.load_model read without unpickling anything.\n\n"
            "  crackseg export checkpoints/cfd/best.pt --format onnx --out cfd.onnx\n"
            "  crackseg predict --model cfd.onnx photos/ --out predictions    (ONNX Runtime)"
        ),
        formatter_class=_HelpFormatter,
    )
    export.add_argument("checkpoint", type=Path, help="crackseg checkpoint, model file or safetensors folder")
    export.add_argument("--format", required=True, choices=EXPORT_FORMATS, help="onnx (pip install 'crackseg[onnx]'), openvino "
                        "(float32 IR, pip install 'crackseg[openvino]') or safetensors")
    export.add_argument("--out", type=Path, required=True, help="model.onnx, model.xml (model.bin is written beside it) or a folder for safetensors")
    export.add_argument("--overwrite", action="store_true", help="replace --out if it exists (by default an existing --out is an error)")
    export.set_defaults(handler=_cmd_export)

    report = commands.add_parser(
        "report",
        help="write report.html for a predictions folder: summary, sortable images, overlays, crack tables",
        description=(
            "Write PREDICTIONS/report.html: one self-contained page that opens from the file system in\n"
            "any browser, with the run's summary (images, cracks, total length, widest crack, length per\n"
            "width class), a sortable, paginated table of images with thumbnails, and per image the photo\n"
            "with its overlay (a toggle) and its crack table. Pictures go to PREDICTIONS/report/ once.\n\n"
            "  crackseg report predictions/ --evaluation reports/cfd"
        ),
        formatter_class=_HelpFormatter,
    )
    report.add_argument("predictions", type=Path, help="folder written by crackseg predict")
    report.add_argument("--evaluation", type=Path, default=None, help="folder written by crackseg evaluate --out: adds scores, the PR curve and the worst images (default: none, predictions only)")
    report.set_defaults(handler=_cmd_report)

    _add_labels_parser(commands)
    _add_compare_parser(commands)

    evaluate = commands.add_parser(
        "evaluate",
        help="score predictions against ground truth (P, R, F1, IoU, mIoU, ODS, OIS, AP)",
        description=(
            "Score saved predictions (binary masks or 8/16-bit probability maps named like the ground\n"
            "truth) or a checkpoint run on a dataset split. Reports dataset-level precision, recall,\n"
            "F1, crack and background IoU and mIoU, per-image means, ODS, OIS and AP, or a paper's own\n"
            "figures with --protocol; photos whose ground truth has no crack also apart (how many get a\n"
            "predicted crack). With --out, report.json, report.md, per_image.csv (worst first), and\n"
            "pr_curve.csv and pr_curve.png where the protocol has a precision-recall curve.\n\n"
            "  crackseg evaluate --pred predictions/probs --gt data/cfd/masks --split data/cfd/test.txt --tolerance 2\n"
            "  crackseg evaluate --checkpoint checkpoints/cfd/best.pt --data data/cfd --split test --out reports/cfd"
        ),
        formatter_class=_HelpFormatter,
    )
    evaluate.add_argument("--pred", type=Path, help="folder of predicted masks or probability maps (<stem>.png)")
    evaluate.add_argument("--gt", type=Path, help="folder of ground-truth masks (<stem>.*)")
    evaluate.add_argument("--checkpoint", "--model", dest="checkpoint", type=Path,
                          help="predict with this checkpoint (or safetensors folder, .onnx, .xml) instead of reading --pred")
    evaluate.add_argument("--data", type=Path, help="dataset root for --checkpoint")
    evaluate.add_argument("--split", default=None, help="file of stems to score; with --checkpoint also a split name (test, val, train: ROOT/NAME.txt) or all (default test)")
    evaluate.add_argument("--tolerance", type=_checked(float, TOLERANCE), default=0.0, help=f"pixel tolerance for precision / recall / F1, {TOLERANCE.describe()} (0 = exact pixels; papers often use 2)")
    evaluate.add_argument("--threshold", type=_checked(float, FRACTION), default=None, help="operating threshold on probabilities (default 0.5 for files, the checkpoint's for --checkpoint)")
    evaluate.add_argument("--protocol", choices=("crackseg", "scsegamba", "deepsegmentor", "omnicrack"), default="crackseg",
                          help="whose evaluation code to reproduce: crackseg (the figures listed above), scsegamba (SCSegamba / MixerCSeg: "
                               "each map divided by its maximum, per-image F1 averaged for ODS, mIoU per image), deepsegmentor "
                               "(DeepCrack: counts summed over images, I/U, G, C at the best of 100 thresholds), omnicrack "
                               "(OmniCrack30k: centreline IoU within 4 px); report.md defines each figure, docs/results.md compares them")
    evaluate.add_argument("--min-length", type=_checked(float, NON_NEGATIVE), default=parse_length(MIN_LENGTH)[0],
                          help="px: on photos whose ground truth has no crack, predicted cracks shorter than this are not counted (predict's --min-length)")
    evaluate.add_argument("--join-gap", type=_checked(float, NON_NEGATIVE), default=parse_length(JOIN_GAP)[0],
                          help="px: pieces of a predicted crack are joined across gaps up to this long before counting cracks on crack-free photos (predict's --join-gap)")
    evaluate.add_argument("--out", type=Path, default=None, help="folder for the report files")
    evaluate.add_argument("--overwrite", action="store_true", help="replace a report already in --out")
    _add_inference_options(evaluate, "inference (with --checkpoint)")
    evaluate.set_defaults(handler=_cmd_evaluate)
    return parser


def _add_labels_parser(commands) -> None:
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
        formatter_class=_HelpFormatter,
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
        formatter_class=_HelpFormatter,
    )
    imports.add_argument("annotations", type=Path, help="COCO .json, labelme .json file or folder of them, CVAT for images 1.1 .xml, "
                         "or Label Studio JSON export")
    imports.add_argument("--format", required=True, choices=LABEL_FORMATS, help="the annotation file's format")
    imports.add_argument("--images", type=Path, required=True, help="folder holding the photos the file names (sub-folders searched)")
    imports.add_argument("--out", type=Path, required=True, help="dataset folder to write")
    imports.add_argument("--line-width", type=_checked(int, AT_LEAST_ONE), default=None,
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
        formatter_class=_HelpFormatter,
    )
    exports.add_argument("predictions", type=Path, help="folder written by crackseg predict")
    exports.add_argument("--format", required=True, choices=LABEL_FORMATS, help="the labelling tool's format")
    exports.add_argument("--out", type=Path, required=True, help="file to write (a folder for labelme)")
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
        formatter_class=_HelpFormatter,
    )
    rank.add_argument("predictions", type=Path, help="folder written by crackseg predict --save-prob 8|16")
    rank.add_argument("--top", type=_checked(int, AT_LEAST_ONE), default=10, help="photos to print; rank.csv lists all")
    rank.add_argument("--threshold", type=_checked(float, FRACTION), default=None,
                      help="decision threshold on crack probability (default: the one predict used, from summary.json)")
    rank.set_defaults(handler=_cmd_labels_rank)


def _add_compare_parser(commands) -> None:
    compare = commands.add_parser(
        "compare",
        help="compare two inspections of one structure: which cracks are new, longer, wider or gone",
        description=(
            "Compare two inspections of one structure. BEFORE and AFTER are each a folder written by\n"
            "crackseg predict, or a dataset folder (images/ + masks/). Images pair by relative name\n"
            "(--pairs CSV when names differ); a name on one side only is listed, not compared.\n\n"
            "Georeferenced rasters align by their map coordinates; photos of the same spot are\n"
            "registered by ORB features and RANSAC on a reduced copy. A pair that cannot be registered\n"
            "reliably is reported as 'unregistered' and not compared. Cracks are measured as predict\n"
            "measures them and matched by their centrelines; each gets a status: unchanged, longer,\n"
            "wider, longer+wider, merged, split, new or gone.\n\n"
            "Writes OUT/changes.csv (a row per crack), OUT/pairs.csv (a row per pair), OUT/summary.json;\n"
            "--vectors a change layer per pair, --report OUT/report.html, --register SITE.gpkg a\n"
            "GeoPackage that accumulates the surveys of one site.\n\n"
            "  crackseg compare visit1/ visit2/ --out changes/ --px-size 0.2 --report\n"
            "  crackseg compare visit2/ visit3/ --out changes23/ --register site.gpkg --before-date 2025-05-01 --after-date 2026-05-03"
        ),
        formatter_class=_HelpFormatter,
    )
    compare.add_argument("before", type=Path, help="the earlier inspection: a predictions folder or a dataset folder")
    compare.add_argument("after", type=Path, help="the later inspection, the same kinds")
    compare.add_argument("--out", type=Path, required=True, help="folder for changes.csv, pairs.csv, summary.json (created if missing)")
    compare.add_argument("--px-size", type=_checked(float, POSITIVE), default=None,
                         help="mm per pixel of the AFTER photos: widths and lengths also in mm (BEFORE photos through the registration's "
                              "scale); georeferenced rasters use their own pixel size")
    compare.add_argument("--width-classes", type=_width_classes, default=None,
                         help="report each crack's max-width class before and after and whether it changed: bre251, aci224 or edges "
                              "in mm (as predict); needs a pixel size")
    compare.add_argument("--pairs", type=Path, default=None, help="CSV with a header 'before,after': the photo paths (or names) to pair")
    compare.add_argument("--transform", choices=("similarity", "affine", "homography"), default="similarity",
                         help="how photos may differ: similarity (shift, rotation, scale), affine, or homography (another viewpoint on a plane)")
    compare.add_argument("--vectors", choices=("geojson", "gpkg"), default=None,
                         help="also write OUT/vectors/<name>.geojson|gpkg: each crack's centreline with its status (gone cracks: "
                              "their BEFORE centreline), in map coordinates for rasters, else the AFTER image's pixels")
    compare.add_argument("--report", action="store_true", help="also write OUT/report.html: each pair side by side, cracks coloured by status")
    compare.add_argument("--register", type=Path, default=None,
                         help="a GeoPackage crack register of the site (created if missing): adds both surveys, their cracks and the "
                              "links between a crack and its successor (see README: Monitoring a structure over time)")
    compare.add_argument("--before-date", default=None, help="date of the BEFORE survey, YYYY-MM-DD (default: the EXIF DateTimeOriginal of its photos)")
    compare.add_argument("--after-date", default=None, help="date of the AFTER survey, YYYY-MM-DD (default: from EXIF, as for BEFORE)")
    compare.add_argument("--overwrite", action="store_true", help="replace the tables of an earlier compare in --out")
    compare.set_defaults(handler=_cmd_compare)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--"]:  # torchrun ... -m crackseg -- train ...: some Pythons pass the "--" on
        argv = argv[1:]
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except InputError as error:
        parser.exit(2, f"crackseg: error: {error}\n")
    except RunError as error:
        parser.exit(1, f"crackseg: error: {error}\n")
    except OSError as error:  # the machine, not the input: a full disk, a vanished mount
        where = f"{error.filename}: " if error.filename else ""
        parser.exit(1, f"crackseg: error: {where}{error.strerror or error}\n")
    except KeyboardInterrupt:
        print("crackseg: interrupted", file=sys.stderr)
        return 130
