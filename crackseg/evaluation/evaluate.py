"""``crackseg evaluate``: crack predictions scored against ground truth with the metrics of the crack literature.

Two sources of predictions: saved files (binary masks or 8/16-bit probability maps, as
``crackseg predict`` writes them), or a checkpoint run on a dataset split; each image is scored by
:mod:`crackseg.evaluation.scoring`, and the report written by :mod:`crackseg.evaluation.report`.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from crackseg.core.errors import InputError
from crackseg.core.staging import StagedFolder, inside, location
from crackseg.core.urls import display_url, shown_location
from crackseg.data.datasets import open_dataset
from crackseg.data.images import DECODE_ERRORS, IMAGE_SUFFIXES, describe_error, load_image, load_mask, read_probability
from crackseg.data.pairing import Folder, files_by_stem
from crackseg.data.splits import read_stems
from crackseg.evaluation.options import EvaluateOptions, Scoring
from crackseg.evaluation.report import format_table, prepare_report_folder, write_report
from crackseg.evaluation.scoring import build_report, score_one
from crackseg.model.options import InferenceOptions


def evaluate_files(pred: Path, gt: Path, split: Path | None = None, tolerance: float = 0.0, threshold: float = 0.5,
                   scoring: Scoring = Scoring()) -> dict:
    """Score ``pred/<stem>.png`` against ``gt/<stem>.*`` for every stem of ``split`` (default: all of gt)."""
    scoring.check(tolerance)
    for flag, folder in (("--gt", Path(gt)), ("--pred", Path(pred))):
        if not folder.is_dir():
            raise InputError(f"{flag} {folder}: {'not a folder' if folder.exists() else 'no such folder'} (a folder of masks)")
    truths = files_by_stem(Path(gt))
    if not truths:
        raise InputError(f"{gt}: no ground-truth masks in it ({', '.join(IMAGE_SUFFIXES)})")
    predictions = files_by_stem(Path(pred))
    expected = read_stems(split) if split else sorted(truths)
    unknown = [stem for stem in expected if stem not in truths]
    if unknown:
        raise InputError(f"{split}: lists {len(unknown)} stems with no ground-truth mask in {gt} (e.g. {unknown[0]})")
    missing = [stem for stem in expected if stem not in predictions]
    if missing:
        raise InputError(f"{len(missing)} ground-truth masks have no prediction in {pred} (e.g. {missing[0]}); predict them first")

    def one(stem: str):
        prob = _read(read_probability, predictions[stem])
        truth = _read(load_mask, truths[stem])[0].bool()
        try:
            return score_one(stem, prob, truth, tolerance, threshold, scoring)
        except InputError as error:
            raise InputError(f"{predictions[stem]}: {error}") from None

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, expected))
    return build_report(results, tolerance, threshold, scoring)


def _read(reader, path: Path):
    try:
        return reader(path)
    except DECODE_ERRORS as error:
        raise InputError(f"{path}: {describe_error(error)}") from None


def evaluate_checkpoint(checkpoint: Path, root: Folder, split: str = "test", tolerance: float = 0.0, threshold: float | None = None,
                        inference: InferenceOptions = InferenceOptions(), scoring: Scoring = Scoring()) -> dict:
    """Predict the images of a dataset split with ``checkpoint`` in this process, run as ``inference`` says, and score them.

    ``root`` may be an s3:// prefix (as text): its files are read one by one, never copied to disk, and the report names it
    as :func:`crackseg.core.urls.display_url` shows it."""
    from crackseg.model.inference import Predictor
    from crackseg.model.runtimes import choose_runtime, load_runtime

    scoring.check(tolerance)
    choice = choose_runtime(Path(checkpoint), inference)
    root = location(root)
    shown = display_url(str(root))
    found = open_dataset(root)
    if found.problems:
        raise InputError(f"{len(found.problems)} problems in {shown}, e.g. {found.problems[0]}; see crackseg inspect {shown}")
    if split == "all":
        stems = [sample.stem for sample in found.samples]
    elif Path(split).suffix == ".txt" or Path(split).is_file():
        stems = read_stems(Path(split))
    elif split in found.listed:
        stems = found.listed[split]
    else:
        raise InputError(f"--split {split}: no {split}.txt in {shown}; give a split name that has one, all, or a file of stems")
    samples = {sample.stem: sample for sample in found.samples}
    unknown = [stem for stem in stems if stem not in samples]
    if unknown:
        raise InputError(f"--split lists {len(unknown)} stems not in {shown} (e.g. {unknown[0]})")
    runtime = load_runtime(choice)
    threshold = runtime.threshold if threshold is None else threshold
    predictor = Predictor(runtime.model, runtime.device, inference, runtime.amp_dtype)
    images = ((index, _read(load_image, samples[stem].image)) for index, stem in enumerate(stems))
    results = []
    for index, prob in predictor.probabilities(images):
        truth = _read(load_mask, samples[stems[index]].mask)[0].bool()
        results.append(score_one(stems[index], prob, truth, tolerance, threshold, scoring))
    report = build_report(sorted(results, key=lambda result: result.name), tolerance, threshold, scoring)
    report["source"] = {"checkpoint": str(checkpoint), "data": shown, "split": split}
    return report



def _refuse_out_among_inputs(options: EvaluateOptions) -> None:
    """--out inside what is scored: the report's pr_curve.png would be a mask without an image, or a prediction, there
    (an --out that is a file is refused as such when the folder is prepared)."""
    if Path(options.out).is_file():
        return
    data = [] if options.data is None else [f"{str(options.data).rstrip('/')}/{sub}" for sub in ("images", "masks")]
    for flag, folder in [("--pred", options.pred), ("--gt", options.gt), *(("--data", path) for path in data)]:
        if folder is not None and inside(options.out, folder):
            raise InputError(f"--out {options.out}: is {flag} {folder} or inside it, where the report's files would be read as "
                             "data; choose another --out")


def evaluate_command(options: EvaluateOptions) -> int:
    """``crackseg evaluate``: score, print the table, write the report to --out (checked before any work)."""
    if options.out is not None:
        _refuse_out_among_inputs(options)
    out = None if options.out is None else StagedFolder(options.out, "evaluate", "reports", lock=None)
    with out or contextlib.nullcontext():
        if out is not None:
            prepare_report_folder(out, options.overwrite)
        if options.checkpoint is not None:
            report = evaluate_checkpoint(options.checkpoint, options.data, options.split or "test", options.tolerance,
                                         options.threshold, options.inference, options.scoring)
        else:
            split = Path(options.split) if options.split else None
            threshold = 0.5 if options.threshold is None else options.threshold
            report = evaluate_files(options.pred, options.gt, split, options.tolerance, threshold, options.scoring)
        print(format_table(report))
        if out is not None:
            write_report(report, out.root)
            out.finish()
            print(f"report written to {shown_location(options.out)}")
    return 0
