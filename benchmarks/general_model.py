"""The general model across sites: train on several datasets at once, score on every dataset's test split.

    python benchmarks/general_model.py train --seed 0                        # all four train splits: crackseg-general
    python benchmarks/general_model.py train --seed 0 --leave-out masonry    # the other three
    python benchmarks/general_model.py train --seed 0 --only masonry         # masonry alone, at the recipe's budget
    python benchmarks/general_model.py train --seed 0 --start crackpot       # crackpot's ResUNet fine-tuned on all four
    python benchmarks/general_model.py train --seed 0 --epochs 12            # half the epochs: general-e12
    python benchmarks/general_model.py score --model crackseg/model/weights/general --name general-shipped
    python benchmarks/general_model.py score --model crackpot.pt --name crackpot-256 --resize 256
    python benchmarks/general_model.py table
    python benchmarks/general_model.py pictures --model general --out docs/general-failures.jpg

``train`` runs ``crackseg train --data A --data B ...`` (each dataset an equal share of every epoch, its own split,
the pooled validation choosing the threshold) with 2 gloo processes on the CPU, then scores the best model; ``--only``
trains one dataset with the same flags for the optimizer steps of ``recipe.py`` (about 480). ``score``
scores any model on every dataset's ``test.txt`` under crackseg's protocol at 0 and 2 px (with its false-alarm
figures) and SCSegamba's, and on walls-mixed's crack-free test photos (``crack_free``: the photos of its test split
whose masks are empty) for the share of photos with any, and with over 1%, of their pixels called crack. Runs go to
``checkpoints/general-runs/NAME``; datasets are read from ``../shared/datasets`` and never copied. ``pictures`` draws
a model's worst false alarms on synthetic crack-free look-alikes (``crackseg synth --crack-free 1 --hard-negatives``,
seed 101: joints, shadows, paint, stains, stems, frame edges), the photos licensed datasets may not be copied as.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

from generalization import score
from recipe import DATASETS as RECIPE_BUDGETS
from recipe import ROOT, experiment_parser, spread

DATASETS = {"cfd": "cfd", "crack500": "crack500-subset", "masonry": "masonry", "walls": "walls-mixed"}
CRACK_FREE = "walls"  # the dataset whose test split holds real crack-free photos
IMAGENET_START = ["--encoder", "efficientnet-lite0", "--encoder-weights", "imagenet"]
RECIPE = ["--loss", "bce+dice", "--pos-weight", "sqrt", "--amp", "off", "--crop-size", "320", "--batch-size", "4", "--lr", "1e-3",
          "--workers", "0", "--device", "cpu"]
LARGE_ALARM = 0.01  # share of a crack-free photo's pixels
GENERAL_EPOCHS = 24  # each an epoch of all training splits' photos together; 12 scored lower on every split


def train(args: argparse.Namespace) -> None:
    names = [args.only] if args.only else [name for name in DATASETS if name != args.leave_out]
    model = f"only-{args.only}" if args.only else f"without-{args.leave_out}" if args.leave_out else "general"
    if args.start == "crackpot":
        model = f"{model}-from-crackpot"
    recipe_epochs = RECIPE_BUDGETS[args.only][1] if args.only else GENERAL_EPOCHS
    epochs = args.epochs or recipe_epochs
    if epochs != recipe_epochs:
        model = f"{model}-e{epochs}"
    run_dir = args.runs / model / f"s{args.seed}"
    data = [flag for name in names for flag in ("--data", str(args.root / DATASETS[name]))]
    start = [*IMAGENET_START, "--input-scaling", args.input_scaling] if args.start == "imagenet" else \
        ["--arch", "resunet", "--init", str(args.crackpot), "--input-scaling", "auto"]  # its own scaling, from the file
    command = [str(ROOT / "launch.sh"), "--nproc", "2", "train", *data, "--run", str(run_dir), *RECIPE, *start,
               "--epochs", str(epochs), "--seed", str(args.seed)]
    print(" ".join(command), flush=True)
    start = time.time()
    subprocess.run(command, check=True, env={**os.environ, "PYTHON": sys.executable})
    (run_dir / "wall_clock_s.txt").write_text(f"{time.time() - start:.0f}\n")
    score_model(run_dir / "best.pt", run_dir / "scores", args.root)


def crack_free_split(root: Path, out: Path) -> Path:
    """The stems of the crack-free dataset's test split whose masks are empty, as a split file in ``out``."""
    folder = root / DATASETS[CRACK_FREE]
    stems = [line.strip() for line in (folder / "test.txt").read_text().splitlines() if line.strip()]
    empty = [stem for stem in stems if not np.asarray(Image.open(next((folder / "masks").glob(f"{stem}.*")))).any()]
    out.mkdir(parents=True, exist_ok=True)
    (out / "crack_free.txt").write_text("\n".join(empty) + "\n")
    return out / "crack_free.txt"


