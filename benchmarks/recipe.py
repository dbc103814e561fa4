"""Training-recipe comparison on real datasets: train a variant with one seed, score it, tabulate.

    python benchmarks/recipe.py run --dataset cfd --variant bce --seed 0
    python benchmarks/recipe.py cross --train cfd --test crack500 --seed 0
    python benchmarks/recipe.py table
    python benchmarks/recipe.py protocols --variant bce+dice-sqrt-bf16cl

Every run trains a UNet (ResNet18 from scratch unless the variant names another encoder) with 2
gloo processes on the CPU (the budget of docs/results.md: about half an hour here), validates on a seeded 10% of ``train.txt``, and is
scored once on ``test.txt`` at 0 and 2 px tolerance with its own validation threshold. The
epochs per dataset give both the same number of optimizer steps (CrackForest: 64 training
images x 60 epochs; crack500: 256 x 15). Runs go to ``checkpoints/recipe/DATASET-VARIANT-sSEED``;
``table`` prints, per dataset and variant, the mean and sample standard deviation over seeds
(Markdown), each variant's gap to the variant it changes against that spread, and every run's
figures. Datasets are read from ``../shared/datasets`` (``--root``) and never copied.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATASETS = {"cfd": ("cfd", 60), "crack500": ("crack500-subset", 15), "masonry": ("masonry", 24), "walls": ("walls-mixed", 28)}  # name: (folder, epochs)
VARIANTS = {  # every flag that differs spelled out, so that a run means the same whatever the defaults
    "bce": ["--loss", "bce", "--pos-weight", "auto", "--amp", "off"],  # the defaults until the comparison of docs/results.md
    "bce+dice-sqrt": ["--loss", "bce+dice", "--pos-weight", "sqrt", "--amp", "off"],  # the loss defaults since, in float32
    "bce+dice-sqrt-ema": ["--loss", "bce+dice", "--pos-weight", "sqrt", "--amp", "off", "--ema", "0.99"],  # about the last 100 of 480 steps
    "bce+dice-sqrt-bf16cl": ["--loss", "bce+dice", "--pos-weight", "sqrt", "--amp", "bf16", "--channels-last"],
    # the same recipe on an ImageNet-pretrained encoder whose weights install offline (crackseg[pretrained])
    "lite0-imagenet-bf16cl": ["--loss", "bce+dice", "--pos-weight", "sqrt", "--amp", "bf16", "--channels-last",
                              "--encoder", "efficientnet-lite0", "--encoder-weights", "imagenet"],
    # the input scaling of EfficientNet-Lite's ImageNet weights, in float32 (CPUs without bfloat16)
    "lite0-imagenet": ["--loss", "bce+dice", "--pos-weight", "sqrt", "--amp", "off", "--encoder", "efficientnet-lite0",
                       "--encoder-weights", "imagenet", "--input-scaling", "imagenet"],
    "lite0-tf": ["--loss", "bce+dice", "--pos-weight", "sqrt", "--amp", "off", "--encoder", "efficientnet-lite0",
                 "--encoder-weights", "imagenet", "--input-scaling", "tf"],
}
# -hn: a quarter of each epoch's samples are crack-free look-alikes (hard_negatives() writes them once)
NEGATIVES = ["--negatives", "{negatives}", "--negative-share", "0.25"]
VARIANTS |= {f"{name}-hn": [*VARIANTS[name], *NEGATIVES] for name in ("bce+dice-sqrt-bf16cl", "lite0-imagenet-bf16cl")}
BASELINES = {"bce+dice-sqrt": "bce", "bce+dice-sqrt-ema": "bce+dice-sqrt", "bce+dice-sqrt-bf16cl": "bce+dice-sqrt",
             "lite0-imagenet-bf16cl": "bce+dice-sqrt-bf16cl", "bce+dice-sqrt-bf16cl-hn": "bce+dice-sqrt-bf16cl",
             "lite0-imagenet-bf16cl-hn": "lite0-imagenet-bf16cl", "lite0-tf": "lite0-imagenet"}  # a variant is compared with the one it changes
BUDGET = ["--encoder", "resnet18", "--encoder-weights", "none", "--crop-size", "320", "--batch-size", "4", "--lr", "1e-3",
          "--workers", "0", "--device", "cpu"]
TOLERANCES = (0, 2)
PROTOCOLS = ("scsegamba", "deepsegmentor", "omnicrack")


def _crackseg() -> list[str]:
    return [sys.executable, "-m", "crackseg"]


def evaluate_run(checkpoint: Path, data: Path, out: Path) -> None:
    for tolerance in TOLERANCES:
        command = [*_crackseg(), "evaluate", "--checkpoint", str(checkpoint), "--data", str(data), "--split", "test",
                   "--tolerance", str(tolerance), "--device", "cpu", "--out", str(out / f"tol{tolerance}"), "--overwrite"]
        print(" ".join(command), flush=True)
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def _score_protocols(checkpoint: Path, data: Path, out: Path) -> None:
    """The literature's protocols on the test split (crackseg's own is the tolerance-0 scoring)."""
    for protocol in PROTOCOLS:
        if (out / f"protocol-{protocol}" / "report.json").exists():
            continue
        command = [*_crackseg(), "evaluate", "--checkpoint", str(checkpoint), "--data", str(data), "--split", "test",
                   "--device", "cpu", "--protocol", protocol, "--out", str(out / f"protocol-{protocol}"), "--overwrite"]
        print(" ".join(command), flush=True)
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def hard_negatives(runs: Path) -> str:
    """200 synthetic crack-free look-alikes at the datasets' photo size, written once (seed 0)."""
    folder = runs / "hard-negatives"
    if not (folder / "images").is_dir():
        command = [*_crackseg(), "synth", str(folder), "--count", "200", "--size", "320x480", "--seed", "0",
                   "--crack-free", "1", "--hard-negatives", "--overwrite"]
        print(" ".join(command), flush=True)
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return str(folder)


