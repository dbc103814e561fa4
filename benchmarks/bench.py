"""crackseg benchmarks: prints a Markdown table and writes JSON with the configuration and versions.

Data (data_modes.py):
    python benchmarks/bench.py synth [--size 256] [--quick]
    python benchmarks/bench.py data [--size 448] [--crop-size 448] [--count 64] [--workers 0 1 2] [--quick]
    python benchmarks/bench.py evaluate [--size 448] [--count 1000] [--quick]
Training (training_modes.py):
    python benchmarks/bench.py train [--device cpu|cuda] [--encoder resnet34] [--size 448] [--batch-size 8]
                                     [--workers 4] [--amp bf16] [--channels-last] [--quick]
    python benchmarks/bench.py strategies [--device cpu|cuda] [--encoder resnet18] [--size 256] [--batch-size 4] [--quick]
Prediction (prediction_modes.py):
    python benchmarks/bench.py predict [--device ...] [--encoder ...] [--size 448] [--batch-size 8] [--count 64] [--quick]
    python benchmarks/bench.py runtimes [--encoder resnet34] [--images DIR] [--count 40] [--quick]
    python benchmarks/bench.py measure [--masks DIR ...] [--count 40] [--quick]
Rasters (raster_modes.py):
    python benchmarks/bench.py rasters [--quick]
Monitoring (monitoring_modes.py):
    python benchmarks/bench.py compare [--count 4] [--windows 3] [--quick]
Object storage (storage_modes.py):
    python benchmarks/bench.py storage [--encoder ...] [--size 256] [--count 200] [--windows 5] [--quick]
Engines (engine_modes.py):
    python benchmarks/bench.py engines [--encoder ...] [--size 256] [--count 200] [--windows 5] [--quick]

data times the loader's decoding and geometric augmentation by worker count, and the
photometric jitter that the training step runs on the device.

train and predict compare model-only throughput (tensors already on the device) with
end-to-end throughput from image files; their ratio is the input pipeline's efficiency.
They also count the model's FLOPs per image (torch.utils.flop_counter; training counts
forward and backward) and report the achieved TFLOP/s, and the fraction of the device's
peak where it is known (--peak-tflops gives it for other devices). Each times the stages of its
path alone, in one process, as ms per image (predict: read, decode, copy to device, forward,
threshold, copy the mask back, measure, encode PNG, write; train: read, decode, augment, collate, copy, jitter,
step): where an image's time goes, whatever a pipeline overlaps.

strategies runs real `crackseg train` jobs (one process, DataParallel, DDP for every process
count the machine allows, DDP + bf16 / fp16 AMP, + channels_last, + compile, + activation
checkpointing) for 2 epochs each and reports the second epoch's images/s from the run's log.
On CPU the DDP processes are gloo processes sharing the cores.

runtimes compares CPU prediction by torch (eager, channels_last, bf16), ONNX Runtime and
OpenVINO (f32, bf16) (model alone, and crackseg predict --no-measure from files), and the naive loop;
the one-image run of each gives its fixed cost and the steady rate of a long run.

measure times crack measuring (find_cracks at predict's defaults, and without joining) against one
scikit-image skeletonize of the same masks, alternated: the first --count masks of each --masks folder
(default: synthetic ones of --size).

rasters predicts synthetic GeoTIFFs of 100 megapixels and 1 gigapixel by windows (peak RSS,
megapixels/s) beside a photo decoded whole.

compare times whole `crackseg compare` runs (fresh processes, imports included) on --count
pairs of 12-megapixel photos with masks, the AFTER photo from a moved camera with one crack
extended, by --transform similarity and homography: pairs/s of the whole run, the marginal
pairs/s of one more pair (against a one-pair run) and the fixed cost; its check says whether
every pair was registered and the extended crack alone was found longer.

storage times crackseg predict --no-measure from a local folder and from an s3:// prefix on
moto's S3 server on loopback (to a local folder and to an s3:// prefix), alternated, and each
path's rate against the local one (goal: at least 0.8).

engines times crackseg predict with --engine local and with --engine ray (2 CPU actors on a Ray
head started on this machine), alternated, and Ray's rate against the local one (goal: at least 0.85).

Each figure is the median over several timed windows after a warm-up window (--windows sets
how many; on a machine whose speed drifts, more). Accuracy is measured beside these scripts:
crack joining by benchmarks/cracks.py, training recipes by benchmarks/recipe.py.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

# mode: (module, function). Imported when run, so that processes that import this script (crackseg predict's measuring
# processes, started as multiprocessing starts them) do not import torch for nothing.
MODES = {"synth": ("data_modes", "bench_synth"), "data": ("data_modes", "bench_data"), "evaluate": ("data_modes", "bench_evaluate"),
         "train": ("training_modes", "bench_train"), "strategies": ("training_modes", "bench_strategies"),
         "predict": ("prediction_modes", "bench_predict"), "runtimes": ("prediction_modes", "bench_runtimes"),
         "measure": ("prediction_modes", "bench_measure"),
         "rasters": ("raster_modes", "bench_rasters"), "compare": ("monitoring_modes", "bench_compare"),
         "storage": ("storage_modes", "bench_storage"), "engines": ("engine_modes", "bench_engines")}


def main() -> None:
    """Run one mode, print its rows as Markdown and write them with the environment as JSON."""
    import torch

    from crackseg.core.options import parse_size
    from crackseg.prediction.local_engine import default_workers
    from harness import RESULTS, write_report

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=MODES)
    parser.add_argument("--images", type=Path, default=None, help="runtimes: a folder of real photos to predict (default: synthetic)")
    parser.add_argument("--masks", type=Path, nargs="+", default=None, help="measure: folders of crack masks (default: synthetic)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda (data, train, predict)")
    parser.add_argument("--encoder", default="resnet34", help="smp encoder of the UNet (train, predict)")
    parser.add_argument("--batch-size", type=int, default=8, help="images per step (train, predict)")
    parser.add_argument("--amp", choices=["bf16", "fp16", "off"], default=None, help="mixed precision (default bf16 on CUDA, off on CPU)")
    parser.add_argument("--channels-last", action="store_true", help="NHWC layout (train, predict)")
    parser.add_argument("--size", type=parse_size, default=(256, 256), help="image size in px: N or HxW")
    parser.add_argument("--crop-size", type=int, default=448, help="training crop in px (data)")
    parser.add_argument("--count", type=int, default=None, help="images generated (default 1000 for evaluate, 4 photo pairs for compare, 200 for storage and engines, 64 otherwise; predict and compare time whole runs over them)")
    parser.add_argument("--workers", type=int, nargs="+", default=None, help="loader workers: counts to try (data, default 0 1 2) or one count (train, default 2; predict, default crackseg's: 0 on CPU)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the device's peak TFLOP/s at this precision, for the fraction of peak (known H100/H200/A100 bf16 peaks are built in)")
    parser.add_argument("--windows", type=int, default=None,
                        help="timed windows after the warm-up, median reported (default 5; data, predict and compare 3): more on a noisy machine")
    parser.add_argument("--quick", action="store_true", help="few, short windows: a smoke test, not a figure")
    parser.add_argument("--out", type=Path, default=None, help="JSON file (default benchmarks/results/MODE.json)")
    args = parser.parse_args()
    args.count = args.count or {"data": 64, "evaluate": 1000, "compare": 4, "storage": 200, "engines": 200, "measure": 40}.get(args.mode, 64)
    if args.mode == "data":
        args.workers = args.workers or [0, 1, 2]
    elif args.mode in ("predict", "storage", "engines"):
        args.workers = args.workers[0] if args.workers else default_workers(torch.device(args.device))
    else:
        args.workers = (args.workers or [2])[0]
    args.amp = args.amp or ("bf16" if args.device.startswith("cuda") else "off")

    module, function = MODES[args.mode]
    write_report(getattr(importlib.import_module(module), function)(args), args.out or RESULTS / f"{args.mode}.json")


if __name__ == "__main__":
    main()
