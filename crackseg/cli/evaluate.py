"""``crackseg evaluate``: predictions or a checkpoint scored against ground truth."""

from __future__ import annotations

import argparse
from pathlib import Path

from crackseg.cli.options import HelpFormatter, add_inference_options, checked, inference_options, local_path
from crackseg.core.config import (
    ALARM_DISTANCE,
    ALARM_TILE,
    AT_LEAST_ONE,
    FRACTION,
    JOIN_GAP,
    MIN_LENGTH,
    NON_NEGATIVE,
    TOLERANCE,
    parse_length,
)
from crackseg.core.errors import InputError
from crackseg.evaluation.protocols import PROTOCOLS


def add_commands(commands) -> None:
    evaluate = commands.add_parser(
        "evaluate",
        help="score predictions against ground truth (P, R, F1, IoU, mIoU, ODS, OIS, AP)",
        description=(
            "Score saved predictions (binary masks or 8/16-bit probability maps named like the ground\n"
            "truth) or a checkpoint run on a dataset split. Reports dataset-level precision, recall,\n"
            "F1, crack and background IoU and mIoU, per-image means, ODS, OIS and AP, or a paper's own\n"
            "figures with --protocol; photos whose ground truth has no crack also apart (how many get a\n"
            "predicted crack), and false alarms far from any crack in every photo (--alarm-distance,\n"
            "--alarm-tile). With --out, report.json, report.md, per_image.csv (worst first), and\n"
            "pr_curve.csv and pr_curve.png where the protocol has a precision-recall curve.\n\n"
            "  crackseg evaluate --pred predictions/probs --gt data/cfd/masks --split data/cfd/test.txt --tolerance 2\n"
            "  crackseg evaluate --checkpoint checkpoints/cfd/best.pt --data data/cfd --split test --out reports/cfd"
        ),
        formatter_class=HelpFormatter,
    )
    evaluate.add_argument("--pred", type=local_path, help="folder of predicted masks or probability maps (<stem>.png)")
    evaluate.add_argument("--gt", type=local_path, help="folder of ground-truth masks (<stem>.*)")
    evaluate.add_argument("--checkpoint", "--model", dest="checkpoint", type=local_path,
                          help="predict with this checkpoint (or safetensors folder, .onnx, .xml) instead of reading --pred")
    evaluate.add_argument("--data", help="dataset root for --checkpoint: a folder, or s3://bucket/prefix/ holding images/, masks/ "
                                          "and the split files (read file by file, never copied; see docs/evaluate.md)")
    evaluate.add_argument("--split", default=None, help="file of stems to score; with --checkpoint also a split name (test, val, train: ROOT/NAME.txt) or all (default test)")
    evaluate.add_argument("--tolerance", type=checked(float, TOLERANCE), default=0.0, help=f"pixel tolerance for precision / recall / F1, {TOLERANCE.describe()} (0 = exact pixels; papers often use 2)")
    evaluate.add_argument("--threshold", type=checked(float, FRACTION), default=None, help="operating threshold on probabilities (default 0.5 for files, the checkpoint's for --checkpoint)")
    evaluate.add_argument("--protocol", choices=PROTOCOLS, default="crackseg",
                          help="whose evaluation code to reproduce: crackseg (the figures listed above), scsegamba (SCSegamba / MixerCSeg: "
                               "each map divided by its maximum, per-image F1 averaged for ODS, mIoU per image), deepsegmentor "
                               "(DeepCrack: counts summed over images, I/U, G, C at the best of 100 thresholds), omnicrack "
                               "(OmniCrack30k: centreline IoU within 4 px); report.md defines each figure, docs/results.md compares them")
    evaluate.add_argument("--min-length", type=checked(float, NON_NEGATIVE), default=parse_length(MIN_LENGTH)[0],
                          help="px: on photos whose ground truth has no crack, predicted cracks shorter than this are not counted (predict's --min-length)")
    evaluate.add_argument("--join-gap", type=checked(float, NON_NEGATIVE), default=parse_length(JOIN_GAP)[0],
                          help="px: pieces of a predicted crack are joined across gaps up to this long before counting cracks on crack-free photos (predict's --join-gap)")
    evaluate.add_argument("--alarm-distance", type=checked(float, NON_NEGATIVE), default=ALARM_DISTANCE,
                          help="px: a predicted crack pixel farther than this (Euclidean) from every true crack pixel is a far false "
                               f"alarm, reported per megapixel (default {ALARM_DISTANCE:g}: beyond the 2-5 px tolerances of crack benchmarks "
                               "and the half-width of the widest labels, about 11 px, so a crack drawn wider or a few px off is not counted, "
                               "while shadows, joints and stems beside it are); under the crackseg and omnicrack protocols only, at "
                               "their operating threshold (scsegamba and deepsegmentor have none)")
    evaluate.add_argument("--alarm-tile", type=checked(int, AT_LEAST_ONE), default=ALARM_TILE,
                          help=f"px (default {ALARM_TILE}): every image is cut into tiles this wide (the last ones partial); of the tiles "
                               "whose ground truth has no crack pixel, the share with a predicted crack pixel is reported")
    evaluate.add_argument("--out", default=None, help="folder, or s3://bucket/prefix/, for the report files (each uploaded whole)")
    evaluate.add_argument("--overwrite", action="store_true", help="replace a report already in --out")
    add_inference_options(evaluate, "inference (with --checkpoint)")
    evaluate.set_defaults(handler=_cmd_evaluate)


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from crackseg.core.storage import display_url, is_url
    from crackseg.evaluation.evaluate import Scoring, check_report_out, evaluate_checkpoint, evaluate_files, format_table, write_report

    out = None if args.out is None else args.out if is_url(args.out) else Path(args.out)
    if out is not None:
        check_report_out(out, args.overwrite)
    inference = inference_options(args)
    scoring = Scoring(args.protocol, args.min_length, args.join_gap, args.alarm_distance, args.alarm_tile)
    if args.checkpoint is not None:
        if args.data is None:
            raise InputError("--checkpoint needs --data ROOT (and --split, default test)")
        report = evaluate_checkpoint(args.checkpoint, args.data, args.split or "test", args.tolerance, args.threshold, inference, scoring)
    elif args.pred is not None and args.gt is not None:
        split = Path(args.split) if args.split else None
        report = evaluate_files(args.pred, args.gt, split, args.tolerance, 0.5 if args.threshold is None else args.threshold, scoring)
    else:
        raise InputError("give --pred DIR and --gt DIR, or --checkpoint FILE and --data ROOT")
    print(format_table(report))
    if out is not None:
        write_report(report, out)
        print(f"report written to {display_url(out) if is_url(str(out)) else out}")
    return 0