def run(args: argparse.Namespace) -> None:
    folder, epochs = DATASETS[args.dataset]
    data = args.root / folder
    longer = f"-e{args.epochs}" if args.epochs and args.epochs != epochs else ""  # another budget is another variant
    run_dir = args.runs / f"{args.dataset}-{args.variant}{longer}-s{args.seed}"
    epochs = args.epochs or epochs
    flags = [hard_negatives(args.runs) if flag == "{negatives}" else flag for flag in VARIANTS[args.variant]]
    command = [str(ROOT / "launch.sh"), "--nproc", "2", "train", "--data", str(data), "--run", str(run_dir), *BUDGET,
               "--epochs", str(epochs), "--seed", str(args.seed), *flags]
    print(" ".join(command), flush=True)
    start = time.time()
    subprocess.run(command, check=True, env={**os.environ, "PYTHON": sys.executable})
    (run_dir / "wall_clock_s.txt").write_text(f"{time.time() - start:.0f}\n")
    evaluate_run(run_dir / "best.pt", data, run_dir / "test")
    _score_protocols(run_dir / "best.pt", data, run_dir / "test")


def cross(args: argparse.Namespace) -> None:
    """Score a model trained on one dataset on the other's test split."""
    run_dir = args.runs / f"{args.train}-{args.variant}-s{args.seed}"
    evaluate_run(run_dir / "best.pt", args.root / DATASETS[args.test][0], run_dir / f"cross-{args.test}")


def read_scores(report_dir: Path) -> dict:
    figures = {}
    for tolerance in TOLERANCES:
        report = json.loads((report_dir / f"tol{tolerance}" / "report.json").read_text())
        data = report["dataset"]
        figures[f"f1@{tolerance}"] = data["f1"]
        if tolerance == 0:
            figures |= {"iou": data["iou_crack"], "ods": report["ods"]["f1"], "ois": report["ois"]["f1"],
                        "ods_threshold": report["ods"]["threshold"]}
    return figures


