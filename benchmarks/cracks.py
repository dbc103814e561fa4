"""How often a true crack comes out of `crackseg predict` as exactly one crack: an accuracy figure (docs/results.md).

    crackseg synth data/demo-test-truth --count 16 --size 256 --seed 1 --truth --overwrite
    python benchmarks/cracks.py --checkpoint checkpoints/demo/best.pt --data data/demo-test-truth

The model predicts the images of --data once; its masks are then split into cracks twice:
every connected piece (as cracks.csv listed them before pieces were joined), and joined
with specks dropped at predict's defaults. Each found crack is given to the true crack
nearest to most of its pixels (within 3 px); found cracks near none are false cracks.
Lengths are measured the same way on both sides (crackseg.cracks.measure on the true crack's
pixels); a true crack's length error is the summed length of the found cracks given to it
over its true length, minus 1, over the true cracks found at all.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from scipy import ndimage

from crackseg.cracks.measure import CrackMeasure, find_cracks
from crackseg.model.options import InferenceOptions
from crackseg.prediction.options import PredictOptions
from crackseg.prediction.outputs import OutputSpec
from crackseg.prediction.predict import predict_folder
from harness import RESULTS, write_report

NEAR_PX = 3  # a found crack's pixel belongs to the true crack within this distance, if any


def _owners(truth: np.ndarray, labels: np.ndarray, cracks: list[CrackMeasure]) -> dict[int, int]:
    """{found crack id: the true crack id nearest to most of its pixels, or 0 when most are near none}.

    ``truth``: (H, W) true crack ids, 0 for background; ``labels``: (H, W) found crack ids.
    """
    distance, (near_y, near_x) = ndimage.distance_transform_edt(truth == 0, return_indices=True)
    nearest = np.where(distance <= NEAR_PX, truth[near_y, near_x], 0)
    owners = {}
    for crack in cracks:
        votes = np.bincount(nearest[labels == crack.id], minlength=256)
        owners[crack.id] = int(votes[1:].argmax() + 1) if votes[1:].max() * 2 > votes.sum() else 0
    return owners


def count_cracks(checkpoint: Path, data: Path, device: str) -> list[dict]:
    """One row per join setting: true cracks found as exactly one crack, false cracks, length errors.

    ``data`` is a folder written by ``crackseg synth --truth``: its truth/<stem>.png labels
    each true crack with its own id.
    """
    settings = [("every connected piece (before)", "0px", "0px"), ("joined, specks dropped (defaults)", None, None)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "pred"
        predict_folder(checkpoint, [str(data / "images")], PredictOptions(out=out, inference=InferenceOptions(device=device), measure=False))
        stems = sorted(p.stem for p in (data / "truth").iterdir())
        for label, gap, shortest in settings:
            options = PredictOptions(out=out, **({"join_gap": gap, "min_length": shortest} if gap else {}))
            spec = OutputSpec.of(options)
            true_total = one = found = false = 0
            errors = []
            for stem in stems:
                truth = np.asarray(Image.open(data / "truth" / f"{stem}.png"))
                mask = np.asarray(Image.open(out / "masks" / f"{stem}.png")) > 127
                labels, cracks = find_cracks(mask, spec.join_gap_px, spec.min_length_px)
                owners = _owners(truth, labels, cracks)
                found += len(cracks)
                false += sum(owner == 0 for owner in owners.values())
                for true_id in np.unique(truth[truth > 0]):
                    true_length = sum(c.length_px for c in find_cracks(truth == true_id)[1])
                    pieces = [c for c in cracks if owners[c.id] == true_id]
                    true_total += 1
                    one += len(pieces) == 1
                    if pieces:
                        errors.append(sum(c.length_px for c in pieces) / true_length - 1)
            rows.append({"setting": label, "join_gap_px": spec.join_gap_px, "min_length_px": spec.min_length_px,
                         "true_cracks": true_total, "found_cracks": found, "true_found_as_one": one,
                         "share_as_one": round(one / max(true_total, 1), 3), "false_cracks": false,
                         "median_length_error": round(float(np.median(errors)), 3) if errors else None,
                         "mean_abs_length_error": round(float(np.mean(np.abs(errors))), 3) if errors else None})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, required=True, help="the model whose predictions are counted")
    parser.add_argument("--data", type=Path, required=True, help="a folder written by crackseg synth --truth")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    parser.add_argument("--out", type=Path, default=RESULTS / "cracks.json", help="JSON file (default benchmarks/results/cracks.json)")
    args = parser.parse_args()
    write_report(count_cracks(args.checkpoint, args.data, args.device), args.out)


if __name__ == "__main__":
    main()
