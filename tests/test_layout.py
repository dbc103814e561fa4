"""The README's layout is the real one: every module imports only modules listed above it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _levels() -> list[set[str]]:
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("## Layout") :].split("```")[1]
    rows = re.findall(r"^  ([a-z][a-z_, ]*?)\s{2,}", block, flags=re.MULTILINE)
    return [{name.strip() for name in row.split(",")} for row in rows]


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("crackseg"):
            if node.module == "crackseg":
                found |= {alias.name for alias in node.names}
            else:
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {alias.name.split(".")[1] for alias in node.names if alias.name.startswith("crackseg.")}
    return found - {"__version__"}


def test_readme_lists_every_module_once():
    listed = [name for level in _levels() for name in level]
    modules = sorted(p.stem for p in (ROOT / "crackseg").glob("*.py") if not p.stem.startswith("__"))
    assert sorted(listed) == modules


def test_every_module_imports_only_modules_above_it():
    levels = _levels()
    rank = {name: index for index, level in enumerate(levels) for name in level}
    for name, index in rank.items():
        below = {other for other in _imports(ROOT / "crackseg" / f"{name}.py") if rank[other] >= index and other != name}
        assert not below, f"crackseg/{name}.py imports {sorted(below)}, listed at or below it"


def test_no_function_takes_more_than_seven_parameters():
    """Past seven, arguments belong in an options dataclass (InferenceOptions, PredictOptions, RasterRun, ...)."""
    crowded = []
    for path in sorted((ROOT / "crackseg").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                count = len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs) + bool(args.vararg) + bool(args.kwarg)
                if count > 7:
                    crowded.append(f"{path.name}:{node.lineno} {node.name} ({count})")
    assert not crowded, crowded
