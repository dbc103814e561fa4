"""Option schemas: each command's options are a dataclass whose fields carry their flag's help, unit, range and choices.

A schema is checked where it is made (:class:`Options.__post_init__`), so a run started from Python meets the same
rules as one started from the command line, which :mod:`crackseg.cli.options` generates from the same fields. A field
whose type is another schema is a group of flags composed into the command (``InferenceOptions`` into predict,
evaluate and serve). Field order is the order ``--help`` lists the flags in.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path

from crackseg.core.errors import InputError
from crackseg.core.urls import display_url, is_url

REQUIRED = dataclasses.MISSING


@dataclass(frozen=True)
class Range:
    """Valid values of a numeric option: finite, within ``low`` .. ``high`` (open ends excluded)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def problem(self, value: float) -> str | None:
        """Why ``value`` is out of range, or None."""
        if isinstance(value, float) and not math.isfinite(value):
            return f"must be a finite number, got {value}"
        too_low = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        too_high = self.high is not None and (value >= self.high if self.high_open else value > self.high)
        if too_low or too_high:
            return f"must be {self.describe()}, got {value:g}"
        return None

    def describe(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"


POSITIVE = Range(0, low_open=True)
AT_LEAST_ONE = Range(1)
NON_NEGATIVE = Range(0)
FRACTION = Range(0, 1)
# mm per pixel that measuring takes: from 0.1 um (a microscope) to 1 m (a pixel that sees no crack); beyond, lengths,
# widths and areas in mm underflow to 0 or overflow
PX_SIZE = Range(1e-4, 1e3)


@dataclass(frozen=True)
class Length:
    """A length with its unit, ``px`` or ``mm``: ``Length.parse("3mm")``; shown as ``3mm``."""

    value: float
    unit: str = "px"

    @classmethod
    def parse(cls, text: str | float | Length) -> Length:
        """``"12px"``, ``"3mm"`` or ``"12"`` (px) -> Length; finite and >= 0, else a ValueError saying why."""
        if isinstance(text, Length):
            return text
        text = str(text).strip().lower()
        unit = "mm" if text.endswith("mm") else "px"
        number = text[: -len(unit)] if text.endswith(unit) else text
        return cls(number_in(number, NON_NEGATIVE, "a length like 12px or 3mm", repr(text)), unit)

    def pixels(self, px_size_mm: float | None) -> float | None:
        """In px: mm through ``px_size_mm``; None for mm without a pixel size."""
        if self.unit == "px":
            return self.value
        return None if px_size_mm is None else self.value / px_size_mm

    def __str__(self) -> str:
        return f"{self.value:g}{self.unit}"


def number_in(text: str, valid: Range, expected: str, shown: str | None = None) -> float:
    """``text`` as a number within ``valid``, or a ValueError saying what was ``expected``."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"must be {expected}, got {repr(text) if shown is None else shown}") from None
    problem = valid.problem(value)
    if problem:
        raise ValueError(problem)
    return value


def parse_size(text: str | tuple[int, int]) -> tuple[int, int]:
    """``"256"`` -> (256, 256); ``"320x480"`` -> (320, 480) as (height, width), at least 16 px a side."""
    parts = [str(part) for part in text] if isinstance(text, (tuple, list)) else str(text).lower().split("x")
    if len(parts) not in (1, 2) or not all(p.isdigit() for p in parts):
        raise ValueError(f"size must be N or HxW in pixels, got {text!r}")
    height, width = int(parts[0]), int(parts[-1])
    if min(height, width) < 16:
        raise ValueError(f"size must be at least 16 px, got {text!r}")
    return height, width


def parse_device(text: str) -> str:
    """A device's name as crackseg takes it (whether that GPU is there is asked when the model loads)."""
    if not isinstance(text, str) or not re.fullmatch(r"auto|cpu|cuda(:\d+)?", text):
        raise ValueError(f"must be auto, cpu, cuda or cuda:N (crackseg runs on cpu or cuda), got {text!r}")
    return text


def option(default, help: str, *, unit: str | None = None, valid: Range | None = None, choices=None, parse=None,
           **flag) -> dataclasses.Field:
    """A schema field and what its flag needs: ``default`` (:data:`REQUIRED`: a required flag), ``help``, the ``unit``
    of its number, the ``valid`` range, the ``choices`` (a table's keys), and ``parse`` (text -> value where the type
    alone cannot, e.g. a Length; a ValueError says why).

    ``flag`` spells the flag where its field's name does not: ``flags`` (its option strings, e.g. ``("--no-measure",)``
    for a bool that defaults to True), ``positional`` and ``nargs``, ``metavar``, ``repeat`` (given once per value),
    ``off`` (``(flag, help)``: a second switch that sets a bool back to its default), ``env`` (the default is this
    environment variable), ``shown`` (the default as --help shows it and argparse parses it), ``section`` (the help
    group, for a schema that lists ``sections``) and ``local`` (text that must be a local path).
    """
    metadata = {"help": help, "unit": unit, "valid": valid, "choices": tuple(choices) if choices is not None else None,
                "parse": parse, "flag": flag}
    return field(default=default, metadata=metadata)


def group(schema: type, title: str | None = None, helps: dict[str, str] | None = None) -> dataclasses.Field:
    """A field holding a group of flags, ``schema``'s: under its own ``title`` in --help, or among the command's own;
    ``helps`` replaces the help of some of its fields (by name) with what this command does with them."""
    return field(default_factory=schema, metadata={"group": schema, "title": title, "helps": helps or {}})


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@functools.cache
def option_fields(schema: type) -> list[tuple[dataclasses.Field, type]]:
    """Every field of ``schema`` with its value type (``int | None`` -> int), in declaration order."""
    hints = typing.get_type_hints(schema)
    result = []
    for item in dataclasses.fields(schema):
        kind = hints[item.name]
        members = [arg for arg in typing.get_args(kind) if arg is not type(None)]
        optional = len(members) == 1 and type(None) in typing.get_args(kind)  # X | None -> X; X | Y stays itself
        result.append((item, members[0] if optional else kind))
    return result


def derived(name: str, schema: type, names: tuple[str, ...], **first: tuple[type, dataclasses.Field]) -> type:
    """A schema of its own made of the fields ``first`` (name -> (type, field)) and then ``schema``'s ``names``, declared
    once there: a command that takes part of another's options."""
    kinds = dict((item.name, (item, kind)) for item, kind in option_fields(schema))
    taken = [(key, kinds[key][1], field(default=kinds[key][0].default, metadata=kinds[key][0].metadata)) for key in names]
    return dataclasses.make_dataclass(name, [(key, kind, item) for key, (kind, item) in first.items()] + taken,
                                      bases=(Options,), frozen=True, kw_only=True)


def local_path_problem(text: str) -> str | None:
    """Why ``text`` cannot be a local path: a URL would become a local folder named after its scheme (pathlib folds the
    slashes), or None."""
    if not str(text):
        return "empty: give a path ('' would be the current folder)"
    if is_url(str(text)):
        return (f"{display_url(str(text))}: a local path is needed here (object storage is read and written by predict, "
                "evaluate and compare; docs/predict.md)")
    return None


class Options:
    """A schema's checks, run as it is made: choices, ranges, text parsed into its value type, local paths local.

    Subclasses add the rules that tie options together in their own ``__post_init__``, after calling this one.
    """

    def __post_init__(self) -> None:
        for item, kind in option_fields(type(self)):
            if "group" in item.metadata:
                continue
            value = _checked(item, kind, getattr(self, item.name))
            object.__setattr__(self, item.name, value)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _checked(item: dataclasses.Field, kind: type, value):
    """``value`` of ``item`` checked, and text turned into the field's type; an InputError names the flag. A flag given
    once per value (``repeat``) holds a tuple, each value checked as its element type; one value alone is taken too."""
    if not item.metadata["flag"].get("repeat"):
        return _checked_value(item, kind, value)
    if value is None:
        return item.default
    element = (typing.get_args(kind) or (str,))[0]
    return tuple(_checked_value(item, element, one) for one in ((value,) if isinstance(value, (str, Path)) else value))


def _checked_value(item: dataclasses.Field, kind: type, value):
    meta = item.metadata
    name = meta["flag"].get("flags", (flag(item.name),))[0]
    if value is None:
        return value
    values = value if isinstance(value, (tuple, list)) else (value,)
    if any(isinstance(one, str) and not one for one in values) and item.default != "" and not meta["flag"].get("env"):
        raise InputError(f"{name}: empty; give a value (a path '' would be the current folder)")
    try:
        if meta["parse"] is not None:
            value = meta["parse"](value)  # text, or e.g. a number for a Length: every parser takes its own result too
    except (ValueError, TypeError) as error:
        raise InputError(f"{name} {error}") from None
    if kind is Path or meta["flag"].get("local"):
        problem = local_path_problem(value)
        if problem:
            raise InputError(f"{name} {problem}")
        value = Path(value) if kind is Path else value
    if meta["choices"] and value not in meta["choices"]:
        raise InputError(f"{name} must be one of {', '.join(map(str, meta['choices']))}, got {value!r}")
    if meta["valid"] is not None and not isinstance(value, str):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise InputError(f"{name} must be a number, got {value!r}")
        problem = meta["valid"].problem(float(value))
        if problem:
            raise InputError(f"{name} {problem}")
        if kind is int and not (isinstance(value, numbers.Integral) or float(value).is_integer()):
            raise InputError(f"{name} must be a whole number, got {value!r}")
        value = int(value) if kind is int else float(value) if kind is float else value
    return value
