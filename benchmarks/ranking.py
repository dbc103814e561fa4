"""Does ranking help? Fine-tune on the N photos ``crackseg labels rank`` lists first against N random ones.

    python benchmarks/ranking.py run --dataset cfd --seeds 0 1 2
    python benchmarks/ranking.py table --dataset cfd

Only ``train.txt`` is used for choosing: a seeded draw splits it into a fixed validation set
(every run validates on it), a first labelled set, and the pool a team would label next. A base
model is trained on the first set; it predicts the pool with ``--save-prob`` and ``labels rank``
orders the pool. Then, per seed, two arms fine-tune the base (``--init``) for the same epochs on
the first set plus N more photos: the N ranked first (``ranked``), or N drawn at random from the
pool with that seed (``random``). Every model is scored once on ``test.txt`` at 0 and 2 px.
Runs go to ``checkpoints/ranking/DATASET``; datasets are read from ``../shared/datasets``
(``--root``) through symbolic links and never copied.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

from recipe import BUDGET, DATASETS, ROOT, VARIANTS, evaluate_run, experiment_parser, read_scores, spread

VARIANT = VARIANTS["bce+dice-sqrt-bf16cl"]  # the default recipe on this CPU
SPLIT_SEED = 0


def _draw(dataset_root: Path, val: int, first: int) -> dict[str, list[str]]:
    stems = [line.strip() for line in (dataset_root / "train.txt").read_text().splitlines() if line.strip()]
    random.Random(SPLIT_SEED).shuffle(stems)
    return {"val": sorted(stems[:val]), "first": sorted(stems[val:val + first]), "pool": sorted(stems[val + first:])}


def _dataset(folder: Path, dataset_root: Path, train: list[str], val: list[str]) -> Path:
    """A dataset folder whose images/ and masks/ link to the shared ones, with its own split files."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("images", "masks"):
        if not (folder / name).exists():
            (folder / name).symlink_to((dataset_root / name).resolve(), target_is_directory=True)
    (folder / "train.txt").write_text("\n".join(sorted(train)) + "\n")
    (folder / "val.txt").write_text("\n".join(val) + "\n")
    (folder / "test.txt").write_text((dataset_root / "test.txt").read_text())
    return folder


def _train(data: Path, run_dir: Path, epochs: int, seed: int, init: Path | None = None) -> None:
    if (run_dir / "test" / "tol2" / "report.json").exists():
        return
    command = [str(ROOT / "launch.sh"), "--nproc", "2", "train", "--data", str(data), "--run", str(run_dir), *BUDGET,
               "--epochs", str(epochs), "--seed", str(seed), *VARIANT, *(["--init", str(init)] if init else [])]
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True, env={**os.environ, "PYTHON": sys.executable})
    evaluate_run(run_dir / "best.pt", data, run_dir / "test")


def _image(dataset_root: Path, stem: str) -> Path:
    return next(path for path in (dataset_root / "images").iterdir() if path.stem == stem)


def _rank_pool(base: Path, dataset_root: Path, pool: list[str], out: Path) -> list[str]:
    """The pool's stems as ``labels rank`` orders them from the base model's probability maps."""
    if not (out / "rank.csv").exists():
        command = [sys.executable, "-m", "crackseg", "predict", "--checkpoint", str(base / "best.pt"),
                   *[str(_image(dataset_root, stem)) for stem in pool], "--out", str(out), "--save-prob", "8",
                   "--no-measure", "--device", "cpu", "--overwrite"]
        print(" ".join(command[:6]), "...", flush=True)
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        subprocess.run([sys.executable, "-m", "crackseg", "labels", "rank", str(out)], check=True)
    return _read_rank(out)


def _read_rank(out: Path) -> list[str]:
    if not (out / "rank.csv").exists():
        sys.exit(f"{out / 'rank.csv'}: not found; run the experiment first (ranking.py run)")
    with open(out / "rank.csv", newline="") as file:
        return [Path(row["path"]).stem for row in csv.DictReader(file)]


