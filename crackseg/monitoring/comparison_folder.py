"""The comparison folder: the one place that names and writes what ``crackseg compare`` leaves in ``--out``.

``changes.csv`` (a row per crack), ``pairs.csv`` (a row per pair, and per image present on one side
only), ``summary.json``; with ``--vectors`` a change layer per pair under ``vectors/`` (styled for QGIS by status), with
``--report`` report.html and its pictures under ``report/``. It is written through a
:class:`~crackseg.core.staging.StagedFolder` (one compare at a time; an --out in object storage staged locally, the
earlier compare's outputs downloaded to be decided on as local ones), nothing of an earlier compare replaced unasked, and with
``--overwrite`` none of the earlier compare's files left beside the new ones. Only compare's own files are
claimed: a crack register kept in the folder (named by ``--register`` or not) and any other GeoPackage that is
not a change layer are never replaced or removed.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Callable, Iterable
from contextlib import closing
from pathlib import Path, PurePosixPath

from crackseg.core.errors import InputError
from crackseg.core.files import read_csv, remove_orphan_temps, write_atomic, write_csv
from crackseg.core.staging import StagedFolder
from crackseg.cracks.styles import categorized_style
from crackseg.cracks.vectors import FORMATS, layer_files, sqlite_logs, write_features
from crackseg.monitoring.report import STATUS_COLOURS, write_change_report

CHANGE_COLUMNS = ["path_before", "path_after", "crack_before", "crack_after", "status", "length_px_before", "length_px_after",
                  "mean_width_px_before", "mean_width_px_after", "max_width_px_before", "max_width_px_after"]


TABLES = ("changes.csv", "pairs.csv", "summary.json", "report.html")
_LAYER_SUFFIXES = {suffix for _, suffix in FORMATS.values()} | {".qml"}  # a GeoJSON's style beside it
_PICTURE = re.compile(r"pair(\d+)-(?:before|after)\.jpg")  # report/pair<index>-<side>.jpg, exactly


def writes_at(key: str) -> bool:
    """Whether compare writes at ``key``, a path below its folder in / form: a table, a change layer (or its style) in
    vectors/, a pair's picture in report/. Where an earlier compare's outputs are looked for, on disk or in the store."""
    path = PurePosixPath(key)
    if any(part.startswith(".") or part == ".." for part in path.parts):
        return False
    if len(path.parts) == 1:
        return key in TABLES
    if path.parts[0] == "vectors":
        return path.suffix in _LAYER_SUFFIXES
    return len(path.parts) == 2 and path.parts[0] == "report" and _PICTURE.fullmatch(path.name) is not None


class ComparisonFolder:
    """The files of a comparison folder, their writing, and the folder's preparation."""

    def __init__(self, staged: StagedFolder, vectors: str | None, register: Path | None = None,
                 shown: Callable[[str], str] = lambda text: text):
        self.staged, self.root = staged, staged.root
        self.shown = shown  # a staged input's path -> its URL, in what the layers name
        self.register = register  # the site's crack register (--register), which may lie in the folder: never this folder's
        self.changes_csv, self.pairs_csv = self.root / "changes.csv", self.root / "pairs.csv"
        self.summary_json, self.report_html = self.root / "summary.json", self.root / "report.html"
        self.vectors_format = vectors
        self.written: set[Path] = set()
        self._earlier: list[Path] = []  # outputs of an earlier compare found by prepare
        # what a compare writes, listed before it writes it and removed once its tables are: a compare interrupted
        # before its pairs.csv (Ctrl-C, a kill) leaves pictures and layers that are still compare's own
        self.pending = self.root / ".crackseg-compare-pending.json"

    def prepare(self, overwrite: bool, layers: Iterable[str] = (), pairs: int = 0, report: bool = False) -> None:
        """Before any work, in the prepared staged folder (locked; an earlier compare's outputs in a store downloaded, see
        :func:`writes_at`): refuse a register that is one of the files this compare writes (``layers``: the names of the
        change layers it may write, ``pairs`` how many, shown in the report if ``report``), refuse a file of the user's at any of
        those paths even with ``overwrite``, refuse an earlier compare's outputs unless ``overwrite``, clear the temp files
        an interrupted compare left. The caller releases the staged folder at the end."""
        try:
            layers = list(layers)
            self._refuse_register_among_outputs(layers)
            self._refuse_files_for_folders(bool(layers) and self.vectors_format is not None, report and pairs > 0)
            earlier = self._earlier_pairs()
            self._earlier = [path for path in self._outputs_here() if self._claims(path, earlier)]
            planned = self._planned(layers, pairs if report else None)
            for path in planned:
                if path.exists() and path not in self._earlier:
                    raise InputError(f"{self.staged.shown(path)} already exists and is not an earlier compare's output "
                                     "(--overwrite replaces only those); move it or choose another --out")
            if self._earlier and not overwrite:
                raise InputError(f"{self.staged.shown(self._earlier[0])} already exists; choose another --out or pass --overwrite")
            below = [path for sub in ("vectors", "report") for path in (self.root / sub, *(self.root / sub).rglob("*"))]
            for folder in [self.root, *(path for path in below if path.is_dir())]:
                remove_orphan_temps(folder)
            listed = sorted({path.relative_to(self.root).as_posix() for path in planned + self._earlier})
            write_atomic(self.pending, json.dumps(listed) + "\n")
        except BaseException:
            self.staged.release()
            raise

    def write_layer(self, name: str, rows: list[dict], geometries: list, crs: str | None) -> None:
        path = self._layer_path(name)
        rows = [{key: self.shown(value) if isinstance(value, str) else value for key, value in row.items()} for row in rows]
        write_features(path, rows, geometries, crs, "changes", categorized_style("status", STATUS_COLOURS))  # the report's colours
        self.written.update(layer_files(path))

    def write_picture(self, index: int, side: str, jpeg: bytes) -> str:
        """Write a report picture; returns its path relative to the folder, as the report links it."""
        path = self.root / "report" / f"pair{index}-{side}.jpg"
        write_atomic(path, jpeg)
        self.written.add(path)
        return path.relative_to(self.root).as_posix()

    def write_tables(self, pairs: list[dict], changes: list[dict], summary: dict, report: bool) -> None:
        """pairs.csv (its rows without their report pictures), changes.csv, summary.json and, if asked, report.html."""
        write_csv(self.changes_csv, changes, CHANGE_COLUMNS)
        write_csv(self.pairs_csv, [{k: v for k, v in row.items() if not k.startswith("picture")} for row in pairs])
        self.written |= {self.changes_csv, self.pairs_csv}
        self.write_summary(summary)
        if report:
            self.written.add(write_change_report(self.root, summary, pairs, changes))

    def write_summary(self, summary: dict) -> None:
        write_atomic(self.summary_json, json.dumps(summary, indent=1) + "\n")
        self.written.add(self.summary_json)

    def remove_stale(self) -> None:
        """Remove the outputs of the earlier compare (--overwrite) that this one did not write: its pictures, layers and
        report would otherwise sit beside this comparison's as if they were part of it."""
        for path in self._earlier:
            if path not in self.written:
                for file in [path, *(sqlite_logs(path) if path.suffix.lower() == ".gpkg" else [])]:
                    file.unlink(missing_ok=True)
        self.pending.unlink(missing_ok=True)

    def _planned(self, layers: list[str], pictures: int | None) -> list[Path]:
        """The paths this compare writes: its tables, each change layer's files, with a report (``pictures``: how many pairs
        it shows) report.html and each pair's pictures."""
        planned = [self.changes_csv, self.pairs_csv, self.summary_json] + ([self.report_html] if pictures is not None else [])
        if self.vectors_format:
            planned += [path for name in layers for path in layer_files(self._layer_path(name))]
        return planned + [self.root / "report" / f"pair{index}-{side}.jpg" for index in range(pictures or 0) for side in ("before", "after")]

    def _refuse_files_for_folders(self, vectors: bool, report: bool) -> None:
        for sub in [name for name, wanted in (("vectors", vectors), ("report", report)) if wanted]:
            folder = self.root / sub
            if folder.exists() and not folder.is_dir():
                raise InputError(f"{self.staged.shown(folder)} is a file, not a folder; compare writes its "
                                 f"{'change layers' if sub == 'vectors' else 'report pictures'} there: move it or choose another --out")

    def _layer_path(self, name: str) -> Path:
        return self.root / "vectors" / f"{name}{FORMATS[self.vectors_format][1]}"

    def _refuse_register_among_outputs(self, layers: Iterable[str]) -> None:
        if self.register is None:
            return
        ours = [self.changes_csv, self.pairs_csv, self.summary_json, self.report_html]
        ours += [self._layer_path(name) for name in layers] if self.vectors_format else []
        register = Path(self.register).resolve()
        for path in (path for path in ours if path.resolve() == register):
            raise InputError(f"--register {self.register}: is {path.relative_to(self.root)}, a file this compare writes in --out; "
                             "give the register another name or keep it elsewhere")

    def _earlier_pairs(self) -> tuple[set[str], set[str], set[str]]:
        """(the names of the change layers, the numbers of the pairs) of the comparison in pairs.csv, whose files those
        are, and the files an interrupted compare listed as it began; none from a table that cannot be read."""
        try:
            rows = read_csv(self.pairs_csv, ("pair",)) if self.pairs_csv.is_file() else []
        except InputError:
            rows = []
        try:
            interrupted = json.loads(self.pending.read_text()) if self.pending.is_file() else []
        except (OSError, ValueError):
            interrupted = []
        listed = {str(name) for name in interrupted} if isinstance(interrupted, list) else set()
        return {row["name_after"] for row in rows if row.get("name_after")}, {row["pair"] for row in rows}, listed

    def _claims(self, path: Path, earlier: tuple[set[str], set[str], set[str]]) -> bool:
        """Whether ``path``, found where compare writes, is an earlier compare's output: a table, a layer or picture of a
        pair the earlier pairs.csv lists or that an interrupted compare listed as it began (a user's own files in vectors/
        and report/ are not), never the register, and a GeoPackage only when it holds nothing but a change layer and its
        style (a register kept in vectors/ is the site's history)."""
        if self.register is not None and path.resolve() == Path(self.register).resolve():
            return False
        below = PurePosixPath(path.relative_to(self.root).as_posix())
        interrupted = below.as_posix() in earlier[2]
        if not interrupted and below.parts[0] == "vectors" and str(PurePosixPath(*below.parts[1:]).with_suffix("")) not in earlier[0]:
            return False
        if not interrupted and below.parts[0] == "report" and _PICTURE.fullmatch(below.name)[1] not in earlier[1]:
            return False
        if path.suffix.lower() != FORMATS["gpkg"][1]:
            return True
        try:
            with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as db:
                return {name for (name,) in db.execute("SELECT table_name FROM gpkg_contents")} - {"layer_styles"} == {"changes"}
        except sqlite3.Error:
            return False  # not a GeoPackage compare wrote

    def _outputs_here(self) -> list[Path]:
        """The files where compare writes (:func:`writes_at`): tables first, then layers, then pictures."""
        tables = [path for path in (self.changes_csv, self.pairs_csv, self.summary_json, self.report_html) if path.exists()]
        below = [path for sub in ("vectors", "report") for path in sorted((self.root / sub).rglob("*"))]
        return tables + [path for path in below if path.is_file() and writes_at(path.relative_to(self.root).as_posix())]
