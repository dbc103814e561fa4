"""JPEG photos decoded in batches where the model runs, the others in the loader workers.

On a GPU a loader worker only reads a JPEG's bytes and checks its header (Pillow reads no pixels for that); the main
process decodes a batch of them at once with nvJPEG (``torchvision.io.decode_jpeg`` on CUDA), so decoding no longer
takes the CPU time each photo needs to keep up with the model. Only JPEGs that Pillow would hand over unchanged go
there: RGB or grey, shown as stored (EXIF orientation 1). Every other photo, and any batch the device cannot decode,
is decoded by Pillow (:func:`crackseg.data.images.load_image`) as before, so a photo is never lost to the faster path.
Two JPEG decoders may round a few pixel values differently (their inverse DCT and chroma upsampling): masks from
``--decode device`` may differ from ``--decode workers`` at a few pixels on a crack's edge.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import torch

from crackseg.core.storage import RemoteFile
from crackseg.data.images import describe_error, load_image, open_picture, orientation, picture_bytes

DECODE_BATCH = 32  # JPEGs decoded together: nvJPEG's batched decode gains with more; the loader prefetches them anyway
_JPEG_SIGNATURE = b"\xff\xd8\xff"


def read_photo(path: Path | RemoteFile) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """A loader worker's part: (None, the file's bytes as 1-D uint8) for a JPEG the device may decode as Pillow would
    show it; (the photo decoded here, None) for any other. Raises as :func:`load_image` does for a file that is no
    picture (one in object storage refused from its header)."""
    data = picture_bytes(path)
    if data.startswith(_JPEG_SIGNATURE):
        with open_picture(io.BytesIO(data)) as image:  # the header alone: no pixels decoded
            if image.format == "JPEG" and image.mode in ("RGB", "L") and orientation(image) == 1:
                return None, torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return load_image(io.BytesIO(data)), None


def decode_batch(raws: list[torch.Tensor], device: torch.device) -> list[torch.Tensor | str]:
    """Each JPEG of ``raws`` as (3, H, W) uint8 on ``device``, or the reason it cannot be read. Decoded together on the
    device; if the device refuses the batch, each file by Pillow on the CPU."""
    from torchvision.io import ImageReadMode, decode_jpeg

    try:
        with warnings.catch_warnings():  # each call of torchvision 0.29's decoders announces their move to TorchCodec
            warnings.simplefilter("ignore", DeprecationWarning)
            return list(decode_jpeg(raws, mode=ImageReadMode.RGB, device=device))
    except RuntimeError:
        results: list[torch.Tensor | str] = []
        for raw in raws:
            try:
                results.append(load_image(io.BytesIO(raw.numpy().tobytes())).to(device))
            except Exception as error:  # a file no decoder reads is reported, the others go on
                results.append(describe_error(error))
        return results
