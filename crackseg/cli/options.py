"""What the command modules share: the help layout, one-line parse errors, and the flags generated from option schemas.

Every flag comes from a schema field (:mod:`crackseg.core.options`): its help, default, unit, range, choices and
spelling are the field's; this module only turns them into argparse calls and parsed arguments back into the schema.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from crackseg.cli.launch import USER_MISTAKE, first_to_say
from crackseg.core.options import Range, flag, local_path_problem, option_fields


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the layout of descriptions; appends an option's default where it tells something."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default is None or action.default is False or action.default == argparse.SUPPRESS \
                or not action.option_strings or action.nargs == 0:  # a switch: what it stores is not what it defaults to
            return text
        return text + " (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """A mistake on the command line is one line, like every other user error; the usage is for --help."""

    def error(self, message: str):
        self.exit(2, f"crackseg: error: {message} (see {self.prog} --help)\n")

    def exit(self, status: int = 0, message: str | None = None):
        if status == USER_MISTAKE and not first_to_say():  # another process of the launch said it
            message = None
        super().exit(status, message)


def local_path(text: str) -> Path:
    """An argparse ``type`` for a path on this machine: a URL is refused (see :func:`~crackseg.core.options.local_path_problem`)."""
    problem = local_path_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return Path(text)


def checked(kind: type, valid: Range | None, parse=None):
    """An argparse ``type``: text -> ``kind`` (or ``parse(text)``), refused outside ``valid`` with its reason."""

    def convert(text: str):
        try:
            value = parse(text) if parse is not None else kind(text)
        except ValueError as error:
            expected = {int: "an integer", float: "a number"}.get(kind, kind.__name__)
            raise argparse.ArgumentTypeError(str(error) if parse is not None else f"must be {expected}, got {text!r}") from None
        problem = valid.problem(value) if valid is not None and not isinstance(value, str) else None
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    return convert


def add_options(parser: argparse.ArgumentParser, schema: type, title: str | None = None, helps: dict[str, str] | None = None) -> None:
    """One flag per field of ``schema``, groups of flags under their titles; a schema that lists ``sections`` has its
    fields shown in the argument group their ``section`` names. ``helps``: the command's own help for some fields."""
    target = parser.add_argument_group(title) if title else parser
    sections = {name: parser.add_argument_group(name) for name in getattr(schema, "sections", ())}
    for item, kind in option_fields(schema):
        meta = item.metadata
        if "group" in meta:
            add_options(target if meta["title"] is None else parser, meta["group"], meta["title"], meta["helps"])
            continue
        _add_flag(sections.get(meta["flag"].get("section"), target), item, kind, (helps or {}).get(item.name, meta["help"]))


def options_from(schema: type, args: argparse.Namespace):
    """The ``schema`` made from parsed arguments: a flag left out (None) takes its field's default."""
    values = {}
    for item, _ in option_fields(schema):
        if "group" in item.metadata:
            values[item.name] = options_from(item.metadata["group"], args)
            continue
        value = getattr(args, item.name)
        if isinstance(value, list):
            value = tuple(value)
        if value is not None or item.default is dataclasses.MISSING:
            values[item.name] = value
    return schema(**values)


def _add_flag(group, item: dataclasses.Field, kind: type, help: str) -> None:
    """The argparse argument of one field (its ``flag`` metadata: see :func:`crackseg.core.options.option`)."""
    meta, spelling = item.metadata, item.metadata["flag"]
    text = help.replace("%", "%%")
    names = spelling.get("flags", (flag(item.name),))
    default = None if item.default is dataclasses.MISSING else item.default
    if kind is bool:
        if "off" in spelling:  # a pair of switches, the default's first
            pair = group.add_mutually_exclusive_group()
            off_flag, off_help = spelling["off"]
            pair.add_argument(off_flag, dest=item.name, action="store_false", default=default, help=off_help)
            pair.add_argument(*names, dest=item.name, action="store_true", help=text)
            return
        group.add_argument(*names, dest=item.name, action="store_false" if default else "store_true", help=text)
        return
    if "env" in spelling:
        default = os.environ.get(spelling["env"])
    arguments = {"help": text, "type": _converter(item, kind), "choices": meta["choices"],
                 "metavar": spelling.get("metavar", None if meta["choices"] or spelling.get("positional") else item.name.upper())}
    if spelling.get("positional"):
        group.add_argument(item.name, nargs=spelling.get("nargs"), default=default, **arguments)
        return
    if spelling.get("repeat"):
        group.add_argument(*names, dest=item.name, action="append", default=None, **arguments)
        return
    # a default shown as text (e.g. a size "256") is parsed by argparse like a flag's text
    group.add_argument(*names, dest=item.name, default=spelling.get("shown", default),
                       required=item.default is dataclasses.MISSING, **arguments)


def _converter(item: dataclasses.Field, kind: type):
    meta = item.metadata
    if kind is Path or meta["flag"].get("local"):
        return local_path if kind is Path else _local_text
    if kind in (int, float) or meta["parse"] is not None:
        return checked(kind, meta["valid"], meta["parse"])
    return None


def _local_text(text: str) -> str:
    """A local path kept as text (training's paths, saved in config.json as given)."""
    local_path(text)
    return text


def add_command(commands, name: str, summary: str, description: str, schema: type | None = None,
                run: Callable[[Any], int] | None = None, title: str | None = None) -> argparse.ArgumentParser:
    """The command ``name``: its --help (``summary`` in the list of commands, ``description`` on its own page), a flag per
    field of ``schema`` (under ``title``, if given), and ``run``, which gets the schema made from the parsed arguments."""
    parser = commands.add_parser(name, help=summary, description=description, formatter_class=HelpFormatter)
    if schema is not None:
        add_options(parser, schema, title)
        parser.set_defaults(handler=lambda args: run(options_from(schema, args)))
    return parser
