"""The shell of crackseg's offline pages (predict's ``report.html`` and compare's): one self-contained file,
its styles, script and data inline, its pictures files beside it linked relatively, so it opens without a network.

A page is a template whose placeholders :func:`page` fills in one pass: ``<!--TITLE-->``, ``/*STYLE*/`` (the
shared CSS), ``/*HELPERS*/`` (the shared script: ``el(tag, attrs, ...children)`` builds an element, ``num(v, d)``
writes a number with ``d`` decimals, blank when missing), ``/*ROWS*/`` (:data:`PAGE_ROWS`), ``/*DATA*/`` (the
page's data as JSON), and any others the page names.
"""

from __future__ import annotations

import html
import json
import os
import re
import urllib.parse
from pathlib import Path

from crackseg.core.files import readable

PAGE_ROWS = 50  # rows of a page's main table (images, pairs) per page: thousands stay usable
VIEW_PX = 1600  # the longer side of the large pictures a page shows


def page(template: str, title: str, data: dict, placeholders: dict[str, str] | None = None) -> str:
    """``template`` with its placeholders (and ``placeholders``' own) filled in one pass, so text from the data
    is never read as a placeholder."""
    values = {
        "/*STYLE*/": _STYLE, "/*HELPERS*/": _HELPERS, "/*ROWS*/": str(PAGE_ROWS), **(placeholders or {}),
        "<!--TITLE-->": html.escape(title),
        # Every "<" escaped: "</script>" or "<!--" in a file name must not end or hide the script holding the data.
        "/*DATA*/": json.dumps(_shown(data)).replace("<", "\\u003c"),
    }
    return re.sub("|".join(map(re.escape, values)), lambda match: values[match.group(0)], template)


def _shown(value):
    """``value`` with its text as the tables write it: a file name's bytes that are not UTF-8 as ``\\xNN``."""
    if isinstance(value, str):
        return readable(value)
    if isinstance(value, dict):
        return {key: _shown(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_shown(item) for item in value]
    return value


def relative_url(relative: Path) -> str:
    """A relative URL of a picture whatever its name holds (#, ?, %, backslashes, newlines, bytes that are not UTF-8)."""
    return urllib.parse.quote(os.fsencode(relative.as_posix()))


_STYLE = """body{font:14px/1.4 system-ui,sans-serif;margin:0 24px 40px;color:#222}
h1{font-size:22px;margin:18px 0 6px}h2{font-size:17px;margin:22px 0 8px}
table{border-collapse:collapse}th,td{padding:4px 8px;border-bottom:1px solid #ddd;text-align:right}
th:first-child,td:first-child{text-align:left}th.sortable{cursor:pointer;user-select:none;background:#f3f3f3}
th.sortable:hover{background:#e6e6e6}tr.image-row{cursor:pointer}tr.image-row:hover{background:#fff5e6}
.cards{display:flex;flex-wrap:wrap;gap:12px}.card{border:1px solid #ddd;border-radius:6px;padding:8px 14px;min-width:130px}
.card b{display:block;font-size:20px}.muted{color:#777}.warn{color:#a15c00}
img.thumb{height:48px;border:1px solid #ccc}#detail{margin-top:18px;border-top:2px solid #c33;padding-top:8px}
#detail img{max-width:100%;border:1px solid #ccc}button{font:inherit;padding:3px 10px;margin-right:6px}
"""

_HELPERS = r'''const el = (tag, attrs, ...children) => { const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const child of children) node.append(child); return node; };
const num = (v, d) => (v === null || v === undefined || Number.isNaN(v)) ? "" : Number(v).toFixed(d);
'''
