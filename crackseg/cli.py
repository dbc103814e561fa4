"""``crackseg <command>``: argument parsing only; each command calls one library function.

User mistakes raise :class:`~crackseg.errors.InputError` and end as one line on stderr
with exit status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from crackseg import __version__
from crackseg.errors import InputError, RunError


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the layout of descriptions; appends an option's default where it tells something."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        return text + " (default: %(default)s)"


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _size(text: str) -> tuple[int, int]:
    from crackseg.synth import parse_size

    try:
        return parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _cmd_synth(args: argparse.Namespace) -> int:
    from crackseg.synth import write_dataset

    stems = write_dataset(
        args.out, args.count, args.size, args.seed, truth=args.truth, overwrite=args.overwrite, workers=args.workers
    )
    height, width = args.size
    print(f"wrote {len(stems)} images of {height}x{width} px and their masks to {args.out}")
    return 0


def _add_data_options(parser: argparse.ArgumentParser, root_required: bool) -> None:
    group = parser.add_argument_group("dataset")
    if root_required:
        group.add_argument("root", type=Path, nargs="?", help="dataset folder holding images/ and masks/ (see data/README.md)")
    group.add_argument("--images", type=Path, help="image folder (default ROOT/images)")
    group.add_argument("--masks", type=Path, help="mask folder (default ROOT/masks)")
    group.add_argument(
        "--mask-pattern", default="{stem}", help="mask file name without suffix, e.g. '{stem}_mask' for 001.jpg <-> 001_mask.png"
    )
    group.add_argument("--val-fraction", type=float, default=0.1, help="share of training stems held out for validation when there is no val.txt")
    group.add_argument("--seed", type=int, default=0, help="seed of the train/val draw")


def _cmd_inspect(args: argparse.Namespace) -> int:
    from crackseg.data import inspection_report, make_split, open_dataset

    found = open_dataset(args.root, args.images, args.masks, args.mask_pattern)
    split = make_split([sample.stem for sample in found.samples], args.val_fraction, args.seed, found.listed)
    print(inspection_report(found, split, args.val_fraction))
    return 1 if found.problems else 0


def _cmd_convert(args: argparse.Namespace) -> int:
    from crackseg.checkpoint import convert_classic

    model = convert_classic(args.classic, args.arch, args.out, threshold=args.threshold, overwrite=args.overwrite)
    print(f"wrote {args.out}: {model.arch} ({model.encoder} encoder), threshold {model.threshold}")
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    import dataclasses

    from crackseg.train import TrainConfig, fit

    fields = {field.name for field in dataclasses.fields(TrainConfig)}
    config = TrainConfig(**{key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items() if key in fields})
    fit(config)
    return 0


def _add_train_options(parser: argparse.ArgumentParser) -> None:
    data = parser.add_argument_group("data")
    data.add_argument("--data", type=Path, help="dataset folder holding images/ and masks/ (see data/README.md)")
    data.add_argument("--images", type=Path, help="image folder (default DATA/images)")
    data.add_argument("--masks", type=Path, help="mask folder (default DATA/masks)")
    data.add_argument("--mask-pattern", default="{stem}", help="mask file name without suffix, e.g. '{stem}_mask'")
    data.add_argument("--val-fraction", type=float, default=0.1, help="share of training stems held out for validation when there is no val.txt")
    data.add_argument("--on-bad-sample", choices=["error", "skip"], default="error", help="stop on any unreadable or unmatched file, or skip it (listed in RUN/skipped.txt)")
    data.add_argument("--crop-size", type=_positive_int, default=384, help="training crop side in px (random scaled crops, flips, 90-degree turns)")
    data.add_argument("--cache", action="store_true", help="decode every image once into RAM (datasets that fit)")
    data.add_argument("--workers", type=int, default=None, help="loader processes per training process (default: CPU cores / processes - 1, at most 8)")

    model = parser.add_argument_group("model")
    model.add_argument("--arch", choices=["unet", "unet16", "unet_resnet34", "unet_resnet101", "unet_resnet152"], default="unet", help="unet = segmentation-models-pytorch UNet; the others are the classic architectures")
    model.add_argument("--encoder", default="resnet34", help="smp encoder name for --arch unet (vgg16, resnet34, resnet101, efficientnet-b0, ...)")
    model.add_argument("--encoder-weights", default="imagenet", help="imagenet (downloads), none (random), or PATH of a local torchvision-format encoder state dict")
    model.add_argument("--init", default=None, help="start from all weights of a crackseg model file (another run's best.pt, a converted classic checkpoint): fine-tuning")

    optim = parser.add_argument_group("optimization")
    optim.add_argument("--epochs", type=_positive_int, default=50, help="epochs in total (a resumed run may raise it)")
    optim.add_argument("--batch-size", type=_positive_int, default=8, help="images per process and step; global batch = processes x this x --grad-accum")
    optim.add_argument("--val-batch-size", type=_positive_int, default=None, help="whole validation images per process and step (default --batch-size)")
    optim.add_argument("--grad-accum", type=_positive_int, default=1, help="micro-batches accumulated per optimizer step")
    optim.add_argument("--lr", type=float, default=3e-4, help="learning rate at the base global batch")
    optim.add_argument("--base-batch", type=_positive_int, default=16, help="global batch that --lr is given for")
    optim.add_argument("--lr-scaling", choices=["linear", "sqrt", "none"], default="linear", help="how the learning rate follows global batch / base batch")
    optim.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw", help="AdamW, or SGD with Nesterov momentum 0.9")
    optim.add_argument("--weight-decay", type=float, default=1e-4, help="decoupled weight decay (not on biases and norms)")
    optim.add_argument("--scheduler", choices=["cosine", "poly", "step"], default="cosine", help="per-step schedule after warm-up; step = x0.1 at 60%% and 85%%")
    optim.add_argument("--warmup-epochs", type=float, default=1.0, help="linear warm-up length in epochs")
    optim.add_argument("--clip-grad", type=float, default=None, help="clip the gradient norm to this (off by default)")
    optim.add_argument("--loss", choices=["bce", "bce+dice"], default="bce", help="pixel-weighted BCE, optionally plus soft Dice")
    optim.add_argument("--pos-weight", default="auto", help="crack pixel weight: auto (background / crack pixels in the training masks), none, or a number")
    optim.add_argument("--pos-weight-scale", type=float, default=1.0, help="factor applied to the auto crack pixel weight")
    optim.add_argument("--seed", type=int, default=0, help="seed of the split, initialization, order and augmentation")

    speed = parser.add_argument_group("speed and memory")
    speed.add_argument("--device", default="auto", help="auto (CUDA when present, one GPU per process by LOCAL_RANK), cuda or cpu")
    speed.add_argument("--amp", choices=["auto", "bf16", "fp16", "off"], default="auto", help="mixed precision; auto = bf16 on GPUs that support it, else off")
    speed.add_argument("--channels-last", action="store_true", help="NHWC memory layout (faster convolutions on tensor cores)")
    speed.add_argument("--compile", action="store_true", help="torch.compile the model (slow first steps)")
    speed.add_argument("--sync-bn", action="store_true", help="synchronize BatchNorm statistics across GPUs (small per-GPU batches)")
    speed.add_argument("--activation-checkpointing", action="store_true", help="recompute activations in the backward pass to save memory (--arch unet)")
    speed.add_argument("--strategy", choices=["ddp", "dp"], default="ddp", help="ddp: one process per GPU (launch.sh / torchrun); dp: nn.DataParallel in one process, kept for comparison")

    runs = parser.add_argument_group("run folder")
    runs.add_argument("--run", type=Path, required=True, help="run folder: config.json, split.json, checkpoints, TensorBoard events, train.log")
    runs.add_argument("--resume", default="auto", help="auto: continue from RUN/last.pt when present; none: start fresh (refused if RUN has checkpoints); or a checkpoint PATH")
    runs.add_argument("--val-every", type=_positive_int, default=1, help="validate every N epochs (and after the last)")
    runs.add_argument("--monitor", choices=["f1", "iou", "loss"], default="f1", help="validation score that picks best.pt (F1 and IoU at the best-F1 threshold)")
    runs.add_argument("--keep-last", type=int, default=3, help="epoch_NNNN.pt files kept (last.pt and best.pt are always kept)")
    runs.add_argument("--log-every", type=_positive_int, default=10, help="steps between progress and TensorBoard updates")


def _cmd_predict(args: argparse.Namespace) -> int:
    import dataclasses

    from crackseg.predict import PredictOptions, predict_folder

    fields = {field.name for field in dataclasses.fields(PredictOptions)}
    options = PredictOptions(**{key: value for key, value in vars(args).items() if key in fields})
    return predict_folder(args.checkpoint, args.inputs, options)


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from crackseg.evaluate import evaluate_checkpoint, evaluate_files, format_table, write_report

    if args.out is not None and (args.out / "report.json").exists() and not args.overwrite:
        raise InputError(f"{args.out / 'report.json'} already exists; choose another --out or pass --overwrite")
    if args.checkpoint is not None:
        if args.data is None:
            raise InputError("--checkpoint needs --data ROOT (and --split, default test)")
        report = evaluate_checkpoint(args.checkpoint, args.data, args.split or "test", args.tolerance, args.threshold, args.device, args.tile, args.batch_size)
    elif args.pred is not None and args.gt is not None:
        split = Path(args.split) if args.split else None
        report = evaluate_files(args.pred, args.gt, split, args.tolerance, 0.5 if args.threshold is None else args.threshold)
    else:
        raise InputError("give --pred DIR and --gt DIR, or --checkpoint FILE and --data ROOT")
    print(format_table(report))
    if args.out is not None:
        write_report(report, args.out)
        print(f"report written to {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="crackseg",
        description="Train UNets that find cracks in photos, predict crack masks, and score them.",
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"crackseg {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    synth = commands.add_parser(
        "synth",
        help="write a synthetic crack dataset (demo data, test fixtures)",
        description=(
            "Write OUT/images/<stem>.jpg and OUT/masks/<stem>.png (0 = background, 255 = crack):\n"
            "concrete/asphalt textures with branching cracks 1-10 px wide, crack-like distractors\n"
            "that are not labelled, and about 15% crack-free images. The same seed gives\n"
            "byte-identical files."
        ),
        formatter_class=_HelpFormatter,
    )
    synth.add_argument("out", type=Path, help="output folder (created if missing)")
    synth.add_argument("--count", type=_positive_int, default=64, help="number of images")
    synth.add_argument("--size", type=_size, default="256", help="image size in px: N or HxW (height x width)")
    synth.add_argument("--seed", type=int, default=0, help="random seed")
    synth.add_argument("--truth", action="store_true", help="also write truth.json: each crack's length and width in px")
    synth.add_argument("--workers", type=_positive_int, default=1, help="processes generating images in parallel")
    synth.add_argument("--overwrite", action="store_true", help="replace files already in OUT")
    synth.set_defaults(handler=_cmd_synth)

    inspect = commands.add_parser(
        "inspect",
        help="check a dataset and summarize it",
        description=(
            "Pair images and masks by file stem, decode every file completely, and report: counts per\n"
            "split, image sizes, crack-pixel fraction, the crack pixel weight training would use, and\n"
            "every problem (unmatched files, size mismatches, unreadable or truncated files).\n"
            "Exit status 0 when clean, 1 when problems were found."
        ),
        formatter_class=_HelpFormatter,
    )
    _add_data_options(inspect, root_required=True)
    inspect.set_defaults(handler=_cmd_inspect)

    convert = commands.add_parser(
        "convert",
        help="turn a classic crack-segmentation checkpoint into a crackseg model file",
        description=(
            "Read a checkpoint of the classic crack-segmentation project\n"
            "({'model': state_dict, 'epoch': ..., 'valid_loss': ...}), check every tensor against\n"
            "--arch, and write a self-describing crackseg model file that predict, evaluate and\n"
            "fine-tuning take like any other."
        ),
        formatter_class=_HelpFormatter,
    )
    convert.add_argument("classic", type=Path, help="classic checkpoint, e.g. model_best.pt or model_epoch_N.pt")
    convert.add_argument("--arch", required=True, choices=["unet16", "unet_resnet34", "unet_resnet101", "unet_resnet152"], help="architecture it holds")
    convert.add_argument("--out", type=Path, required=True, help="crackseg model file to write")
    convert.add_argument("--threshold", type=float, default=0.2, help="decision threshold on crack probability stored in the file (the classic inference default)")
    convert.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    convert.set_defaults(handler=_cmd_convert)

    train = commands.add_parser(
        "train",
        help="train a crack segmentation UNet (one process, or one per GPU via launch.sh)",
        description=(
            "Train on DATA with pixel-weighted BCE, validating every epoch on a held-out split with\n"
            "exact metrics over all processes. Checkpoints, config and split go to --run; an\n"
            "interrupted run continues from RUN/last.pt when started again.\n\n"
            "  crackseg train --data data/demo --run checkpoints/demo --encoder-weights none\n"
            "  CUDA_VISIBLE_DEVICES=0,1 ./launch.sh train --data data/cfd --run checkpoints/cfd\n"
            "  ./launch.sh --nproc 2 train --device cpu ...     (two CPU processes, gloo)"
        ),
        formatter_class=_HelpFormatter,
    )
    _add_train_options(train)
    train.set_defaults(handler=_cmd_train)

    predict = commands.add_parser(
        "predict",
        help="predict crack masks for images of any size",
        description=(
            "Write OUT/masks/<name>.png (0 = background, 255 = crack, the input's exact size) for every\n"
            "input, plus OUT/predictions.csv (per image: crack fraction, count, length, widths, area)\n"
            "and OUT/cracks.csv (per connected crack). Images larger than --tile run as overlapping,\n"
            "smoothly blended tiles; nothing is resized unless --resize is given. Unreadable inputs\n"
            "are listed in OUT/errors.csv and the exit status is 1; the rest are still written.\n\n"
            "  crackseg predict --checkpoint checkpoints/demo/best.pt data/photos --out predictions\n"
            "  ./launch.sh predict --checkpoint ... photos/ --out ...   (inputs shared across GPUs)"
        ),
        formatter_class=_HelpFormatter,
    )
    predict.add_argument("inputs", nargs="+", help="image files, folders or glob patterns (quote them)")
    predict.add_argument("--checkpoint", type=Path, required=True, help="crackseg checkpoint or model file (best.pt, a converted classic file, ...)")
    predict.add_argument("--out", type=Path, required=True, help="output folder")
    predict.add_argument("--recursive", action="store_true", help="also read images in sub-folders (output names keep the sub-folders)")
    predict.add_argument("--threshold", type=float, default=None, help="crack probability threshold (default: the checkpoint's best validation F1 threshold)")
    predict.add_argument("--tile", type=_positive_int, default=1024, help="tile side in px; larger images run as overlapping tiles")
    predict.add_argument("--overlap", type=int, default=128, help="overlap between neighbouring tiles in px, blended smoothly")
    predict.add_argument("--batch-size", type=_positive_int, default=None,
                         help="tiles per forward pass; tiles of several images share a batch (default 8 on a GPU, 1 on CPU, where batches ran slower)")
    predict.add_argument("--tta", choices=["none", "flip", "d4"], default="none", help="average probabilities over a horizontal flip, or all 8 flips and rotations")
    predict.add_argument("--save-prob", type=int, choices=[8, 16], default=None, help="also write OUT/probs/<name>.png, the probability map as 8- or 16-bit PNG")
    predict.add_argument("--overlay", action="store_true", help="also write OUT/overlays/<name>.jpg, the photo with cracks tinted red")
    predict.add_argument("--resize", type=_size, default=None, help="resize every image to N or HxW px first (for models trained on resized data); masks come back at the input size")
    predict.add_argument("--px-size", type=float, default=None, help="pixel size in mm: measurements are also reported in mm")
    predict.add_argument("--no-measure", dest="measure", action="store_false",
                         help="skip crack length and width measurements (no cracks.csv), the fastest way to masks: measuring takes about 20 ms of CPU per 448-px image")
    predict.add_argument("--skip-existing", action="store_true", help="keep masks already in OUT and predict the rest (finishes an interrupted batch)")
    predict.add_argument("--overwrite", action="store_true", help="replace outputs already in OUT")
    predict.add_argument("--workers", type=int, default=None,
                         help="decoding processes and writer threads (0: all in the main process; default: 0 on CPU, where the model's threads use every core, else CPU cores / processes - 1, at most 8)")
    predict.add_argument("--device", default="auto", help="auto (CUDA when present), cuda or cpu")
    predict.add_argument("--amp", choices=["auto", "bf16", "fp16", "off"], default="auto", help="mixed precision; auto = bf16 on GPUs that support it")
    predict.add_argument("--channels-last", action="store_true", help="NHWC memory layout (faster on tensor cores)")
    predict.set_defaults(handler=_cmd_predict)

    evaluate = commands.add_parser(
        "evaluate",
        help="score predictions against ground truth (P, R, F1, IoU, mIoU, ODS, OIS, AP)",
        description=(
            "Score saved predictions (binary masks or 8/16-bit probability maps named like the ground\n"
            "truth) or a checkpoint run on a dataset split. Reports dataset-level precision, recall,\n"
            "F1, crack and background IoU and mIoU, per-image means, ODS, OIS and AP; with --out,\n"
            "report.json, report.md, per_image.csv (worst first), pr_curve.csv and pr_curve.png.\n\n"
            "  crackseg evaluate --pred predictions/probs --gt data/cfd/masks --split data/cfd/test.txt --tolerance 2\n"
            "  crackseg evaluate --checkpoint checkpoints/cfd/best.pt --data data/cfd --split test --out reports/cfd"
        ),
        formatter_class=_HelpFormatter,
    )
    evaluate.add_argument("--pred", type=Path, help="folder of predicted masks or probability maps (<stem>.png)")
    evaluate.add_argument("--gt", type=Path, help="folder of ground-truth masks (<stem>.*)")
    evaluate.add_argument("--checkpoint", type=Path, help="predict with this checkpoint instead of reading --pred")
    evaluate.add_argument("--data", type=Path, help="dataset root for --checkpoint")
    evaluate.add_argument("--split", default=None, help="file of stems to score; with --checkpoint also a split name (test, val, train: ROOT/NAME.txt) or all (default test)")
    evaluate.add_argument("--tolerance", type=float, default=0.0, help="pixel tolerance for precision / recall / F1 (0 = exact pixels; papers often use 2)")
    evaluate.add_argument("--threshold", type=float, default=None, help="operating threshold on probabilities (default 0.5 for files, the checkpoint's for --checkpoint)")
    evaluate.add_argument("--out", type=Path, default=None, help="folder for the report files")
    evaluate.add_argument("--overwrite", action="store_true", help="replace a report already in --out")
    evaluate.add_argument("--device", default="auto", help="device for --checkpoint: auto, cuda or cpu")
    evaluate.add_argument("--tile", type=_positive_int, default=1024, help="tile side in px for --checkpoint")
    evaluate.add_argument("--batch-size", type=_positive_int, default=None, help="tiles per forward pass for --checkpoint (default 8 on a GPU, 1 on CPU)")
    evaluate.set_defaults(handler=_cmd_evaluate)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--"]:  # torchrun ... -m crackseg -- train ...: some Pythons pass the "--" on
        argv = argv[1:]
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except InputError as error:
        parser.exit(2, f"crackseg: error: {error}\n")
    except RunError as error:
        parser.exit(1, f"crackseg: error: {error}\n")
    except KeyboardInterrupt:
        print("crackseg: interrupted", file=sys.stderr)
        return 130
