"""prediction: photos and rasters -> masks, probabilities, overlays and crack tables in a predictions folder.

- ``outputs``: the predictions folder (:class:`~crackseg.prediction.outputs.PredictionsFolder`): every
  file's name, and the one writer and reader of its tables (predictions.csv, cracks.csv).
- ``predict``: ``crackseg predict`` read top to bottom (plan, load the runtime, predict, write the tables).
- ``streamed``: rasters too large to hold, predicted and written block by block.
- ``report``: the predictions folder's ``report.html``.
- ``remote_out``: ``--out s3://bucket/prefix/``: the folder staged locally, each finished file uploaded whole.

May import crackseg.model, crackseg.cracks, crackseg.data, crackseg.core; ``outputs`` and ``report``
load no torch, nor does ``remote_out`` (``predict`` and ``streamed`` do). This file imports nothing: import from the modules.
"""
