"""Option schemas: fields checked where they are made, lengths with units, schemas derived from others."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pytest

from crackseg.core.errors import InputError
from crackseg.core.options import (
    AT_LEAST_ONE,
    REQUIRED,
    Length,
    Options,
    derived,
    group,
    option,
    option_fields,
    parse_size,
)


@dataclass(frozen=True, kw_only=True)
class _Inner(Options):
    gap: Length = option(Length(10), "a gap", parse=Length.parse)


@dataclass(frozen=True, kw_only=True)
class _Schema(Options):
    source: Path = option(REQUIRED, "a local file")
    count: int = option(1, "how many", valid=AT_LEAST_ONE)
    mode: str = option("a", "a mode", choices=("a", "b"))
    size: tuple[int, int] | None = option(None, "a size", parse=parse_size)
    inner: _Inner = group(_Inner)


@pytest.mark.parametrize("text, value, unit, shown", [("12px", 12, "px", "12px"), ("3mm", 3, "mm", "3mm"), ("12", 12, "px", "12px"),
                                                      (" 2.5MM ", 2.5, "mm", "2.5mm"), (7, 7, "px", "7px")])
def test_lengths_keep_their_unit(text, value, unit, shown):
    length = Length.parse(text)
    assert (length.value, length.unit, str(length)) == (value, unit, shown)


@pytest.mark.parametrize("text", ["-1px", "nan", "inf mm", "3 inches", ""])
def test_lengths_that_are_not_lengths_are_refused(text):
    with pytest.raises(ValueError):
        Length.parse(text)


def test_a_length_in_mm_needs_a_pixel_size_for_pixels():
    assert Length(3, "mm").pixels(0.5) == 6
    assert Length(3, "mm").pixels(None) is None
    assert Length(3, "px").pixels(0.5) == 3


def test_a_schema_checks_and_converts_its_fields_where_it_is_made():
    made = _Schema(source="photos/a.jpg", size="32x48", inner=_Inner(gap="2mm"))
    assert made.source == Path("photos/a.jpg") and made.size == (32, 48) and made.inner.gap == Length(2, "mm")


@pytest.mark.parametrize("fields, message", [
    ({"count": 0}, "--count must be >= 1, got 0"),
    ({"count": 1.5}, "--count must be a whole number, got 1.5"),
    ({"count": True}, "--count must be a number, got True"),
    ({"count": float("nan")}, "--count must be a finite number, got nan"),
    ({"mode": "c"}, "--mode must be one of a, b, got 'c'"),
    ({"size": "8"}, "--size size must be at least 16 px, got '8'"),
    ({"source": "s3://bucket/a.jpg"}, "--source s3://bucket/a.jpg: a local path is needed here"),
])
def test_a_field_out_of_its_rules_is_an_error_naming_its_flag(fields, message):
    with pytest.raises(InputError) as error:
        _Schema(**{"source": "a.jpg", **fields})
    assert str(error.value).startswith(message)


def test_a_derived_schema_takes_the_fields_as_declared_in_their_owner():
    both = derived("_Both", _Schema, ("count", "mode"), first=(str, option("x", "first")))
    assert [item.name for item, _ in option_fields(both)] == ["first", "count", "mode"]
    original = {item.name: item for item in dataclasses.fields(_Schema)}
    for item, kind in option_fields(both)[1:]:
        assert dict(item.metadata) == dict(original[item.name].metadata) and item.default == original[item.name].default
    with pytest.raises(InputError, match="--count must be >= 1"):
        both(count=0)


def test_a_number_given_for_a_length_is_in_px():
    assert _Inner(gap=4).gap == Length(4, "px")


def test_numbers_of_any_numeric_type_are_taken_as_the_field_type():
    import numpy as np

    assert _Schema(source="a.jpg", count=np.int64(3)).count == 3 and type(_Schema(source="a.jpg", count=np.int64(3)).count) is int
    assert _Schema(source="a.jpg", count=2.0).count == 2
