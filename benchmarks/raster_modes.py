"""bench.py's raster mode (docs/benchmarks.md: rasters read by windows).

rasters predicts synthetic GeoTIFFs of 100 megapixels and 1 gigapixel by windows (peak RSS,
megapixels/s) beside a photo decoded whole, and the largest once more as a COG in an s3:// bucket on
moto's S3 server on loopback, read by windows through GDAL's /vsis3/.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from harness import window_count
from storage_modes import moto_server, point_at

# One `crackseg` command in a fresh process, timed after its imports; prints its seconds and peak RSS as JSON.
_RASTER_CHILD = """
import json, sys, time
import onnxruntime, rasterio
import crackseg.prediction.predict
from crackseg.cli.main import main
start = time.perf_counter()
code = main(sys.argv[1:])
seconds = time.perf_counter() - start
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(json.dumps({"code": code, "seconds": seconds, "peak_rss_mb": round(peak / 1024)}))
"""


def bench_rasters(args: argparse.Namespace) -> list[dict]:
    """Rasters predicted by windows: peak RSS and megapixels/s by raster size, beside the photo path.

    Each raster is a synthetic JPEG-compressed tiled GeoTIFF (512 px tiles, EPSG:32633, the
    way survey software writes orthomosaics), made in a temporary folder and deleted after.
    The model is a small CNN exported to ONNX, so the figures are those of the streaming
    (reading, blending, writing) rather than of a large model. Each run is a fresh
    ``crackseg predict --no-measure`` process, timed from after its imports (model loading
    included); its peak RSS is the kernel's VmHWM. The photo path predicts a 36-megapixel JPEG
    photo of the same texture, model and tile, decoded whole, right before each raster run:
    the median over --windows rounds (2 by default) of each.
    """
    import rasterio
    from PIL import Image
    from affine import Affine
    from torch import nn

    from crackseg.model.export import write_exported
    from crackseg.model.networks import CrackSegModel

    sides = [(1200, 1200)] if args.quick else [(10000, 10000), (32000, 32000)]
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 1, 3, padding=1))
    model = CrackSegModel(net, "unet", "small-cnn", size_divisor=1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, moto_server() as endpoint:
        tmp = Path(tmp)
        point_at(endpoint, tmp)  # the child processes inherit the environment
        write_exported(model, "onnx", tmp / "small.onnx")
        texture = _pavement_texture(512, 4096, seed=0)

        def predict(source: Path | str, out: Path) -> dict:
            command = [sys.executable, "-c", _RASTER_CHILD, "predict", str(source), "--model", str(tmp / "small.onnx"),
                       "--out", str(out), "--no-measure", "--threshold", "0.5", "--workers", "0"]
            result = subprocess.run(command, capture_output=True, text=True, check=True)
            return json.loads(result.stdout.strip().splitlines()[-1])

        photo_side = 600 if args.quick else 6000
        repeats = (photo_side // texture.shape[0] + 1, photo_side // texture.shape[1] + 1, 1)
        Image.fromarray(np.tile(texture, repeats)[:photo_side, :photo_side]).save(tmp / "photo.jpg", quality=90)
        with Image.open(tmp / "photo.jpg") as photo:  # megapixels as decoded, so a wrong size cannot inflate the rate
            inputs = {f"JPEG photo {photo.width}x{photo.height}, decoded whole": (tmp / "photo.jpg", photo.width * photo.height / 1e6)}
        for height, width in sides:
            path = tmp / f"ortho-{width}x{height}.tif"
            profile = dict(driver="GTiff", width=width, height=height, count=3, dtype="uint8", crs="EPSG:32633",
                           transform=Affine(0.005, 0.0, 500000.0, 0.0, -0.005, 5000000.0), tiled=True, blockxsize=512, blockysize=512,
                           compress="jpeg", photometric="ycbcr", jpeg_quality=90, bigtiff="if_safer")
            with rasterio.open(path, "w", **profile) as raster:
                for top in range(0, height, 512):
                    rows_here = min(512, height - top)
                    band = np.tile(texture, (1, width // texture.shape[1] + 1, 1))[:rows_here, :width]
                    raster.write(np.ascontiguousarray(band.transpose(2, 0, 1)), window=rasterio.windows.Window(0, top, width, rows_here))
            with rasterio.open(path) as raster:
                inputs[f"GeoTIFF {raster.width}x{raster.height}, JPEG tiles, read by windows"] = (path, raster.width * raster.height / 1e6)
        inputs[_in_store(path, tmp)] = (f"s3://bench/{path.stem}.cog.tif", width * height / 1e6)
        photo_name = next(iter(inputs))
        runs: dict[str, list[dict]] = {name: [] for name in inputs}
        for _ in range(window_count(args, 2)):  # each raster right after a photo run, so drift hits both alike
            for name, (path, _) in list(inputs.items())[1:]:
                if not (args.quick and runs[photo_name]):  # a smoke run times the photo once
                    runs[photo_name].append(predict(inputs[photo_name][0], tmp / "out"))
                    shutil.rmtree(tmp / "out")
                runs[name].append(predict(path, tmp / "out"))
                shutil.rmtree(tmp / "out")
        photo_rate = statistics.median(inputs[photo_name][1] / run["seconds"] for run in runs[photo_name])
        for name, (_, megapixels) in inputs.items():
            rates = [megapixels / run["seconds"] for run in runs[name]]
            rows.append({"mode": "rasters", "input": name, "megapixels": megapixels, "runs": len(rates),
                         "megapixels_per_s": round(statistics.median(rates), 2), "vs_photo": round(statistics.median(rates) / photo_rate, 2),
                         "window_rates": [round(rate, 2) for rate in rates], "peak_rss_mb": max(run["peak_rss_mb"] for run in runs[name])})
    return rows


def _pavement_texture(height: int, width: int, seed: int) -> np.ndarray:
    """(H, W, 3) uint8 grey grain with a few dark lines: a stand-in for pavement that compresses like a photo."""
    rng = np.random.default_rng(seed)
    grain = rng.normal(180, 20, (height // 4, width // 4)).clip(0, 255)
    image = np.kron(grain, np.ones((4, 4)))
    image += rng.normal(0, 6, image.shape)
    for row in range(40, height, 170):
        image[row : row + 3, 100 : width - 100] = 40
    image = image.clip(0, 255).astype(np.uint8)
    return np.repeat(image[..., None], 3, axis=2)


def _in_store(path: Path, tmp: Path) -> str:
    """``path`` copied into a Cloud-Optimized GeoTIFF (JPEG tiles, as survey software exports them) and uploaded to the
    bucket ``bench`` of the loopback server as ``<stem>.cog.tif``; returns the input's name in the table."""
    import rasterio
    import rasterio.shutil
    import s3fs

    cog = tmp / f"{path.stem}.cog.tif"
    rasterio.shutil.copy(path, cog, driver="COG", COMPRESS="JPEG", QUALITY=90, BLOCKSIZE=512, BIGTIFF="IF_SAFER", OVERVIEWS="NONE")
    store = s3fs.S3FileSystem()
    store.mkdir("bench")
    store.put(str(cog), f"bench/{cog.name}")
    cog.unlink()
    with rasterio.open(path) as raster:
        return f"COG {raster.width}x{raster.height}, JPEG tiles, in s3:// (loopback), read by windows"