def run(args: argparse.Namespace) -> None:
    dataset_root = args.root / DATASETS[args.dataset][0]
    home = args.runs / args.dataset
    draw = {**_draw(dataset_root, args.val, args.first), "n": args.n, "base_epochs": args.base_epochs, "epochs": args.epochs}
    home.mkdir(parents=True, exist_ok=True)
    if (home / "draw.json").exists() and json.loads((home / "draw.json").read_text()) != draw:
        sys.exit(f"{home / 'draw.json'}: its runs were made with other settings; give another --runs")
    (home / "draw.json").write_text(json.dumps(draw, indent=1) + "\n")
    base = home / "base"
    _train(_dataset(home / "data-base", dataset_root, draw["first"], draw["val"]), base, args.base_epochs, SPLIT_SEED)
    order = _rank_pool(base, dataset_root, draw["pool"], home / "pool-predictions")
    picks = {"ranked": lambda seed: order[:args.n], "random": lambda seed: _random_pick(draw["pool"], args.n, seed)}
    for seed in args.seeds:
        for arm, pick in picks.items():
            chosen = pick(seed)
            data = _dataset(home / f"data-{arm}-s{seed}", dataset_root, draw["first"] + chosen, draw["val"])
            _train(data, home / f"{arm}-s{seed}", args.epochs, seed, init=base / "best.pt")


def _random_pick(pool: list[str], n: int, seed: int) -> list[str]:
    return random.Random(1000 + seed).sample(pool, n)


def table(args: argparse.Namespace) -> None:
    """Mean ± sd per arm over seeds, and the ranked arm's gap to the random one seed for seed."""
    home = args.runs / args.dataset
    draw = json.loads((home / "draw.json").read_text())
    order = _read_rank(home / "pool-predictions")
    runs = {path.name: read_scores(path / "test") for path in sorted(home.iterdir()) if (path / "test" / "tol2" / "report.json").exists()}
    print(f"{args.dataset}: validation {len(draw['val'])}, first labelled {len(draw['first'])}, pool {len(draw['pool'])}, "
          f"N = {draw['n']}; base {draw['base_epochs']} epochs, fine-tuning {draw['epochs']} epochs\n")
    print("| model | seeds | f1@0 | iou | ods | f1@2 |\n|---|---|---|---|---|---|")
    for arm in ("base", "random", "ranked"):
        members = [figures for name, figures in runs.items() if name == arm or name.startswith(f"{arm}-s")]
        if members:
            print(f"| {arm} | {len(members)} | " + " | ".join(spread([m[key] for m in members]) for key in ("f1@0", "iou", "ods", "f1@2")) + " |")
    seeds = sorted(int(name.rsplit("-s", 1)[1]) for name in runs if name.startswith("ranked-s"))
    seeds = [seed for seed in seeds if f"random-s{seed}" in runs]
    for key in ("f1@0", "f1@2"):
        gaps = [runs[f"ranked-s{seed}"][key] - runs[f"random-s{seed}"][key] for seed in seeds]
        if gaps:
            print(f"\nranked - random, {key}, per seed: " + ", ".join(f"{gap:+.4f}" for gap in gaps) + f"; mean {spread(gaps)}")
    chosen = set(order[:draw["n"]])
    print("\nranked photos among the random pick, per seed: "
          + ", ".join(str(len(chosen & set(_random_pick(draw["pool"], draw["n"], seed)))) for seed in seeds))
    crack = {stem: _crack_share(args.root / DATASETS[args.dataset][0], stem) for stem in draw["pool"]}
    print(f"\nmean crack pixel share of the photos picked: ranked {statistics.mean(crack[s] for s in chosen):.4f}, "
          f"pool {statistics.mean(crack.values()):.4f}")


def _crack_share(dataset_root: Path, stem: str) -> float:
    import numpy as np
    from PIL import Image

    mask = next(path for path in (dataset_root / "masks").iterdir() if path.stem == stem)
    return float((np.asarray(Image.open(mask).convert("L")) > 127).mean())


def main() -> None:
    parser, commands = experiment_parser(__doc__, "ranking", "folder of the experiments")
    one = commands.add_parser("run", help="base model, ranking, then both arms for every seed (what is missing)")
    one.add_argument("--dataset", choices=DATASETS, default="cfd")
    one.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    one.add_argument("--val", type=int, default=8, help="validation photos drawn from train.txt")
    one.add_argument("--first", type=int, default=16, help="photos labelled before ranking")
    one.add_argument("--n", type=int, default=16, help="photos each arm adds")
    one.add_argument("--base-epochs", type=int, default=120)
    one.add_argument("--epochs", type=int, default=50, help="fine-tuning epochs of both arms")
    commands.add_parser("table", help="figures per arm").add_argument("--dataset", choices=DATASETS, default="cfd")
    args = parser.parse_args()
    {"run": run, "table": table}[args.command](args)


if __name__ == "__main__":
    main()
