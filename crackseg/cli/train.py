"""``crackseg convert`` and ``crackseg train``: model files made from a classic checkpoint or by training."""

from __future__ import annotations

from crackseg.cli.options import add_command
from crackseg.model.options import ConvertOptions
from crackseg.training.options import TrainConfig


def add_commands(commands) -> None:
    add_command(
        commands, "convert", "turn a classic crack-segmentation checkpoint or crackpot's Keras model into a crackseg model file",
        (
            "Read a checkpoint of the classic crack-segmentation project\n"
            "({'model': state_dict, 'epoch': ..., 'valid_loss': ...}) and check every tensor against\n"
            "--arch, or read crackpot's Keras ResUNet (no Keras needed), and write a self-describing\n"
            "crackseg model file that predict, evaluate, export and fine-tuning take like any other.\n\n"
            "  crackseg convert model_best.pt --arch unet_resnet34 --out classic.pt\n"
            "  crackseg convert --from crackpot --out crackpot.pt     (pip install 'crackseg[crackpot]')\n"
            "  crackseg predict --checkpoint crackpot.pt --resize 256 photos/ --out preds   (crackpot's own input size)"
        ),
        ConvertOptions, _cmd_convert,
    )

    add_command(
        commands, "train", "train a crack segmentation UNet (one process, or one per GPU via launch.sh)",
        (
            "Train on DATA with soft Dice plus pixel-weighted BCE (it beat weighted BCE alone in\n"
            "docs/results.md), validating every epoch on a held-out split with exact metrics over\n"
            "all processes. Checkpoints, config and split go to --run; an interrupted run\n"
            "continues from RUN/last.pt when started again.\n\n"
            "  crackseg train --data data/demo --run checkpoints/demo --encoder-weights none\n"
            "  CUDA_VISIBLE_DEVICES=0,1 ./launch.sh train --data data/cfd --run checkpoints/cfd\n"
            "  ./launch.sh --nproc 2 train --device cpu ...     (two CPU processes, gloo)"
        ),
        TrainConfig, _cmd_train,
    )


def _cmd_convert(options: ConvertOptions) -> int:
    if options.from_ == "crackpot":
        from crackseg.model.crackpot import convert_crackpot

        model = convert_crackpot(options.source, options.out, threshold=options.threshold, overwrite=options.overwrite)
    else:
        from crackseg.model.classic import CLASSIC_THRESHOLD, convert_classic

        threshold = CLASSIC_THRESHOLD if options.threshold is None else options.threshold
        model = convert_classic(options.source, options.arch, options.out, threshold=threshold, overwrite=options.overwrite)
    print(f"wrote {options.out}: {model.arch} ({model.encoder} encoder), threshold {model.threshold}")
    return 0


def _cmd_train(config: TrainConfig) -> int:
    from crackseg.training.train import fit

    fit(config)
    return 0
