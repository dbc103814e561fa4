"""``crackseg predict``, ``crackseg export`` and ``crackseg report``: masks from a model, the model for other runtimes, the page."""

from __future__ import annotations

import argparse
import dataclasses

from crackseg.cli.options import (
    HelpFormatter,
    add_inference_options,
    checked,
    inference_options,
    length,
    local_path,
    width_classes,
    width_classes_help,
)
from crackseg.core.config import (
    AT_LEAST_ONE,
    EXPORT_FORMATS,
    FRACTION,
    JOIN_GAP,
    MAX_PIXELS,
    MIN_LENGTH,
    NON_NEGATIVE,
    POSITIVE,
    STREAM_ABOVE,
)
from crackseg.cracks.vectors import FORMATS as VECTOR_FORMATS


def add_commands(commands) -> None:
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
            "  crackseg predict --checkpoint best.pt s3://survey/photos/ --out s3://survey/pred/   (pip install 'crackseg[s3]')\n"
            "  ./launch.sh predict --checkpoint ... photos/ --out ...   (photos, and each raster's tiles, shared across GPUs)\n"
            "  crackseg predict --engine ray --ray-address auto --checkpoint best.pt s3://survey/photos/ --out s3://survey/pred/"
        ),
        formatter_class=HelpFormatter,
    )
    predict.add_argument("inputs", nargs="+", help="image files, folders or glob patterns (quote them); photos in object storage: "
                         "s3://bucket/prefix/, s3://bucket/key.jpg, s3://bucket/photos/*.jpg or http(s)://host/photo.jpg (docs/predict.md)")
    predict.add_argument("--checkpoint", "--model", dest="checkpoint", type=local_path, required=True,
                         help="crackseg checkpoint or model file: best.pt, a converted classic file, a safetensors folder, "
                              "or an exported model.onnx / model.xml (see crackseg export)")
    predict.add_argument("--out", required=True, help="output folder: local, or s3://bucket/prefix/ (each file uploaded whole "
                         "once written; one run at a time holds PREFIX/.crackseg-predict.lock; docs/predict.md)")
    predict.add_argument("--recursive", action="store_true", help="also read images in sub-folders (output names keep the sub-folders)")
    predict.add_argument("--threshold", type=checked(float, FRACTION), default=None, help="crack probability threshold (default: the checkpoint's best validation F1 threshold)")
    predict.add_argument("--save-prob", type=int, choices=[8, 16], default=None, help="also write the probability map as 8- or 16-bit OUT/probs/<name>.png (a GeoTIFF, .tif, for rasters read by windows)")
    predict.add_argument("--overlay", action="store_true", help="also write OUT/overlays/<name>.jpg, the photo with cracks tinted red")
    predict.add_argument("--join-gap", type=length, default=JOIN_GAP,
                         help="bridge gaps up to this long (px, or mm, e.g. 3mm: mm need a pixel size, see --px-size) between pieces of one crack: a skeleton end "
                              "must point at the other piece (within 30 degrees); 0 keeps every piece apart")
    predict.add_argument("--min-length", type=length, default=MIN_LENGTH,
                         help="leave cracks shorter than this (px or mm) out of cracks.csv, the overlays and the counts; the mask keeps their pixels")
    predict.add_argument("--width-classes", type=width_classes, default=None,
                         help=width_classes_help("class each crack by its max and mean width (cracks.csv); lengths per class "
                                                 "(predictions.csv, summary.json, the report) by the width the standard grades"))
    predict.add_argument("--px-size", type=checked(float, POSITIVE), default=None, help="pixel size in mm: measurements are also reported in mm; a georeferenced raster in a projected CRS "
                              "carries its own, which this overrides")
    predict.add_argument("--no-measure", dest="measure", action="store_false",
                         help="skip crack length and width measurements (no cracks.csv): the fastest way to masks (measuring costs CPU time per image, see docs/benchmarks.md)")
    predict.add_argument("--report", action="store_true", help="also write OUT/report.html (see crackseg report)")
    predict.add_argument("--vectors", choices=tuple(VECTOR_FORMATS), default=None,
                         help="also write OUT/vectors/<name>.geojson|gpkg: one feature per crack, its centreline in map coordinates "
                              "(pixel coordinates for photos), with cracks.csv's columns (needs the geo extra)")
    predict.add_argument("--max-pixels", type=checked(int, AT_LEAST_ONE), default=MAX_PIXELS,
                         help=f"refuse rasters larger than this many pixels (default {MAX_PIXELS:.0e}); GeoTIFFs and TIFFs over "
                              f"{STREAM_ABOVE / 1e6:.0f} megapixels are predicted by windows, in memory that does not grow with their area")
    predict.add_argument("--overviews", action="store_true", help="add overviews to GeoTIFF outputs, so GIS software opens them fast")
    predict.add_argument("--skip-existing", action="store_true", help="keep masks already in OUT and predict the rest (finishes an interrupted batch)")
    predict.add_argument("--overwrite", action="store_true", help="replace outputs already in OUT")
    predict.add_argument("--no-lock", dest="lock", action="store_false",
                         help="for an --out in object storage that cannot lock (no conditional writes): write without the "
                              "lock object, and run one predict per --out at a time (a local --out is always locked)")
    predict.add_argument("--engine", choices=("local", "ray"), default="local",
                         help="local: this process (or torchrun's processes, see launch.sh); ray: a pool of Ray actors, one "
                              "model each, on --ray-address (pip install 'crackseg[ray]'; docs/scale.md)")
    predict.add_argument("--ray-address", default=None, help="--engine ray: the Ray cluster to run on, e.g. head:6379, or "
                         "local for a Ray of this run's own (default: RAY_ADDRESS, else the cluster started on this machine "
                         "with ray start, else a local Ray)")
    predict.add_argument("--actors", type=checked(int, AT_LEAST_ONE), default=None,
                         help="--engine ray: actors, each with its own model (default: one per GPU of the cluster, else one per CPU)")
    predict.add_argument("--gpus-per-actor", type=checked(float, NON_NEGATIVE), default=None,
                         help="--engine ray: GPUs each actor takes, e.g. 0.5 to run two on one GPU (default: 1 on a cluster "
                              "with GPUs, else 0: CPU actors)")
    predict.add_argument("--cpus-per-actor", type=checked(int, AT_LEAST_ONE), default=None,
                         help="--engine ray: CPUs each actor takes, the threads its model runs with (default 1); a CPU "
                              "model's probabilities equal a local run's to the bit with as many threads (OMP_NUM_THREADS)")
    predict.add_argument("--workers", type=checked(int, NON_NEGATIVE), default=None,
                         help="decoding processes and writer threads (0: all in the main process; default: 0 on CPU, where the model's threads use every core, else CPU cores / processes - 1, at most 8)")
    add_inference_options(predict, "inference")
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
        formatter_class=HelpFormatter,
    )
    export.add_argument("checkpoint", type=local_path, help="crackseg checkpoint, model file or safetensors folder")
    export.add_argument("--format", required=True, choices=EXPORT_FORMATS, help="onnx (pip install 'crackseg[onnx]'), openvino "
                        "(float32 IR, pip install 'crackseg[openvino]') or safetensors")
    export.add_argument("--out", type=local_path, required=True, help="model.onnx, model.xml (model.bin is written beside it) or a folder for safetensors")
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
        formatter_class=HelpFormatter,
    )
    report.add_argument("predictions", type=local_path, help="folder written by crackseg predict")
    report.add_argument("--evaluation", type=local_path, default=None, help="folder written by crackseg evaluate --out: adds scores, the PR curve and the worst images (default: none, predictions only)")
    report.set_defaults(handler=_cmd_report)


def _cmd_predict(args: argparse.Namespace) -> int:
    from crackseg.prediction.predict import PredictOptions, predict_folder

    fields = {item.name for item in dataclasses.fields(PredictOptions)} - {"inference"}
    options = PredictOptions(inference=inference_options(args), **{key: value for key, value in vars(args).items() if key in fields})
    return predict_folder(args.checkpoint, args.inputs, options)


def _cmd_export(args: argparse.Namespace) -> int:
    from crackseg.model.export import export_model

    written = export_model(args.checkpoint, args.format, args.out, overwrite=args.overwrite)
    print(f"wrote {written} ({args.format})")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from crackseg.prediction.report import write_report

    print(f"report written to {write_report(args.predictions, args.evaluation)}")
    return 0
