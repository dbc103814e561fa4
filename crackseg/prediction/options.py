"""The options of ``crackseg predict`` and ``crackseg report``: what predict writes and how; no torch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from crackseg.core.errors import InputError
from crackseg.core.options import AT_LEAST_ONE, FRACTION, NON_NEGATIVE, REQUIRED, Length, Options, group, option
from crackseg.core.staging import output_location
from crackseg.cracks import options as measurement
from crackseg.cracks.vectors import require_geo
from crackseg.data.options import MAX_PIXELS, STREAM_ABOVE
from crackseg.model.options import InferenceOptions
from crackseg.model.shipped import DEFAULT_MODEL, model_file
from crackseg.prediction.engines import ENGINES


@dataclass(frozen=True)
class PredictOptions(Options):
    """What predict writes and how; ``inference`` is how the model runs (shared with evaluate)."""

    out: Path | str = option(REQUIRED, "output folder: local, or s3://bucket/prefix/ (each file uploaded whole once written; "
                                       "one run at a time holds PREFIX/.crackseg-predict.lock; docs/predict.md)")
    recursive: bool = option(False, "also read images in sub-folders (output names keep the sub-folders)")
    threshold: float | None = option(None, "crack probability threshold (default: the checkpoint's best validation F1 threshold)",
                                     valid=FRACTION)
    save_prob: int | None = option(None, "also write the probability map as 8- or 16-bit OUT/probs/<name>.png (a GeoTIFF, "
                                         ".tif, for rasters read by windows)", unit="bits", choices=(8, 16))
    overlay: bool = option(False, "also write OUT/overlays/<name>.jpg, the photo with cracks tinted red")
    join_gap: Length = measurement.length(
        measurement.JOIN_GAP, "bridge gaps up to this long (px, or mm, e.g. 3mm: mm need a pixel size, see --px-size) between "
        "pieces of one crack: a skeleton end must point at the other piece (within 30 degrees); 0 keeps every piece apart")
    min_length: Length = measurement.length(
        measurement.MIN_LENGTH, "leave cracks shorter than this (px or mm) out of cracks.csv, the overlays and the counts; the "
        "mask keeps their pixels")
    scale: measurement.Scale = group(measurement.Scale, helps={
        "px_size": "pixel size in mm: measurements are also reported in mm; a georeferenced raster in a projected CRS "
                   "carries its own, which this overrides",
        "width_classes": measurement.width_classes_help(
            "class each crack by its max and mean width (cracks.csv); lengths per class (predictions.csv, summary.json, "
            "the report) by the width the standard grades")})
    measure: bool = option(True, "skip crack length and width measurements (no cracks.csv): the fastest way to masks "
                                 "(measuring costs CPU time per image, see docs/benchmarks.md)", flags=("--no-measure",))
    report: bool = option(False, "also write OUT/report.html (see crackseg report)")
    vectors: str | None = measurement.vectors(
        "also write OUT/vectors/<name>.geojson|gpkg: one feature per crack, its centreline in map coordinates (pixel "
        "coordinates for photos), with cracks.csv's columns (needs the geo extra)")
    max_pixels: int = option(MAX_PIXELS, f"refuse rasters larger than this many pixels (default {MAX_PIXELS:.0e}); GeoTIFFs and "
                                         f"TIFFs over {STREAM_ABOVE / 1e6:.0f} megapixels are predicted by windows, in memory "
                                         "that does not grow with their area", unit="px", valid=AT_LEAST_ONE)
    overviews: bool = option(False, "add overviews to GeoTIFF outputs, so GIS software opens them fast")
    skip_existing: bool = option(False, "keep masks already in OUT and predict the rest (finishes an interrupted batch)")
    overwrite: bool = option(False, "replace outputs already in OUT, and remove those an earlier run wrote that this one does not")
    lock: bool = option(True, "for an --out in object storage that cannot lock (no conditional writes): write without the lock "
                              "object, and run one predict per --out at a time (a local --out is always locked)",
                        flags=("--no-lock",))
    engine: str = option("local", "; ".join(f"{name}: {engine.help}" for name, engine in ENGINES.items()), choices=ENGINES)
    ray_address: str | None = option(None, "--engine ray: the Ray cluster to run on, e.g. head:6379, or local for a Ray of this "
                                           "run's own (default: RAY_ADDRESS, else the cluster started on this machine with ray "
                                           "start, else a local Ray)")
    actors: int | None = option(None, "--engine ray: actors, each with its own model (default: one per GPU of the cluster, else "
                                      "one per CPU)", valid=AT_LEAST_ONE)
    gpus_per_actor: float | None = option(None, "--engine ray: GPUs each actor takes, e.g. 0.5 to run two on one GPU (default: 1 "
                                                "on a cluster with GPUs, else 0: CPU actors)", valid=NON_NEGATIVE)
    cpus_per_actor: int | None = option(None, "--engine ray: CPUs each actor takes, the threads its model runs with (default 1); "
                                              "a CPU model's probabilities equal a local run's to the bit with as many threads "
                                              "(OMP_NUM_THREADS)", valid=AT_LEAST_ONE)
    workers: int | None = option(None, "decoding processes, and as many that write each photo's files and measure its cracks "
                                       "(0: all in the main process; default: 0 on CPU, where the model's threads use every "
                                       "core, else CPU cores / processes - 1, at most 8)",
                                 valid=NON_NEGATIVE)
    decode: str = option("auto", "where JPEG photos are decoded: workers = by Pillow in the decoding processes; device = in "
                                 "batches where the model runs (nvJPEG on a GPU); auto = device on CUDA, else workers. Other "
                                 "formats are decoded in the workers", choices=("auto", "workers", "device"))
    inference: InferenceOptions = group(InferenceOptions, "inference")

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "out", output_location(self.out, "predictions"))
        if self.decode != "auto" and self.engine == "ray":
            raise InputError("--decode applies to --engine local; Ray's actors decode what they read")
        ray_flags = {"--ray-address": self.ray_address, "--actors": self.actors, "--gpus-per-actor": self.gpus_per_actor,
                     "--cpus-per-actor": self.cpus_per_actor}
        given = [flag for flag, value in ray_flags.items() if value is not None]
        if given and self.engine != "ray":
            raise InputError(f"{given[0]} applies to --engine ray")
        if self.gpus_per_actor is not None and self.gpus_per_actor > 1 and not float(self.gpus_per_actor).is_integer():
            raise InputError(f"--gpus-per-actor {self.gpus_per_actor:g}: above 1 it must be a whole number (Ray shares a GPU, "
                             "but never splits several)")
        if not self.measure:  # what measures cracks means nothing without measuring
            given = [flag for flag, used in (("--vectors", self.vectors), ("--width-classes", self.scale.width_classes is not None),
                                            ("--join-gap", self.join_gap != measurement.JOIN_GAP),
                                            ("--min-length", self.min_length != measurement.MIN_LENGTH)) if used]
            if given:
                raise InputError(f"{given[0]} applies to the measured cracks; leave out --no-measure")
        if self.vectors:
            require_geo()

    def scale_needed_by(self) -> str | None:
        """The flag that needs a pixel size in mm (width classes, or a length in mm), if any."""
        if self.scale.width_classes is not None:
            return "--width-classes"
        for flag, length in (("--join-gap", self.join_gap), ("--min-length", self.min_length)):
            if length.unit == "mm":
                return f"{flag} {length}"
        return None



@dataclass(frozen=True)
class PredictCommand(Options):
    """``crackseg predict``: the inputs, the model, and what to write."""

    inputs: tuple[str, ...] = option(REQUIRED, "image files, folders or glob patterns (quote them); photos in object storage: "
                                               "s3://bucket/prefix/, s3://bucket/key.jpg, s3://bucket/photos/*.jpg or "
                                               "http(s)://host/photo.jpg (docs/predict.md)", positional=True, nargs="+")
    checkpoint: Path | None = option(None, "crackseg checkpoint or model file: best.pt, a converted classic file, a safetensors "
                                           "folder, an exported model.onnx / model.xml (see crackseg export), or a shipped "
                                           f"model's name (crackseg models) (default: the shipped {DEFAULT_MODEL} model)",
                                     flags=("--checkpoint", "--model"), parse=model_file)
    options: PredictOptions = group(PredictOptions)


@dataclass(frozen=True)
class ReportOptions(Options):
    """``crackseg report``."""

    predictions: Path = option(REQUIRED, "folder written by crackseg predict", positional=True)
    evaluation: Path | None = option(None, "folder written by crackseg evaluate --out: adds scores, the PR curve and the worst "
                                           "images (default: none, predictions only)")
