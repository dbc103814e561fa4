"""``crackseg predict``, ``crackseg export`` and ``crackseg report``: masks from a model, the model for other runtimes, the page."""

from __future__ import annotations

from crackseg.cli.options import add_command
from crackseg.model.options import ExportOptions, ModelsOptions
from crackseg.core.errors import InputError
from crackseg.model.shipped import DEFAULT_MODEL, SHIPPED, crackpot_model_file, describe
from crackseg.prediction.options import PredictCommand, ReportOptions


def add_commands(commands) -> None:
    add_command(
        commands, "predict", "predict crack masks for images of any size",
        (
            "Write OUT/masks/<name>.png (0 = background, 255 = crack, the input's exact size) for every\n"
            "input, plus OUT/predictions.csv (per image: crack fraction, count, length, widths, area)\n"
            "and OUT/cracks.csv (per connected crack). Images larger than --tile run as overlapping,\n"
            "smoothly blended tiles; nothing is resized unless --resize is given. Unreadable inputs\n"
            "are listed in OUT/errors.csv and the exit status is 1; the rest are still written.\n\n"
            "Without --checkpoint, the general model that ships with crackseg runs (crackseg models).\n\n"
            "  crackseg predict photos/ --out predictions     (the shipped general model)\n"
            "  crackseg predict --checkpoint checkpoints/demo/best.pt data/photos --out predictions\n"
            "  crackseg predict --checkpoint best.pt s3://survey/photos/ --out s3://survey/pred/   (pip install 'crackseg[s3]')\n"
            "  ./launch.sh predict --checkpoint ... photos/ --out ...   (photos, and each raster's tiles, shared across GPUs)\n"
            "  crackseg predict --engine ray --ray-address auto --checkpoint best.pt s3://survey/photos/ --out s3://survey/pred/"
        ),
        PredictCommand, _cmd_predict,
    )

    add_command(
        commands, "models", "list the models that ship with crackseg (no download, no network)",
        (
            "List the models installed with crackseg. --checkpoint NAME takes each one in predict,\n"
            "evaluate, serve and export, and train --init NAME fine-tunes it; the general model is\n"
            "predict's default, run when given no --checkpoint. Their model cards are in docs/models.md. crackpot's\n"
            "Keras model converts with crackseg convert --from crackpot."
        ),
        ModelsOptions, _cmd_models,
    )

    add_command(
        commands, "export", "export a model to ONNX, OpenVINO IR or safetensors, for prediction without PyTorch",
        (
            "Write the model of CHECKPOINT for other runtimes. ONNX and OpenVINO models take float32 RGB\n"
            "images in [0, 1] (N, 3, H, W) of any size (normalization and padding inside) and return crack\n"
            "probabilities (N, 1, H, W); the threshold, architecture, encoder and size divisor are\n"
            "stored as metadata. safetensors writes a folder (config.json + model.safetensors) that\n"
            "predict, evaluate and crackseg.load_model read without unpickling anything.\n\n"
            "  crackseg export checkpoints/cfd/best.pt --format onnx --out cfd.onnx\n"
            "  crackseg predict --model cfd.onnx photos/ --out predictions    (ONNX Runtime)"
        ),
        ExportOptions, _cmd_export,
    )

    add_command(
        commands, "report", "write report.html for a predictions folder: summary, sortable images, overlays, crack tables",
        (
            "Write PREDICTIONS/report.html: one self-contained page that opens from the file system in\n"
            "any browser, with the run's summary (images, cracks, total length, widest crack, length per\n"
            "width class), a sortable, paginated table of images with thumbnails, and per image the photo\n"
            "with its overlay (a toggle) and its crack table. Pictures go to PREDICTIONS/report/ once.\n\n"
            "  crackseg report predictions/ --evaluation reports/cfd"
        ),
        ReportOptions, _cmd_report,
    )


def _cmd_predict(command: PredictCommand) -> int:
    from crackseg.prediction.predict import predict_folder

    return predict_folder(command.checkpoint, list(command.inputs), command.options)


def _cmd_models(options: ModelsOptions) -> int:
    for name, model in SHIPPED.items():
        print(f"{name}{' (default)' if name == DEFAULT_MODEL else ''}: {describe(name)}")
        print(f"    {model.summary}; {model.terms}")
    try:
        found = f"its model file is installed: {crackpot_model_file()}"
    except InputError as error:
        found = str(error)
    print(f"crackpot (MIT, converted on request): crackseg convert --from crackpot --out crackpot.pt; {found}")
    return 0


def _cmd_export(options: ExportOptions) -> int:
    from crackseg.model.export import export_model

    written = export_model(options.checkpoint, options.format, options.out, overwrite=options.overwrite, half=options.half,
                           deepness=options.deepness)
    print(f"wrote {written} ({options.format})")
    return 0


def _cmd_report(options: ReportOptions) -> int:
    from crackseg.prediction.report import write_report

    print(f"report written to {write_report(options.predictions, options.evaluation)}")
    return 0
