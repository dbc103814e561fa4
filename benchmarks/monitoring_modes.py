"""bench.py's compare mode: two inspections of one structure compared, as a user runs it.

compare times whole ``crackseg compare BEFORE AFTER`` runs on 12-megapixel photo pairs whose
masks exist: pairs/s of the whole run, imports included, and the marginal pairs/s of one more pair.
"""

from __future__ import annotations

import argparse
import csv
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from harness import median_rates, window_count

VARIANTS = ("similarity", "homography")  # --transform: alternated in every round, so drift shows in both alike
PHOTO_SIZE, QUICK_SIZE = (3000, 4000), (600, 800)  # (height, width): a 12-megapixel camera; --quick's small pairs
CELLS = (2, 3)  # rows x columns of the photo, one crack in each: spread across it and never touching
EXTENDED = 0  # the cell whose crack grows by two more segments at the later visit


def bench_compare(args: argparse.Namespace) -> list[dict]:
    """Whole ``crackseg compare`` runs, each a fresh process timed from its start to its exit.

    The pairs are seeded synthetic dataset folders (images/ + masks/) in a temporary folder,
    deleted after: pavement texture with a crack in each of six cells, JPEG quality 90 photos,
    PNG masks; the AFTER photo is the scene seen from a moved camera (a similarity: shift 1%,
    turn 2 degrees, scale 1.02) with one crack extended. Each round runs, per --transform
    variant, a compare of all --count pairs and one of the first pair alone; marginal pairs/s
    is (count - 1) over their time difference, the fixed cost (process start, imports, writing
    the tables) the one-pair run less one pair's share. A row's figures only count when its
    check is ok: every pair registered, the extended crack found ``longer`` and the others ``unchanged``.
    """
    count = 2 if args.quick else args.count
    if count < 2:
        raise SystemExit("compare: --count must be at least 2 (the marginal rate compares runs over --count pairs and over 1)")
    height, width = QUICK_SIZE if args.quick else PHOTO_SIZE
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for index in range(count):
            _write_pair(tmp / "all", f"pair{index:02d}", (height, width), seed=index)
        for visit in ("before", "after"):  # the first pair alone, for the fixed cost
            for folder, suffix in (("images", ".jpg"), ("masks", ".png")):
                (tmp / "one" / visit / folder).mkdir(parents=True)
                shutil.copy(tmp / "all" / visit / folder / f"pair00{suffix}", tmp / "one" / visit / folder)

        def compare_run(variant: str, pairs: str):
            command = [sys.executable, "-m", "crackseg", "compare", str(tmp / pairs / "before"), str(tmp / pairs / "after"),
                       "--out", str(tmp / f"out-{variant}-{pairs}"), "--overwrite", "--transform", variant]
            return lambda _: _run_checked(command)

        paths = {(variant, pairs): (compare_run(variant, pairs), count if pairs == "all" else 1)
                 for variant in VARIANTS for pairs in ("all", "one")}
        rates = median_rates(paths, window_count(args, 3), warmup=not args.quick)
        for variant in VARIANTS:
            whole, one = rates[variant, "all"][1], rates[variant, "one"][1]
            seconds = [(count / rate, 1 / rate_one) for rate, rate_one in zip(whole, one)]
            marginal = [(count - 1) / (all_s - one_s) if all_s > one_s else math.inf for all_s, one_s in seconds]
            fixed = [one_s - (all_s - one_s) / (count - 1) for all_s, one_s in seconds]
            problems = _check(tmp / f"out-{variant}-all", count) + _check(tmp / f"out-{variant}-one", 1)
            rows.append({"mode": "compare", "variant": variant, "pairs": count, "photo": f"{width}x{height} JPEG",
                         "pairs_per_s": round(rates[variant, "all"][0], 3), "marginal_pairs_per_s": round(statistics.median(marginal), 3),
                         "fixed_s": round(statistics.median(fixed), 2), "runs": len(whole),
                         "window_pairs_per_s": [round(rate, 3) for rate in whole],
                         "window_marginal_pairs_per_s": [round(rate, 3) for rate in marginal],
                         "check": "; ".join(problems) or "ok"})
    return rows


def _run_checked(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-3000:]}")


