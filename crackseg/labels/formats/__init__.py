"""Annotation files of labelling tools <-> crack masks, each tool's coordinates read as the tool reads them.

- ``coco``, ``cvat``, ``labelme``, ``label_studio``: one module per tool; each reads its tool's file
  into :class:`~crackseg.labels.formats.shapes.Annotations` (its docstring says where the tool puts
  a pixel) and writes masks as its pre-annotations (``*_document``), with its own RLE codec.
- ``shapes``: what a file holds (Annotations, LabelledImage, Shape) and each shape drawn as its
  tool draws it (``paint_all``).
- ``outlines``: masks -> polygons and outlines that the tools draw back as exactly those pixels.
- ``reading``: LABEL_FORMATS and ``read_annotations``, which picks a format's reader (torch-free and
  cheap to import: the CLI builds its ``--format`` choices from it).

Imports point one way: reading -> tool modules -> shapes, outlines -> crackseg.core. No torch.
This file imports nothing: import from the modules.
"""
