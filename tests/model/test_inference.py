"""Tiling, blending, batching and TTA: one image's probabilities whatever it is batched with."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from crackseg.model.options import InferenceOptions
from crackseg.model.inference import Predictor, tile_starts
from crackseg.model.networks import CrackSegModel


def test_one_tile_equals_the_whole_image_and_tiles_agree_inside(model):
    image = torch.randint(0, 256, (3, 96, 160), dtype=torch.uint8)
    with torch.no_grad():
        whole = torch.sigmoid(model(image[None]))[0, 0]
    one_tile = dict(Predictor(model, torch.device("cpu"), InferenceOptions(tile=256)).probabilities([(0, image)]))[0]
    assert torch.allclose(one_tile, whole, atol=1e-6)
    tiled = dict(Predictor(model, torch.device("cpu"), InferenceOptions(tile=64, overlap=32)).probabilities([(0, image)]))[0]
    assert tiled.shape == whole.shape
    assert (tiled - whole).abs().mean() < 0.05  # tiles see less context, but agree on average


def test_blending_leaves_no_seam_on_a_constant_image(model):
    image = torch.full((3, 192, 320), 128, dtype=torch.uint8)  # multiples of the tile: without overlap, tiles meet edge to edge

    def largest_jump(overlap: int) -> float:
        prob = dict(Predictor(model, torch.device("cpu"), InferenceOptions(tile=64, overlap=overlap)).probabilities([(0, image)]))[0]
        inner = prob[8:-8, 8:-8]
        return max((inner[1:] - inner[:-1]).abs().max().item(), (inner[:, 1:] - inner[:, :-1]).abs().max().item())

    hard, blended = largest_jump(0), largest_jump(32)
    assert blended < hard / 3, (blended, hard)


def test_flip_tta_on_an_equivariant_model_gives_the_plain_result():
    torch.manual_seed(0)
    net = nn.Conv2d(3, 1, kernel_size=1)  # pointwise: equivariant to flips and rotations by construction
    model = CrackSegModel(net, "unet", "pointwise", size_divisor=1).eval()
    image = torch.randint(0, 256, (3, 40, 56), dtype=torch.uint8)
    plain = dict(Predictor(model, torch.device("cpu"), InferenceOptions(tta="none")).probabilities([(0, image)]))[0]
    for tta in ("flip", "d4"):
        averaged = dict(Predictor(model, torch.device("cpu"), InferenceOptions(tta=tta)).probabilities([(0, image)]))[0]
        assert torch.allclose(averaged, plain, atol=1e-6), tta
    lopsided = CrackSegModel(nn.Conv2d(3, 1, kernel_size=(1, 3), padding=(0, 1)), "unet", "x", 1).eval()
    assert not torch.allclose(
        dict(Predictor(lopsided, torch.device("cpu"), InferenceOptions(tta="flip")).probabilities([(0, image)]))[0],
        dict(Predictor(lopsided, torch.device("cpu"), InferenceOptions(tta="none")).probabilities([(0, image)]))[0],
    )


def test_tiles_of_many_images_share_batches(model):
    calls = []
    original = model.forward

    def counting(images):
        calls.append(len(images))
        return original(images)

    model.forward = counting
    try:
        images = [(k, torch.randint(0, 256, (3, 64, 64), dtype=torch.uint8)) for k in range(10)]
        results = dict(Predictor(model, torch.device("cpu"), InferenceOptions(batch_size=4)).probabilities(images))
    finally:
        del model.forward
    assert sorted(results) == list(range(10)) and calls == [4, 4, 2]


@pytest.mark.parametrize("options", [dict(tile=64, overlap=16, batch_size=3), dict(tile=64, overlap=16, batch_size=3, tta="flip"),
                                     dict(resize=(48, 48), batch_size=2)], ids=["tiles", "tta", "resize"])
def test_masks_are_the_probabilities_at_the_threshold(model, options):
    """Photos of one tile and photos of several, batched together (a 64 px tile of each shares a batch): where the model
    runs, only the masks of the one-tile photos are final; the others are thresholded after blending or resizing."""
    torch.manual_seed(1)
    images = [(k, torch.randint(0, 256, shape, dtype=torch.uint8))
              for k, shape in enumerate([(3, 64, 64), (3, 96, 128), (3, 64, 64), (3, 40, 56), (3, 64, 64)])]
    predictor = Predictor(model, torch.device("cpu"), InferenceOptions(**options))
    probabilities = dict(predictor.probabilities(images))
    threshold = float(torch.cat([prob.flatten() for prob in probabilities.values()]).median())  # a threshold that splits them
    masks = dict(predictor.masks(images, threshold))
    assert sorted(masks) == sorted(probabilities)
    for key, mask in masks.items():
        assert mask.dtype == torch.bool and mask.shape == images[key][1].shape[1:]
        assert torch.equal(mask, probabilities[key] >= threshold), key
        assert 0 < mask.sum() < mask.numel(), key


def test_tile_starts_cover_the_image_and_end_flush():
    assert tile_starts(100, 256, 32) == [0]
    assert tile_starts(700, 256, 32) == [0, 222, 444]  # spread evenly, not a sliver of a stride at the end
    for length in (257, 500, 1000, 4097):
        starts = tile_starts(length, 256, 64)
        assert starts[0] == 0 and starts[-1] == length - 256
        assert all(b - a <= 256 - 64 for a, b in zip(starts, starts[1:]))


@pytest.mark.slow  # the compiler: about 40 s on 2 cores
def test_compile_runs_whole_tiles_as_one_compiled_shape_and_gives_the_eager_probabilities():
    """Whole tiles in batches padded to --batch-size are one shape: compiled once. Smaller images run eagerly."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 1, 3, padding=1))
    model = CrackSegModel(net, "unet", "tiny", size_divisor=1).eval()
    sizes = [(64, 64), (100, 90), (40, 50), (64, 64), (130, 64)]  # 1 + 4 + eager + 1 + 3 whole tiles: 9, batches 4, 4, 1
    images = [(k, torch.randint(0, 256, (3, *size), dtype=torch.uint8)) for k, size in enumerate(sizes)]
    options = dict(tile=64, overlap=16, batch_size=4)
    eager = dict(Predictor(model, torch.device("cpu"), InferenceOptions(**options)).probabilities(images))
    torch._dynamo.reset()
    counters.clear()
    compiled = dict(Predictor(model, torch.device("cpu"), InferenceOptions(**options, compile=True)).probabilities(images))
    assert counters["stats"]["unique_graphs"] == 1
    assert sorted(compiled) == sorted(eager)
    for key in eager:
        torch.testing.assert_close(compiled[key], eager[key], atol=1e-5, rtol=1e-5)
