"""The command line is generated from the option schemas: every flag is a schema field, every choice list a table."""

from __future__ import annotations

import argparse

import pytest

from crackseg.cli.main import build_parser
from crackseg.core.options import option_fields
from crackseg.cracks.vectors import FORMATS as VECTOR_FORMATS
from crackseg.data.options import SynthCommand
from crackseg.evaluation.options import EvaluateOptions
from crackseg.evaluation.protocols import PROTOCOLS
from crackseg.integrations.options import ServeOptions
from crackseg.labels.formats.reading import LABEL_FORMATS
from crackseg.labels.options import LabelExport, LabelImport, LabelRank
from crackseg.model.architectures import ARCHITECTURES, CLASSIC
from crackseg.model.options import (AMP_CHOICES, BACKENDS, CONVERT_SOURCES, EXPORT_FORMATS, TTA_CHOICES, ConvertOptions, ExportOptions,
                                    ModelsOptions)
from crackseg.monitoring.options import TRANSFORMS, CompareOptions
from crackseg.prediction.engines import ENGINES
from crackseg.prediction.options import PredictCommand, ReportOptions
from crackseg.training.options import InspectOptions, TrainConfig

SCHEMAS = {
    "synth": SynthCommand, "inspect": InspectOptions, "train": TrainConfig, "convert": ConvertOptions,
    "predict": PredictCommand, "export": ExportOptions, "report": ReportOptions, "labels import": LabelImport,
    "labels export": LabelExport, "labels rank": LabelRank, "serve label-studio": ServeOptions, "compare": CompareOptions,
    "evaluate": EvaluateOptions, "models": ModelsOptions,
}
# Each choice list's owner: the table its dispatch reads
TABLES = {
    ("predict", "engine"): ENGINES, ("compare", "transform"): TRANSFORMS, ("evaluate", "protocol"): PROTOCOLS,
    ("export", "format"): EXPORT_FORMATS, ("train", "arch"): ARCHITECTURES, ("convert", "arch"): CLASSIC, ("convert", "from_"): CONVERT_SOURCES,
    ("predict", "vectors"): VECTOR_FORMATS, ("compare", "vectors"): VECTOR_FORMATS, ("labels import", "format"): LABEL_FORMATS,
    ("labels export", "format"): LABEL_FORMATS,
}


def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    """Every command that runs (``labels import``, not ``labels``), by its words."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= _commands(sub, f"{prefix} {name}".strip())
    return found or {prefix: parser}


def _fields(schema: type) -> dict:
    """The schema's fields, groups flattened, by name."""
    found = {}
    for item, _ in option_fields(schema):
        found |= _fields(item.metadata["group"]) if "group" in item.metadata else {item.name: item}
    return found


def test_every_command_has_a_schema():
    assert set(_commands(build_parser())) == set(SCHEMAS)


@pytest.mark.parametrize("command", sorted(SCHEMAS))
def test_every_flag_is_a_field_of_the_command_schema(command):
    parser = _commands(build_parser())[command]
    dests = {action.dest for action in parser._actions if action.dest not in ("help", "handler")}
    assert dests == set(_fields(SCHEMAS[command]))


@pytest.mark.parametrize("command", sorted(SCHEMAS))
def test_every_choice_list_is_its_fields(command):
    fields = _fields(SCHEMAS[command])
    for action in _commands(build_parser())[command]._actions:
        if action.choices is not None:
            assert tuple(action.choices) == fields[action.dest].metadata["choices"], action.dest


def test_every_choice_list_is_its_owners_table():
    commands = _commands(build_parser())
    for (command, dest), table in TABLES.items():
        action = next(action for action in commands[command]._actions if action.dest == dest)
        assert tuple(action.choices) == tuple(table), (command, dest)
    inference = {action.dest: tuple(action.choices) for action in commands["predict"]._actions if action.choices}
    assert (inference["tta"], inference["amp"], inference["backend"]) == (TTA_CHOICES, AMP_CHOICES, BACKENDS)


def test_every_engine_of_the_table_is_one_the_dispatch_runs():
    for name, entry in ENGINES.items():
        engine = entry.load()
        assert all(callable(getattr(engine, method)) for method in ("check", "model_device", "run")), name
