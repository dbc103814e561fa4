"""labels: annotation files of labelling tools <-> datasets and pre-annotations.

- ``formats/``: one module per labelling tool (COCO, CVAT, labelme, Label Studio), each tool's
  coordinates read as the tool reads them, and what the tools share (shapes, outlines, reading).
- ``loop``: ``crackseg labels``: import a tool's file as a crackseg dataset, export predictions as
  pre-annotations, rank photos by how unsure the model was.
- ``options``: the options of ``crackseg labels import|export|rank``.

May import crackseg.prediction, crackseg.data, crackseg.core; no torch at import.
This file imports nothing: import from the modules.
"""
