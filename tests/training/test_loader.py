"""Training samples: augmentation tied to (seed, epoch, index), photometric jitter, loaders."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image
from torchvision import tv_tensors

from crackseg.data.datasets import open_dataset
from crackseg.data.pairing import Sample
from crackseg.training.image_cache import decoded_samples
from crackseg.training.loader import CrackDataset, EpochSampler, make_loader
from crackseg.training.transforms import DeviceGeometry, PhotometricJitter, gaussian_blur, train_transform, window_side, window_transform


def test_augmentation_keeps_image_and_mask_aligned(tmp_path):
    rng = np.random.default_rng(5)
    mask = np.zeros((80, 96), np.uint8)
    for _ in range(6):
        y, x = rng.integers(0, 70), rng.integers(0, 86)
        mask[y : y + rng.integers(2, 10), x : x + rng.integers(2, 10)] = 1
    image = np.stack([mask * 255, np.zeros_like(mask), np.full_like(mask, 128)], axis=2)
    Image.fromarray(image).save(tmp_path / "i.png")
    Image.fromarray(mask * 255).save(tmp_path / "m.png")
    sample = Sample("i", tmp_path / "i.png", tmp_path / "m.png")
    for scale in [(1.0, 1.0), (0.6, 1.6)]:
        dataset = CrackDataset([sample], train_transform(48, scale=scale), seed=0)
        for epoch in range(12):
            out_image, out_mask = dataset[(epoch, 0)]
            assert out_image.shape == (3, 48, 48) and out_mask.shape == (1, 48, 48)
            assert set(out_mask.unique().tolist()) <= {0, 1}
            from_image = out_image[0] > 127
            agreement = (from_image == out_mask[0].bool()).float().mean().item()
            assert agreement == 1.0 if scale == (1.0, 1.0) else agreement > 0.97


def test_augmentation_is_a_function_of_seed_epoch_and_index(synth_root):
    found = open_dataset(synth_root)
    dataset = CrackDataset(found.samples, train_transform(32), seed=1)
    first = dataset[(2, 3)][0]
    dataset[(0, 0)]
    torch.manual_seed(123)
    assert torch.equal(dataset[(2, 3)][0], first)
    assert not torch.equal(dataset[(3, 3)][0], first)
    assert not torch.equal(CrackDataset(found.samples, train_transform(32), seed=2)[(2, 3)][0], first)


def test_photometric_jitter_matches_torchvision():
    from torchvision.transforms.v2 import functional as TF

    images = torch.randint(0, 256, (6, 3, 20, 24), dtype=torch.uint8)
    scaled = images.float() / 255
    for sigma in (0.3, 1.1):
        expected = torch.stack([TF.gaussian_blur(image, [5, 5], [sigma, sigma]) for image in scaled])
        assert torch.allclose(gaussian_blur(scaled, torch.full((6,), sigma), 5), expected, atol=1e-6)

    jitter_only = PhotometricJitter(jitter_p=1.0, blur_p=0.0, noise_p=0.0)
    torch.manual_seed(3)
    out = jitter_only(images)
    torch.manual_seed(3)
    torch.rand(6)  # the draw that chooses which images to jitter (all, at p=1)
    brightness = 0.75 + 0.5 * torch.rand(6)
    contrast = 0.75 + 0.5 * torch.rand(6)
    for image, result, b, c in zip(scaled, out, brightness, contrast):
        expected = TF.adjust_contrast(TF.adjust_brightness(image, b.item()), c.item())
        assert torch.allclose(result, expected, atol=1e-5)
    assert len({round(float(r.mean()), 4) for r in out}) == 6  # one draw per image


def test_photometric_jitter_choices_and_reproducibility():
    images = torch.randint(0, 256, (64, 3, 16, 16), dtype=torch.uint8)
    assert torch.equal(PhotometricJitter(jitter_p=0.0, blur_p=0.0, noise_p=0.0)(images), images.float() / 255)
    noise_only = PhotometricJitter(jitter_p=0.0, blur_p=0.0, noise_p=0.5)
    torch.manual_seed(0)
    changed = (noise_only(images) != images.float() / 255).flatten(1).any(dim=1)
    assert 16 < int(changed.sum()) < 48
    jitter = PhotometricJitter()
    torch.manual_seed(7)
    first = jitter(images)
    assert first.dtype == torch.float32 and 0 <= first.min() and first.max() <= 1
    torch.manual_seed(7)
    assert torch.equal(jitter(images), first)
    assert not torch.equal(jitter(images), first)


def test_loader_workers_and_cache_give_the_same_batches(synth_root):
    found = open_dataset(synth_root)
    batches = []
    for workers, cache in [(0, False), (2, True)]:
        dataset = CrackDataset(found.samples, train_transform(32), seed=4, cached=decoded_samples(found.samples) if cache else None)
        sampler = EpochSampler(torch.utils.data.SequentialSampler(dataset))
        sampler.set_epoch(5)
        loader = make_loader(dataset, 4, sampler, workers=workers)
        batches.append([images for images, _ in loader])
    assert all(torch.equal(a, b) for a, b in zip(*batches))


def test_a_photo_gone_while_loader_workers_read_is_one_line_as_without_workers(tmp_path, synth_root, capsys):
    """torch raises a worker's InputError again in the main process, the worker's traceback in its message: the CLI
    says what the worker said, as it does when the main process reads the photo itself."""
    import shutil

    import pytest

    from crackseg.core.errors import InputError, user_message

    data = shutil.copytree(synth_root, tmp_path / "data")
    found = open_dataset(data)
    (found.samples[0].image).unlink()  # after the dataset was checked, before an epoch reads it
    said = []
    for workers in (0, 1):
        dataset = CrackDataset(found.samples, train_transform(32), seed=4)
        loader = make_loader(dataset, 2, EpochSampler(torch.utils.data.SequentialSampler(dataset)), workers=workers)
        with pytest.raises(InputError) as caught:
            next(iter(loader))
        said.append(user_message(caught.value))
    assert said[0] == said[1] and said[0].startswith(f"{found.samples[0].image}: ") and "\n" not in said[0], said


def test_device_geometry_unscaled_is_one_of_the_eight_turns_and_flips_of_its_window():
    """Region = window: each output is exactly a dihedral transform of its input, image and mask the same one."""
    torch.manual_seed(3)
    images = torch.randint(0, 256, (64, 3, 16, 16), dtype=torch.uint8)
    masks = torch.randint(0, 2, (64, 1, 16, 16), dtype=torch.uint8)
    out_images, out_masks = DeviceGeometry(16, (1.0, 1.0))(images, masks)
    seen = set()
    for image, mask, out_image, out_mask in zip(images, masks, out_images, out_masks):
        views = [(turns, flip) for turns in range(4) for flip in (False, True)
                 if torch.equal(torch.rot90(image.flip(-1) if flip else image, turns, (-2, -1)), out_image)]
        assert len(views) == 1
        turns, flip = views[0]
        assert torch.equal(torch.rot90(mask.flip(-1) if flip else mask, turns, (-2, -1)), out_mask)
        seen.add(views[0])
    assert len(seen) == 8


def test_device_geometry_keeps_image_and_mask_aligned_and_the_mask_binary():
    torch.manual_seed(5)
    side = window_side(48)
    images = torch.zeros(32, 3, side, side, dtype=torch.uint8)
    masks = torch.zeros(32, 1, side, side, dtype=torch.uint8)
    for k in range(32):
        for _ in range(6):
            row, col = torch.randint(0, side - 12, (2,)).tolist()
            height, width = torch.randint(3, 12, (2,)).tolist()
            images[k, 0, row : row + height, col : col + width] = 255
            masks[k, 0, row : row + height, col : col + width] = 1
    out_images, out_masks = DeviceGeometry(48)(images, masks)
    assert out_images.shape == (32, 3, 48, 48) and out_images.dtype == torch.uint8 and out_masks.shape == (32, 1, 48, 48)
    assert set(out_masks.unique().tolist()) == {0, 1}
    assert ((out_images[:, 0] > 127) == (out_masks[:, 0] == 1)).float().mean() > 0.99  # only resampled edges may differ
    dataset_windows = window_transform(48)(tv_tensors.Image(images[0]), tv_tensors.Mask(masks[0]))
    assert dataset_windows[0].shape == (3, side, side)