def _check(out: Path, count: int) -> list[str]:
    """What is wrong in a comparison's tables: a pair missing or unregistered, the extended crack not found longer,
    another crack not found unchanged."""
    with open(out / "pairs.csv", newline="") as file:
        pairs = list(csv.DictReader(file))
    with open(out / "changes.csv", newline="") as file:
        changes = list(csv.DictReader(file))
    problems = [f"WARNING {out.name}: {len(pairs)} pairs, {count} expected"] if len(pairs) != count else []
    for pair in pairs:
        statuses = sorted(row["status"] for row in changes if row.get("pair") == pair["pair"])
        if pair["status"] != "registered":
            problems.append(f"WARNING {out.name} {pair['name_after']}: {pair['status']} ({pair.get('reason')})")
        elif statuses != sorted(["longer"] + ["unchanged"] * (CELLS[0] * CELLS[1] - 1)):
            problems.append(f"WARNING {out.name} {pair['name_after']}: one crack longer and the others unchanged expected, "
                            f"found {', '.join(statuses) or 'none'}")
    return problems


def _write_pair(root: Path, name: str, size: tuple[int, int], seed: int) -> None:
    """One pair: ``root``/before and ``root``/after, each images/``name``.jpg (quality 90) and masks/``name``.png."""
    from skimage.transform import SimilarityTransform, warp

    from crackseg.data.synth import surface_texture

    rng = np.random.default_rng([seed, 31])
    height, width = size
    surface = surface_texture(rng, height, width)
    lines = _crack_lines(rng, size)
    move = _camera_move(rng, size)
    for visit in ("before", "after"):
        drawn = Image.new("L", (width, height))
        draw = ImageDraw.Draw(drawn)
        for number, (points, crack_width) in enumerate(lines):
            kept = points if visit == "after" or number != EXTENDED else points[:-2]
            draw.line([tuple(point) for point in kept], fill=255, width=crack_width, joint="curve")
        mask = np.asarray(drawn) > 0
        grey = np.where(mask, surface * rng.uniform(0.35, 0.5), surface) + rng.normal(0, 2.0, size)
        if visit == "after":  # the same scene from the moved camera in another day's light; what comes into view repeats the border
            grey = warp(grey, SimilarityTransform(move).inverse, order=1, mode="edge", preserve_range=True) * 1.04
            mask = warp(mask.astype(np.float32), SimilarityTransform(move).inverse, order=1, mode="edge") > 0.5
        photo = np.clip(grey[..., None] * (1.0, 0.98, 0.94), 0, 255).astype(np.uint8)  # a slightly warm grey, as cameras see it
        for folder in ("images", "masks"):
            (root / visit / folder).mkdir(parents=True, exist_ok=True)
        Image.fromarray(photo).save(root / visit / "images" / f"{name}.jpg", quality=90)
        Image.fromarray(mask.astype(np.uint8) * 255).save(root / visit / "masks" / f"{name}.png")


def _crack_lines(rng: np.random.Generator, size: tuple[int, int]) -> list[tuple[np.ndarray, int]]:
    """A crack per cell as (7, 2) (x, y) polyline vertices and a width in px: along the cell one way or the other,
    wandering across it, inside its middle 70% (clear of the other cells and of the border the camera move takes)."""
    height, width = size
    cell_h, cell_w = height / CELLS[0], width / CELLS[1]
    lines = []
    for row in range(CELLS[0]):
        for col in range(CELLS[1]):
            along = np.linspace(0.15, 0.85, 7)
            wander = np.cumsum(rng.normal(0, 0.07, 7))
            across = np.clip(0.5 + wander - wander.mean(), 0.15, 0.85)
            x, y = (along, across) if rng.random() < 0.5 else (across, along)
            points = np.column_stack([(col + x) * cell_w, (row + y) * cell_h])
            lines.append((points, int(rng.integers(5, 10))))
    return lines


def _camera_move(rng: np.random.Generator, size: tuple[int, int]) -> np.ndarray:
    """3x3 BEFORE (col, row) -> AFTER (col, row): about the centre, turned about 2 degrees, scaled about 1.02, shifted about 1%."""
    height, width = size
    turn = math.radians(rng.choice((-1, 1)) * rng.uniform(1.5, 2.5))
    scale = rng.uniform(1.01, 1.03)
    shift = rng.choice((-1, 1), 2) * rng.uniform(0.007, 0.013, 2) * (width, height)
    linear = scale * np.array([[math.cos(turn), -math.sin(turn)], [math.sin(turn), math.cos(turn)]])
    centre = np.array([width - 1, height - 1]) / 2
    return np.vstack([np.column_stack([linear, centre + shift - linear @ centre]), [0, 0, 1]])
