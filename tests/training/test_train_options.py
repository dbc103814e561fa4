"""Training options: one definition for the command line and the Python API."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from crackseg.cli.main import build_parser
from crackseg.core.errors import InputError
from crackseg.core.options import option_fields
from crackseg.training.options import RESUMABLE_CHANGES, TrainConfig, check_options, check_same_run, resolved_encoder


def _parse(*flags: str):
    return build_parser().parse_args(["train", "--run", "r", *flags])


def test_the_command_line_takes_every_default_from_the_config():
    args = vars(_parse())
    for item in dataclasses.fields(TrainConfig):
        if item.name != "run":  # a flag given once per value is None until given: its field's default
            assert args[item.name] == (None if item.metadata["flag"].get("repeat") else item.default), item.name
    assert TrainConfig(**{item.name: args[item.name] for item, _ in option_fields(TrainConfig)}).run == "r"


def test_choices_are_offered_as_the_config_declares_them():
    train = build_parser()._subparsers._group_actions[0].choices["train"]
    offered = {action.dest: tuple(action.choices) for action in train._actions if action.choices}
    declared = {item.name: item.metadata["choices"] for item, _ in option_fields(TrainConfig) if item.metadata["choices"]}
    assert offered == declared


@pytest.mark.parametrize("flag, value", [("--lr", "0"), ("--lr", "nan"), ("--epochs", "0"), ("--val-fraction", "1"),
                                         ("--workers", "-1"), ("--pos-weight", "-2"), ("--keep-last", "0"), ("--seed", "-1"),
                                         ("--weight-decay", "inf"), ("--optimizer", "adam")])
def test_out_of_range_values_are_refused_by_the_cli_and_by_check_options(flag, value, capsys):
    with pytest.raises(SystemExit) as exit:
        _parse("--data", "d", flag, value)
    assert exit.value.code == 2 and f"argument {flag}:" in capsys.readouterr().err
    name = flag[2:].replace("-", "_")
    kind = dict((item.name, kind) for item, kind in option_fields(TrainConfig))[name]
    typed = value if kind is str else kind(float(value)) if kind is int else float(value)
    with pytest.raises(InputError, match=flag):
        check_options(TrainConfig(run="r", data="d", **{name: typed}))


def test_data_source_and_classic_encoders_are_checked():
    with pytest.raises(InputError, match="give --data ROOT"):
        check_options(TrainConfig(run="r", images="i"))
    with pytest.raises(InputError, match="always uses the vgg16 encoder"):
        check_options(TrainConfig(run="r", data="d", arch="unet16", encoder="resnet34"))
    check_options(TrainConfig(run="r", data="d", arch="unet16"))
    assert resolved_encoder(TrainConfig(run="r", arch="unet16")) == "vgg16"
    assert resolved_encoder(TrainConfig(run="r", arch="unet_resnet101")) == "resnet101"
    assert resolved_encoder(TrainConfig(run="r")) == "efficientnet-lite0"
    assert resolved_encoder(TrainConfig(run="r", encoder="resnet18")) == "resnet18"


def test_a_resume_may_change_only_the_resumable_options(tmp_path):
    saved = TrainConfig(run="r", data="d").to_dict()
    check_same_run(TrainConfig(run="elsewhere", data="d", epochs=99, workers=3, device="cpu"), saved, tmp_path / "last.pt")
    assert {"epochs", "workers", "device"} <= RESUMABLE_CHANGES
    with pytest.raises(InputError, match=r"--lr 0.1 \(saved: 0.0003\) contradicts the run saved in .*last.pt"):
        check_same_run(TrainConfig(run="r", data="d", lr=0.1), saved, tmp_path / "last.pt")


def test_compile_is_left_to_the_device_unless_a_switch_says_otherwise(tmp_path, capsys):
    """On by default on CUDA only (tests/test_cuda.py), off on the CPU; either switch may change on a resume, and a run
    saved before the default existed (compile false) resumes under it."""
    assert (_parse().compile, _parse("--compile").compile, _parse("--no-compile").compile) == (None, True, False)
    with pytest.raises(SystemExit) as exit:
        _parse("--compile", "--no-compile")
    assert exit.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    saved = TrainConfig(run="r", data="d", compile=False).to_dict()
    check_same_run(TrainConfig(run="r", data="d"), saved, tmp_path / "last.pt")
    check_same_run(TrainConfig(run="r", data="d", compile=True), saved, tmp_path / "last.pt")
    import torch

    from crackseg.model.distributed import Environment
    from crackseg.training.setup import build_training_model

    model, _, _ = build_training_model(TrainConfig(run="r", data="d", encoder="resnet18", encoder_weights="none"),
                                       Environment(0, 0, 1, torch.device("cpu")), None)
    assert model._compiled_call_impl is None


def test_the_options_module_does_not_import_torch():
    code = "import sys, crackseg.training.options; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_a_dataset_list_reads_folder_names_with_spaces_and_refuses_a_line_that_names_two(tmp_path):
    from crackseg.training.options import dataset_list

    for name in ("my site", "other 2", "site", "site 2"):
        (tmp_path / name).mkdir()
    listing = tmp_path / "datasets.txt"
    listing.write_text("my site\t3  # a weight after a tab\nother 2\nsite 0.5\n")
    assert dataset_list(listing) == ([str(tmp_path / "my site"), str(tmp_path / "other 2"), str(tmp_path / "site")], [3.0, 1.0, 0.5])
    for line, message in (("site 2", "names the folder 'site 2', and also the folder 'site' with weight 2; rename one"),
                          ("site x", "the weight"), ("nowhere 2", "nowhere: no such dataset folder")):
        listing.write_text(f"{line}\n")
        with pytest.raises(InputError, match=f"{listing}:1: .*{message}"):
            dataset_list(listing)
