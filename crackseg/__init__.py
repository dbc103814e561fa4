"""crackseg: find cracks in photos of concrete, pavement, masonry and walls."""

__version__ = "0.1.0"
