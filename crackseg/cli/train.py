"""``crackseg convert`` and ``crackseg train``: model files made from a classic checkpoint or by training."""

from __future__ import annotations

import argparse

from crackseg.cli.options import HelpFormatter, add_option, checked, local_path
from crackseg.core.config import CLASSIC_ENCODERS, FRACTION, GROUPS, option_fields


def add_commands(commands) -> None:
    convert = commands.add_parser(
        "convert",
        help="turn a classic crack-segmentation checkpoint into a crackseg model file",
        description=(
            "Read a checkpoint of the classic crack-segmentation project\n"
            "({'model': state_dict, 'epoch': ..., 'valid_loss': ...}), check every tensor against\n"
            "--arch, and write a self-describing crackseg model file that predict, evaluate and\n"
            "fine-tuning take like any other."
        ),
        formatter_class=HelpFormatter,
    )
    convert.add_argument("classic", type=local_path, help="classic checkpoint, e.g. model_best.pt or model_epoch_N.pt")
    convert.add_argument("--arch", required=True, choices=tuple(CLASSIC_ENCODERS), help="architecture it holds")
    convert.add_argument("--out", type=local_path, required=True, help="crackseg model file to write")
    convert.add_argument("--threshold", type=checked(float, FRACTION), default=0.2, help="decision threshold on crack probability stored in the file (the classic inference default)")
    convert.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    convert.set_defaults(handler=_cmd_convert)

    train = commands.add_parser(
        "train",
        help="train a crack segmentation UNet (one process, or one per GPU via launch.sh)",
        description=(
            "Train on DATA with soft Dice plus pixel-weighted BCE (it beat weighted BCE alone in\n"
            "docs/results.md), validating every epoch on a held-out split with exact metrics over\n"
            "all processes. Checkpoints, config and split go to --run; an interrupted run\n"
            "continues from RUN/last.pt when started again.\n\n"
            "  crackseg train --data data/demo --run checkpoints/demo --encoder-weights none\n"
            "  CUDA_VISIBLE_DEVICES=0,1 ./launch.sh train --data data/cfd --run checkpoints/cfd\n"
            "  ./launch.sh --nproc 2 train --device cpu ...     (two CPU processes, gloo)"
        ),
        formatter_class=HelpFormatter,
    )
    _add_train_options(train)
    train.set_defaults(handler=_cmd_train)


def _cmd_convert(args: argparse.Namespace) -> int:
    from crackseg.model.checkpoint import convert_classic

    model = convert_classic(args.classic, args.arch, args.out, threshold=args.threshold, overwrite=args.overwrite)
    print(f"wrote {args.out}: {model.arch} ({model.encoder} encoder), threshold {model.threshold}")
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from crackseg.core.config import TrainConfig
    from crackseg.training.train import fit

    names = {item.name for item, _ in option_fields()}
    fit(TrainConfig(**{key: value for key, value in vars(args).items() if key in names}))
    return 0


def _add_train_options(parser: argparse.ArgumentParser) -> None:
    """One flag per TrainConfig field, grouped as crackseg.core.config groups them."""
    groups = {name: parser.add_argument_group(name) for name in GROUPS}
    for item, kind in option_fields():
        add_option(groups[item.metadata["group"]], item, kind)
