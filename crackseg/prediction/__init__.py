"""prediction: photos and rasters -> masks, probabilities, overlays and crack tables in a predictions folder.

- ``options``: ``crackseg predict``'s and ``crackseg report``'s options (PredictOptions).
- ``work``: the inputs listed, the run planned before any work (Plan, Job), the work list every engine splits.
- ``engines``: the table of ``--engine``; ``local_engine`` (this process or torchrun's) and ``ray_engine`` (Ray's
  actors, the driver the one writer) run the work list.
- ``predict``: ``crackseg predict`` read top to bottom (plan, load the runtime, run the engine, write the tables).
- ``outputs``: the predictions folder (:class:`~crackseg.prediction.outputs.PredictionsFolder`): every
  file's name, and the one writer and reader of its tables (predictions.csv, cracks.csv); written through
  :class:`crackseg.core.staging.StagedFolder`, so that an --out in object storage is staged locally.
- ``pictures``: one image's prediction drawn: the overlay JPEG, mask and probability PNGs.
- ``streamed``: rasters too large to hold, predicted and written block by block.
- ``report``: the predictions folder's ``report.html``.
- ``session``: a model loaded once, predict's mask of one picture at a time (the labelling tools' backends).

May import crackseg.model, crackseg.cracks, crackseg.data, crackseg.core; ``options``, ``engines``, ``outputs``,
``pictures`` and ``report`` load no torch. This file imports nothing: import from the modules.
"""
