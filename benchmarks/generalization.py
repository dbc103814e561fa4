"""Generalization: does a pretrained encoder or hard negatives help on photos unlike the training photos?

    python benchmarks/generalization.py run --train cfd --variant lite0-imagenet-bf16cl --seed 0
    python benchmarks/generalization.py table

``run`` trains a recipe variant (benchmarks/recipe.py: the chosen recipe, 2 gloo processes on the
CPU; the ``-hn`` variants mix crack-free look-alikes of ``crackseg synth --crack-free 1
--hard-negatives`` at a share of 0.25) unless its run folder is finished, then scores its best
model on three test sets: its own dataset's ``test.txt``, the other dataset's ``test.txt`` (photos
it never resembled in training) and a synthetic set of crack-free look-alikes (joints, shadows,
paint, stains, stems, borders; another seed than the training negatives). Each is scored under
crackseg's protocol at 0 and 2 px with its false-alarm figures (predicted crack pixels more than
10 px from every true one, per megapixel, and the share of crack-free 256 px tiles with any alarm)
and under SCSegamba's protocol. ``table`` gives mean ± sd over seeds per training set, variant and
test set. Datasets are read from ``../shared/datasets`` and never copied.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from recipe import DATASETS, VARIANTS, experiment_parser, run, spread

LOOKALIKES = "lookalikes"  # the synthetic crack-free test set, a test set name beside the datasets'
TEST_SETS = (*DATASETS, LOOKALIKES)


def _crackseg(*args: str) -> None:
    command = [sys.executable, "-m", "crackseg", *args]
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def lookalikes(runs: Path) -> Path:
    """The crack-free look-alike test set, written once (seed 101, the training negatives' is 0)."""
    folder = runs / "lookalikes-test"
    if not (folder / "masks").is_dir():
        _crackseg("synth", str(folder), "--count", "48", "--size", "320x480", "--seed", "101", "--crack-free", "1",
                  "--hard-negatives", "--overwrite")
    return folder


SCORINGS = {"tol0": ["--tolerance", "0"], "tol2": ["--tolerance", "2"], "scsegamba": ["--protocol", "scsegamba"]}


def score(checkpoint: Path, data: Path, split: str, out: Path, scorings: tuple[str, ...] = tuple(SCORINGS),
          inference: tuple[str, ...] = ()) -> None:
    """crackseg's protocol at 0 and 2 px (with false alarms) and SCSegamba's, each skipped when already scored;
    ``inference``: evaluate's flags of how the model runs (e.g. ``--resize 256``)."""
    common = ["evaluate", "--checkpoint", str(checkpoint), "--data", str(data), "--split", split, "--device", "cpu", "--overwrite",
              *inference]
    for name in scorings:
        if not (out / name / "report.json").exists():
            _crackseg(*common, *SCORINGS[name], "--out", str(out / name))


def run_and_score(args: argparse.Namespace) -> None:
    run_dir = args.runs / f"{args.train}-{args.variant}-s{args.seed}"
    if not (run_dir / "test" / "tol2" / "report.json").exists():
        run(argparse.Namespace(dataset=args.train, variant=args.variant, seed=args.seed, epochs=None, root=args.root, runs=args.runs))
    for test in DATASETS:
        score(run_dir / "best.pt", args.root / DATASETS[test][0], "test", run_dir / "generalization" / test)
    score(run_dir / "best.pt", lookalikes(args.runs), "all", run_dir / "generalization" / LOOKALIKES, ("tol0",))  # no cracks to find


def _figures(folder: Path) -> dict:
    own = json.loads((folder / "tol0" / "report.json").read_text())
    alarms = own["false_alarms"]
    figures = {"far alarms /MP": alarms["far_pixels_per_mp"], "alarm tiles": alarms["share"]}
    if folder.name != LOOKALIKES:  # scores need true cracks; look-alikes have none
        near = json.loads((folder / "tol2" / "report.json").read_text())
        other = json.loads((folder / "scsegamba" / "report.json").read_text())
        figures = {"f1@0": own["dataset"]["f1"], "f1@2": near["dataset"]["f1"], "SCSegamba ODS": other["ods"]["f1"],
                   "SCSegamba OIS": other["ois"]["f1"], "SCSegamba mIoU": other["miou"]["miou"], **figures}
    return figures


def table(args: argparse.Namespace) -> None:
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for folder in sorted(args.runs.glob("*/generalization/*")):
        if (folder / "tol0" / "report.json").exists():
            train, rest = folder.parents[1].name.split("-", 1)
            groups.setdefault((train, rest.rsplit("-s", 1)[0], folder.name), []).append(_figures(folder))
    for test in TEST_SETS:
        rows = {key: members for key, members in groups.items() if key[2] == test}
        if not rows:
            continue
        keys = list(next(iter(rows.values()))[0])
        print(f"\nscored on {test}\n\n| trained on | variant | seeds | " + " | ".join(keys) + " |\n" + "|---" * (len(keys) + 3) + "|")
        for (train, variant, _), members in sorted(rows.items()):
            cells = [spread([m[key] for m in members if m.get(key) is not None] or [float("nan")]) for key in keys]
            print(f"| {train} | {variant} | {len(members)} | " + " | ".join(cells) + " |")


def main() -> None:
    parser, commands = experiment_parser(__doc__, "recipe")
    one = commands.add_parser("run", help="train a variant with one seed (unless finished), then score it on every test set")
    one.add_argument("--train", choices=DATASETS, required=True)
    one.add_argument("--variant", choices=VARIANTS, required=True)
    one.add_argument("--seed", type=int, required=True)
    commands.add_parser("table", help="mean and spread over seeds per training set, variant and test set")
    args = parser.parse_args()
    {"run": run_and_score, "table": table}[args.command](args)


if __name__ == "__main__":
    main()