def _run_row(run_dir: Path) -> dict:
    from crackseg.model.checkpoint import read_checkpoint
    from crackseg.evaluation.metrics import BINS, THRESHOLDS, threshold_index

    best = read_checkpoint(run_dir / "best.pt")
    threshold = best["metrics"]["threshold"]
    wall = run_dir / "wall_clock_s.txt"
    row = {"run": run_dir.name, "best_epoch": best["epoch"], "val_f1": best["metrics"]["f1"], "threshold": threshold,
           "at_edge": threshold_index(threshold) in (1, BINS - 1), "edge": (float(THRESHOLDS[1]), float(THRESHOLDS[BINS - 1])),
           "wall_clock_min": float(wall.read_text()) / 60 if wall.exists() else None, **read_scores(run_dir / "test")}
    for cross_dir in sorted(run_dir.glob("cross-*")):
        row[cross_dir.name] = read_scores(cross_dir)
    return row


def spread(values: list[float]) -> str:
    mean = statistics.mean(values)
    return f"{mean:.4f} ± {statistics.stdev(values):.4f}" if len(values) > 1 else f"{mean:.4f}"


def _compare(groups: dict[tuple[str, str], list[dict]]) -> None:
    """Each variant against its baseline over the seeds both ran.

    A variant wins beyond the spread when its mean F1 exceeds the baseline's by more than the
    larger of the two standard deviations.
    """
    lines = []
    for (dataset, variant), members in sorted(groups.items()):
        seed = lambda row: row["run"].rsplit("-s", 1)[1]  # noqa: E731
        baseline = BASELINES.get(variant)
        base = {seed(m): m for m in groups.get((dataset, baseline), [])}
        paired = [(m, base[seed(m)]) for m in members if seed(m) in base]
        if len(paired) < 2:
            continue
        cells = []
        for key in ("f1@0", "f1@2"):
            ours, theirs = [m[key] for m, _ in paired], [b[key] for _, b in paired]
            gap = statistics.mean(ours) - statistics.mean(theirs)
            spread = max(statistics.stdev(ours), statistics.stdev(theirs))
            cells.append(f"{gap:+.4f} | {spread:.4f} | {'yes' if gap > spread else 'no'}")
        lines.append(f"| {dataset} | {variant} | {baseline} | {len(paired)} | " + " | ".join(cells) + " |")
    if lines:
        print("\n| dataset | variant | against | seeds | Δ f1@0 | spread | beyond | Δ f1@2 | spread | beyond |\n" + "|---" * 10 + "|")
        print("\n".join(lines))


def table(args: argparse.Namespace) -> None:
    rows = [_run_row(run_dir) for run_dir in sorted(args.runs.iterdir()) if (run_dir / "test" / "tol2" / "report.json").exists()]
    keys = ["val_f1", "f1@0", "iou", "ods", "ois", "f1@2"]
    print("| dataset | variant | seeds | " + " | ".join(keys) + " | thresholds | wall clock (min) |")
    print("|---" * (len(keys) + 5) + "|")
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        dataset, rest = row["run"].split("-", 1)
        groups.setdefault((dataset, rest.rsplit("-s", 1)[0]), []).append(row)
    for (dataset, variant), members in sorted(groups.items()):
        cells = [spread([m[key] for m in members]) for key in keys]
        thresholds = ", ".join(f"{m['threshold']:.4g}{' (edge)' if m['at_edge'] else ''}" for m in members)
        walls = ", ".join(f"{m['wall_clock_min']:.0f}" for m in members if m["wall_clock_min"] is not None)
        print(f"| {dataset} | {variant} | {len(members)} | " + " | ".join(cells) + f" | {thresholds} | {walls} |")
    _compare(groups)
    crossed = [(row["run"], name[len("cross-"):], row[name]) for row in rows for name in row if name.startswith("cross-")]
    if crossed:
        print("\n| trained (run) | scored on | f1@0 | iou | f1@2 | same-dataset f1@0 | same-dataset f1@2 |\n|---|---|---|---|---|---|---|")
        by_name = {row["run"]: row for row in rows}
        for run_name, tested, figures in crossed:
            home = by_name.get(f"{tested}-{run_name.split('-', 1)[1]}")  # the same variant and seed trained on the scored dataset
            same = f"{home['f1@0']:.4f} | {home['f1@2']:.4f}" if home else "- | -"
            print(f"| {run_name} | {tested} test | {figures['f1@0']:.4f} | {figures['iou']:.4f} | {figures['f1@2']:.4f} | {same} |")
    print()
    for row in rows:
        print(json.dumps(row))


