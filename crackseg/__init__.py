"""crackseg: find cracks in photos of concrete, pavement, masonry and walls.

``build_model``, ``load_encoder_weights`` and ``load_model`` are imported on first use, so
the command line starts without loading PyTorch for commands that do not need it.
"""

from crackseg.core.version import __version__

__all__ = ["__version__", "build_model", "load_encoder_weights", "load_model"]


def __getattr__(name: str):
    if name == "build_model":
        from crackseg.model.networks import build_model

        return build_model
    if name == "load_encoder_weights":
        from crackseg.model.checkpoint import load_encoder_weights

        return load_encoder_weights
    if name == "load_model":
        from crackseg.model.checkpoint import load_model

        return load_model
    raise AttributeError(f"module 'crackseg' has no attribute {name!r}")
