"""``crackseg evaluate``: predictions or a checkpoint scored against ground truth."""

from __future__ import annotations

from crackseg.cli.options import add_command
from crackseg.evaluation.options import EvaluateOptions


def add_commands(commands) -> None:
    add_command(
        commands, "evaluate", "score predictions against ground truth (P, R, F1, IoU, mIoU, ODS, OIS, AP)",
        (
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
        EvaluateOptions, _cmd_evaluate,
    )


def _cmd_evaluate(options: EvaluateOptions) -> int:
    from crackseg.evaluation.evaluate import evaluate_command

    return evaluate_command(options)