def score_model(model: Path, out: Path, root: Path, inference: tuple[str, ...] = ()) -> None:
    for name, folder in DATASETS.items():
        score(model, root / folder, "test", out / name, inference=inference)
    score(model, root / DATASETS[CRACK_FREE], str(crack_free_split(root, out)), out / "crack_free", ("tol0",), inference)


def _figures(folder: Path, root: Path) -> dict:
    own = json.loads((folder / "tol0" / "report.json").read_text())
    alarms = own["false_alarms"]
    if folder.name == "crack_free":
        rows = (folder / "tol0" / "per_image.csv").read_text().splitlines()[1:]
        masks = root / DATASETS[CRACK_FREE] / "masks"
        shares = []
        for row in rows:
            image, far = row.split(",")[0], float(row.split(",")[-1])
            width, height = Image.open(next(masks.glob(f"{image}.*"))).size
            shares.append(far / (width * height))
        return {"photos": len(shares), "with any alarm": float(np.mean([s > 0 for s in shares])),
                f"over {LARGE_ALARM:.0%} called crack": float(np.mean([s > LARGE_ALARM for s in shares])),
                "far alarms /MP": alarms["far_pixels_per_mp"]}
    near = json.loads((folder / "tol2" / "report.json").read_text())
    other = json.loads((folder / "scsegamba" / "report.json").read_text())
    return {"f1@0": own["dataset"]["f1"], "iou": own["dataset"]["iou_crack"], "f1@2": near["dataset"]["f1"],
            "SCSegamba ODS": other["ods"]["f1"], "SCSegamba OIS": other["ois"]["f1"], "SCSegamba mIoU": other["miou"]["miou"],
            "far alarms /MP": alarms["far_pixels_per_mp"]}


