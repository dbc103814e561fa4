"""The options of ``crackseg evaluate``: where the predictions come from, how they are scored, where the report goes;
no torch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from crackseg.core.errors import InputError
from crackseg.core.options import AT_LEAST_ONE, FRACTION, NON_NEGATIVE, Length, Options, Range, group, option
from crackseg.cracks.options import JOIN_GAP, MIN_LENGTH
from crackseg.evaluation.protocols import PROTOCOLS
from crackseg.model.options import InferenceOptions
from crackseg.model.shipped import model_file

TOLERANCE = Range(0, 32)  # px: evaluation tolerances in the literature are 2 to 5
# Far false alarms (crackseg.evaluation.false_alarms). 10 px: crack benchmarks accept a predicted pixel within 2 to 5 px
# of a true one, and labels are 2 to 11 px wide: a prediction twice as wide as the widest label, or shifted by such a
# tolerance, stays within about 6 px of the label. Shadows, joints and stems beside a crack lie further off, so 10 px
# keeps the figure to alarms a user would call false. 256 px: about what one look at a large photo on a screen takes in.
ALARM_DISTANCE, ALARM_TILE = 10.0, 256


def _pixels(text: str) -> float:
    """A length in px (``12`` or ``12px``): evaluate has no pixel size to turn mm into pixels."""
    length = Length.parse(text)
    if length.unit != "px":
        raise ValueError(f"must be a length in px (evaluate has no pixel size), got {text!r}")
    return length.value


def _px_length(default: Length, help: str):
    return option(default.value, help, unit="px", valid=NON_NEGATIVE, parse=_pixels, shown=str(default))


@dataclass(frozen=True)
class Scoring(Options):
    """What to report besides the tolerance and threshold: the protocol; in px, how predicted cracks on crack-free photos
    are counted (predict's --min-length and --join-gap), and how far from every true crack a predicted pixel is a far
    alarm, and the side of the tiles checked for alarms (crackseg.evaluation.false_alarms)."""

    protocol: str = option(
        "crackseg", "whose evaluation code to reproduce: " + ", ".join(f"{name} ({p.summary})" for name, p in PROTOCOLS.items())
        + "; report.md defines each figure, docs/results.md compares them", choices=PROTOCOLS)
    min_length: float = _px_length(MIN_LENGTH, "px: on photos whose ground truth has no crack, predicted cracks shorter than "
                                               "this are not counted (predict's --min-length)")
    join_gap: float = _px_length(JOIN_GAP, "px: pieces of a predicted crack are joined across gaps up to this long before "
                                           "counting cracks on crack-free photos (predict's --join-gap)")
    alarm_distance: float = option(
        ALARM_DISTANCE, "px: a predicted crack pixel farther than this (Euclidean) from every true crack pixel is a far false "
        f"alarm, reported per megapixel (default {ALARM_DISTANCE:g}: beyond the 2-5 px tolerances of crack benchmarks and the "
        "half-width of the widest labels, about 11 px, so a crack drawn wider or a few px off is not counted, while shadows, "
        "joints and stems beside it are); under the crackseg and omnicrack protocols only, at their operating threshold "
        "(scsegamba and deepsegmentor have none)", unit="px", valid=NON_NEGATIVE)
    alarm_tile: int = option(
        ALARM_TILE, f"px (default {ALARM_TILE}): every image is cut into tiles this wide (the last ones partial); of the tiles "
        "whose ground truth has no crack pixel, the share with a predicted crack pixel is reported", unit="px", valid=AT_LEAST_ONE)

    def check(self, tolerance: float) -> None:
        """The tolerance belongs to crackseg's protocol; the others compare as their references do."""
        if tolerance > 0 and self.protocol != "crackseg":
            own = "centrelines within its own 4 px disk" if self.protocol == "omnicrack" else "exact pixels, as its reference does"
            raise InputError(f"--tolerance belongs to the crackseg protocol; --protocol {self.protocol} compares {own}: "
                             "leave --tolerance out")


@dataclass(frozen=True)
class EvaluateOptions(Options):
    """``crackseg evaluate``: saved predictions (--pred, --gt) or a checkpoint run on a dataset (--checkpoint, --data)."""

    pred: Path | None = option(None, "folder of predicted masks or probability maps (<stem>.png)")
    gt: Path | None = option(None, "folder of ground-truth masks (<stem>.*)")
    checkpoint: Path | None = option(None, "predict with this checkpoint (or safetensors folder, .onnx, .xml, or a shipped "
                                           "model's name: crackseg models) instead of reading --pred",
                                     flags=("--checkpoint", "--model"), parse=model_file)
    data: str | None = option(None, "dataset root for --checkpoint: a folder, or s3://bucket/prefix/ holding images/, masks/ "
                                    "and the split files (read file by file, never copied; see docs/evaluate.md)")
    split: str | None = option(None, "file of stems to score; with --checkpoint also a split name (test, val, train: "
                                     "ROOT/NAME.txt) or all (default test)")
    tolerance: float = option(0.0, f"pixel tolerance for precision / recall / F1, {TOLERANCE.describe()} (0 = exact pixels; "
                                   "papers often use 2)", unit="px", valid=TOLERANCE)
    threshold: float | None = option(None, "operating threshold on probabilities (default 0.5 for files, the checkpoint's for "
                                           "--checkpoint)", valid=FRACTION)
    scoring: Scoring = group(Scoring)
    out: str | None = option(None, "folder, or s3://bucket/prefix/, for the report files (each uploaded whole)")
    overwrite: bool = option(False, "replace a report already in --out")
    inference: InferenceOptions = group(InferenceOptions, "inference (with --checkpoint)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.checkpoint is not None and self.data is None:
            raise InputError("--checkpoint needs --data ROOT (and --split, default test)")
        if self.checkpoint is None and (self.pred is None or self.gt is None):
            raise InputError("give --pred DIR and --gt DIR, or --checkpoint FILE and --data ROOT")
        unused = [flag for flag, value in ((("--pred", self.pred), ("--gt", self.gt)) if self.checkpoint is not None
                                           else (("--data", self.data),)) if value is not None]
        if unused:  # scoring one pair of inputs, it would silently leave the other out
            why = "scores files already predicted, without --checkpoint" if self.checkpoint is not None else "goes with --checkpoint"
            raise InputError(f"{unused[0]} {why}; give --pred and --gt, or --checkpoint and --data")
        default = InferenceOptions()
        if self.checkpoint is None and self.inference != default:
            changed = [f"--{name.replace('_', '-')}" for name, value in vars(self.inference).items() if value != getattr(default, name)]
            raise InputError(f"{', '.join(changed)}: how --checkpoint predicts; --pred scores masks already predicted: leave "
                             f"{'them' if len(changed) > 1 else 'it'} out")
        self.scoring.check(self.tolerance)