def protocols(args: argparse.Namespace) -> None:
    """Score every finished run of ``--variant`` under every protocol (what is missing), then tabulate mean ± sd."""
    table_rows = []
    for run_dir in sorted(args.runs.glob(f"*-{args.variant}-s*")):
        if not (run_dir / "test" / "tol0" / "report.json").exists():
            continue
        dataset = run_dir.name.split("-", 1)[0]
        _score_protocols(run_dir / "best.pt", args.root / DATASETS[dataset][0], run_dir / "test")
        own = json.loads((run_dir / "test" / "tol0" / "report.json").read_text())
        other = {p: json.loads((run_dir / "test" / f"protocol-{p}" / "report.json").read_text()) for p in PROTOCOLS}
        table_rows.append((dataset, {
            "crackseg F1": own["dataset"]["f1"], "crackseg ODS": own["ods"]["f1"], "crackseg OIS": own["ois"]["f1"],
            "crackseg mIoU": own["dataset"]["miou"],
            "SCSegamba ODS": other["scsegamba"]["ods"]["f1"], "SCSegamba OIS": other["scsegamba"]["ois"]["f1"],
            "SCSegamba mIoU": other["scsegamba"]["miou"]["miou"],
            "DeepSegmentor F (ODS)": other["deepsegmentor"]["ods"]["f1"], "DeepSegmentor I/U": other["deepsegmentor"]["miou"]["miou"],
            "OmniCrack30k clIoU": other["omnicrack"]["cliou"]}))
    keys = list(table_rows[0][1]) if table_rows else []
    print("| dataset | seeds | " + " | ".join(keys) + " |\n" + "|---" * (len(keys) + 2) + "|")
    for dataset in DATASETS:
        members = [figures for name, figures in table_rows if name == dataset]
        if members:
            print(f"| {dataset} | {len(members)} | " + " | ".join(spread([m[key] for m in members]) for key in keys) + " |")


def experiment_parser(description: str, runs: str, runs_help: str = "folder of the run folders"):
    """The command line every benchmark of training runs shares: ``--root`` (the datasets, never copied) and ``--runs``
    (``checkpoints/RUNS``); returns the parser and its subcommands."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=ROOT.parent / "shared" / "datasets", help="folder holding the datasets")
    parser.add_argument("--runs", type=Path, default=ROOT / "checkpoints" / runs, help=runs_help)
    return parser, parser.add_subparsers(dest="command", required=True)


def main() -> None:
    parser, commands = experiment_parser(__doc__, "recipe")
    one = commands.add_parser("run", help="train one variant with one seed, then score it on the test split")
    one.add_argument("--dataset", choices=DATASETS, required=True)
    one.add_argument("--variant", choices=VARIANTS, required=True)
    one.add_argument("--seed", type=int, required=True)
    one.add_argument("--epochs", type=int, help="another budget than the dataset's (e.g. what a faster variant does in the same time)")
    other = commands.add_parser("cross", help="score a trained run on the other dataset's test split")
    other.add_argument("--train", choices=DATASETS, required=True)
    other.add_argument("--test", choices=DATASETS, required=True)
    other.add_argument("--variant", choices=VARIANTS, default="bce+dice-sqrt")
    other.add_argument("--seed", type=int, default=0)
    commands.add_parser("table", help="mean and spread over seeds of every finished run")
    scored = commands.add_parser("protocols", help="every finished run of a variant under every evaluation protocol")
    scored.add_argument("--variant", choices=VARIANTS, default="bce+dice-sqrt")
    args = parser.parse_args()
    {"run": run, "cross": cross, "table": table, "protocols": protocols}[args.command](args)


if __name__ == "__main__":
    main()
