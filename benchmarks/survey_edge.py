"""What the model should see outside a raster's survey: false cracks along the survey's edge by the pixels put there.

    python benchmarks/survey_edge.py --per-dataset 12

Each of the first test photos of cfd, crack500-subset and walls-mixed (``../shared/datasets``, read, never copied)
gets a slanted edge: left of it is outside the survey, as an orthomosaic's footprint leaves its corners. The model
sees those pixels black, white (what rasters often hold there), mid-grey (``OUTSIDE_GREY``: what crackseg feeds) or
the nearest surveyed pixel, and each is scored inside the survey against the photo's true mask: false and true crack
pixels within ``--near`` px of the edge, false ones further in, and pixels within ``--near`` px that differ from the
whole photo's prediction. The model is the shipped general one unless ``--model`` names another, at its threshold.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from scipy import ndimage

from crackseg.data.images import crack_mask, image_pixels
from crackseg.data.rasters import OUTSIDE_GREY
from crackseg.model.inference import Predictor
from crackseg.model.options import InferenceOptions
from crackseg.model.runtimes import choose_runtime, load_runtime
from crackseg.model.shipped import model_file

ROOT = Path(__file__).resolve().parents[2] / "shared" / "datasets"
DATASETS = ("cfd", "crack500-subset", "walls-mixed")


def _filled(pixels: np.ndarray, inside: np.ndarray, fill: str) -> np.ndarray:
    if fill == "nearest":
        _, (rows, cols) = ndimage.distance_transform_edt(~inside, return_indices=True)
        return pixels[rows, cols]
    value = {"black": 0, "white": 255, "grey": OUTSIDE_GREY}[fill]
    return np.where(inside[..., None], pixels, np.uint8(value))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="general", help="checkpoint, model file or shipped model name (default: general)")
    parser.add_argument("--per-dataset", type=int, default=12, help="test photos of each dataset")
    parser.add_argument("--near", type=int, default=24, help="px from the edge counted as near it")
    parser.add_argument("--root", type=Path, default=ROOT, help="the datasets' folder (default: ../shared/datasets)")
    args = parser.parse_args()
    options = InferenceOptions(device="cpu", amp="off")
    runtime = load_runtime(choose_runtime(model_file(args.model), options))
    threshold = runtime.threshold
    predictor = Predictor(runtime.model, runtime.device, options, runtime.amp_dtype)
    fills = ("black", "white", "grey", "nearest")
    totals = {fill: np.zeros(4, np.int64) for fill in fills}
    photos = 0
    for dataset in DATASETS:
        for stem in (args.root / dataset / "test.txt").read_text().split()[: args.per_dataset]:
            pixels = image_pixels(next((args.root / dataset / "images").glob(f"{stem}.*")))
            truth = crack_mask(next((args.root / dataset / "masks").glob(f"{stem}.*")))
            height, width = truth.shape
            rows, cols = np.mgrid[:height, :width]
            inside = cols + 0.6 * rows > 0.45 * width
            near = inside & (ndimage.distance_transform_edt(inside) <= args.near)
            shown = {"whole": pixels, **{fill: _filled(pixels, inside, fill) for fill in fills}}
            cracks = {name: prob.numpy() >= threshold for name, prob in
                      predictor.probabilities([(name, torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1))))
                                               for name, image in shown.items()])}
            for fill in fills:
                found = cracks[fill]
                totals[fill] += [(found & ~truth & near).sum(), (found & truth & near).sum(),
                                 (found & ~truth & inside & ~near).sum(), ((found != cracks["whole"]) & near).sum()]
            photos += 1
    print(f"{photos} photos, model {args.model}, threshold {threshold:.3f}\n")
    print(f"| outside the survey | false crack px <= {args.near} px | true crack px <= {args.near} px | false crack px further in "
          f"| px <= {args.near} px unlike the whole photo's |\n|---|---|---|---|---|")
    for fill, (false_near, true_near, false_far, differ) in totals.items():
        print(f"| {fill} | {false_near} | {true_near} | {false_far} | {differ} |")


if __name__ == "__main__":
    main()
