"""monitoring: two inspections of a structure compared crack by crack, and a register that follows each crack.

- ``visits``: the images of an inspection (a predictions folder or a dataset) and how two inspections pair.
- ``registration``: how a BEFORE image maps onto its AFTER image (features, or the rasters' maps).
- ``date_cracks``: one date's cracks of an image, measured as predict measures them, with their centrelines.
- ``changes``: cracks of both dates matched, and what changed (the statuses).
- ``pair``: one pair compared: its masks read, registered, measured and matched, its rows and pictures.
- ``history``: the register, one GeoPackage per site accumulating its inspections.
- ``register_file``: the register's file: its lock, the checks that it can be written, its write transaction.
- ``options``: what the command line gives a comparison (CompareOptions), and the registration transforms.
- ``comparison_folder``: the one writer of what ``--out`` holds (pairs.csv, changes.csv, summary.json, vectors).
- ``compare``: ``crackseg compare``: the run, from the checks made before any work to the register's append.
- ``report``: compare's ``report.html`` (the change report).

May import crackseg.prediction, crackseg.cracks, crackseg.data, crackseg.core; no torch at import
(``visits`` loads it only to read a dataset folder). This file imports nothing: import from the modules.
"""