def table(args: argparse.Namespace) -> None:
    """Per test set: each model (run folder name, seeds pooled as mean ± sd) and its figures."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for folder in sorted(args.runs.glob("*/*/scores/*")):
        needed = ("tol0",) if folder.name == "crack_free" else ("tol0", "tol2", "scsegamba")
        if all((folder / name / "report.json").exists() for name in needed):  # scored completely
            groups.setdefault((folder.name, folder.parents[2].name), []).append(_figures(folder, args.root))
    for test in (*DATASETS, "crack_free"):
        rows = {model: members for (tested, model), members in groups.items() if tested == test}
        if not rows:
            continue
        keys = list(next(iter(rows.values()))[0])
        print(f"\nscored on {test}\n\n| model | seeds | " + " | ".join(keys) + " |\n" + "|---" * (len(keys) + 2) + "|")
        for model, members in sorted(rows.items()):
            print(f"| {model} | {len(members)} | " + " | ".join(spread([m[key] for m in members]) for key in keys) + " |")


def pictures(args: argparse.Namespace) -> None:
    """The ``--count`` look-alikes with the most pixels called crack, each as photographed and with predict's overlay."""
    folder = args.runs / "pictures"
    subprocess.run([sys.executable, "-m", "crackseg", "synth", str(folder / "lookalikes"), "--count", "48", "--size", "320x480",
                    "--seed", "101", "--crack-free", "1", "--hard-negatives", "--overwrite"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([sys.executable, "-m", "crackseg", "predict", "--checkpoint", str(args.model), str(folder / "lookalikes" / "images"),
                    "--out", str(folder / "predicted"), "--overlay", "--no-measure", "--overwrite", "--device", "cpu"],
                   check=True, stdout=subprocess.DEVNULL)
    rows = (folder / "predicted" / "predictions.csv").read_text().splitlines()
    header = rows[0].split(",")
    ranked = sorted((row.split(",") for row in rows[1:]), key=lambda row: -float(row[header.index("crack_fraction")]))
    tiles = []
    for row in ranked[:args.count]:
        name = Path(row[header.index("path")]).stem
        photo = Image.open(folder / "lookalikes" / "images" / f"{name}.jpg").convert("RGB")
        overlay = Image.open(folder / "predicted" / "overlays" / f"{name}.jpg").convert("RGB")
        tiles.append((photo, overlay, float(row[header.index("crack_fraction")])))
    width, height = tiles[0][0].size
    sheet = Image.new("RGB", (2 * width, len(tiles) * height), "white")
    for index, (photo, overlay, _) in enumerate(tiles):
        sheet.paste(photo, (0, index * height))
        sheet.paste(overlay, (width, index * height))
    sheet.thumbnail((960, 10_000))
    sheet.save(args.out, quality=85)
    print("\n".join(f"{Path(row[header.index('path')]).name}: {float(row[header.index('crack_fraction')]):.2%} called crack"
                    for row in ranked[:args.count]))
    fractions = [float(row[header.index("crack_fraction")]) for row in ranked]
    print(f"photos with any pixel called crack: {sum(share > 0 for share in fractions)} of {len(ranked)}, "
          f"over {LARGE_ALARM:.0%} of the photo: {sum(share > LARGE_ALARM for share in fractions)}")


def main() -> None:
    parser, commands = experiment_parser(__doc__, "general-runs")
    one = commands.add_parser("train", help="train on every dataset (all but --leave-out, or --only one), then score the best model")
    one.add_argument("--seed", type=int, required=True)
    chosen = one.add_mutually_exclusive_group()
    chosen.add_argument("--leave-out", choices=DATASETS)
    chosen.add_argument("--only", choices=DATASETS)
    one.add_argument("--epochs", type=int, help=f"default: {GENERAL_EPOCHS}, or the recipe's budget with --only; "
                     "any other count is tabulated as its own model (NAME-eEPOCHS)")
    one.add_argument("--input-scaling", choices=("imagenet", "tf"), default="tf")
    one.add_argument("--start", choices=("imagenet", "crackpot"), default="imagenet",
                     help="the recipe's ImageNet encoder, or fine-tuning crackpot's converted ResUNet (--crackpot)")
    one.add_argument("--crackpot", type=Path, default=ROOT / "checkpoints" / "crackpot.pt",
                     help="crackpot's model converted by crackseg convert --from crackpot")
    scored = commands.add_parser("score", help="score a model file on every test split and the crack-free photos")
    scored.add_argument("--model", type=Path, required=True)
    scored.add_argument("--name", required=True, help="the name its scores are tabulated under")
    scored.add_argument("--resize", help="evaluate --resize: run every photo at this size (crackpot's model: 256)")
    commands.add_parser("table", help="mean and spread over seeds per model and test set")
    drawn = commands.add_parser("pictures", help="a model's worst false alarms on synthetic crack-free look-alikes, as one image")
    drawn.add_argument("--model", default="general")
    drawn.add_argument("--out", type=Path, required=True)
    drawn.add_argument("--count", type=int, default=4)
    args = parser.parse_args()
    if args.command == "score":
        score_model(args.model, args.runs / args.name / "s0" / "scores", args.root, ("--resize", args.resize) if args.resize else ())
    else:
        {"train": train, "table": table, "pictures": pictures}[args.command](args)


if __name__ == "__main__":
    main()
