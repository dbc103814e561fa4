"""The package layout the README states is the real one: arrows point down only, rooms import nothing.

Each package of crackseg imports only the packages its arrow names (``ALLOWED``, the README's
"Layout" rule), no two modules of one package import each other in a cycle, the torch-free
packages start without loading torch, and no module outgrows ``MAX_LINES``.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "crackseg"

ALLOWED = {
    "core": set(),
    "data": {"core"},
    "cracks": {"core"},
    "model": {"core"},
    "evaluation": {"model", "cracks", "data", "core"},
    "training": {"evaluation", "model", "data", "core"},
    "prediction": {"model", "cracks", "data", "core"},
    "labels": {"prediction", "data", "core"},
    "monitoring": {"prediction", "cracks", "data", "core"},
    "integrations": {"labels", "prediction", "data", "core"},
    "cli": {"core", "data", "cracks", "model", "evaluation", "training", "prediction", "labels", "monitoring", "integrations"},
}
TORCH_FREE = ("core", "data", "cracks", "labels", "monitoring", "integrations", "cli")
MAX_LINES = 400
MAX_FUNCTION_LINES = 60
TRAIN_LINES = 300  # training/train.py reads top to bottom as fit(config): the rest lives in its own modules


def _modules(package: Path) -> list[Path]:
    return sorted(path for path in package.rglob("*.py") if "__pycache__" not in path.parts)


def _dotted(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, package: Path, typing_too: bool = True) -> set[str]:
    """Every crackseg module or package ``path`` imports, at the top or inside a function: ``from crackseg.x import y``,
    ``import crackseg.x``, ``import crackseg`` (the package face, whatever is reached through it), and
    ``importlib.import_module("crackseg.x")`` or ``__import__`` with the name written out. ``typing_too``: also those
    under ``if TYPE_CHECKING:``, which the arrows count and cycles do not (they are never run)."""
    name = package.name
    found = set()
    tree = ast.parse(path.read_text())
    if not typing_too:  # imports for type hints alone are not made when the module runs
        for guard in [node for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)]:
            guard.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}: relative import; name the module in full")
        if isinstance(node, ast.ImportFrom) and node.module and (node.module == name or node.module.startswith(name + ".")):
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name == name or alias.name.startswith(name + ".")}
        elif isinstance(node, ast.Call) and _called(node.func) in ("import_module", "__import__") and node.args:
            target = node.args[0]
            if isinstance(target, ast.Constant) and isinstance(target.value, str) and target.value.split(".")[0] == name:
                found.add(target.value)
    return found


def _called(func: ast.expr) -> str | None:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _room(dotted: str) -> str | None:
    """The package a dotted name lies in (``crackseg.data.images`` -> ``data``); None for the package face."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in ALLOWED) else None


def layout_violations(package: Path) -> list[str]:
    """Imports that go against ``ALLOWED``: up an arrow, sideways, or from a room into the package face."""
    wrong = []
    for path in _modules(package):
        if path.parent == package:  # the face (__init__, __main__) may reach into any room, lazily
            continue
        room = path.relative_to(package).parts[0]
        for target in sorted(_imports(path, package)):
            other = _room(target)
            if other is None:
                wrong.append(f"{path.relative_to(package.parent)} imports the package face ({target})")
            elif other != room and other not in ALLOWED[room]:
                wrong.append(f"{path.relative_to(package.parent)} ({room}) imports {target} ({other})")
    return wrong


def cycles(package: Path) -> list[list[str]]:
    """Import cycles between modules of one room."""
    names = {_dotted(path, package): path for path in _modules(package)}
    edges = {
        name: {target.rsplit(".", 1)[0] if target not in names else target for target in _imports(path, package, typing_too=False)}
        & (set(names) - {name})
        for name, path in names.items()
    }
    found, done = [], set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            found.append(trail[trail.index(name):] + [name])
            return
        if name in done:
            return
        for target in sorted(edges[name]):
            if _room(target) == _room(name):
                visit(target, trail + [name])
        done.add(name)

    for name in sorted(names):
        visit(name, [])
    return found


def test_every_import_follows_the_arrows():
    assert not layout_violations(PACKAGE)


def test_no_import_cycle_inside_a_package():
    assert not cycles(PACKAGE)


def test_an_upward_import_is_caught(tmp_path):
    """The check itself: a copy of the package with one upward import fails it."""
    copy = tmp_path / "crackseg"
    for path in _modules(PACKAGE):
        target = copy / path.relative_to(PACKAGE)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text())
    assert not layout_violations(copy)
    measure = copy / "cracks" / "measure.py"
    measure.write_text(measure.read_text() + "\n\ndef _upward():\n    from crackseg.prediction.outputs import PredictionsFolder\n")
    assert layout_violations(copy) == ["crackseg/cracks/measure.py (cracks) imports crackseg.prediction.outputs.PredictionsFolder (prediction)"]


@pytest.mark.parametrize("line", ["import crackseg\nx = crackseg.load_model", "import importlib\nimportlib.import_module('crackseg')",
                                  "from importlib import import_module\nimport_module('crackseg.prediction.outputs')",
                                  "__import__('crackseg.prediction.outputs')"])
def test_every_form_of_an_upward_import_is_caught(tmp_path, line):
    package = tmp_path / "crackseg"
    (package / "cracks").mkdir(parents=True)
    (package / "cracks" / "measure.py").write_text(f"def _upward():\n    {line.replace(chr(10), chr(10) + '    ')}\n")
    assert len(layout_violations(package)) == 1


def test_a_cycle_inside_a_package_is_caught(tmp_path):
    package = tmp_path / "crackseg"
    (package / "core").mkdir(parents=True)
    (package / "core" / "a.py").write_text("from crackseg.core.b import x\n")
    (package / "core" / "b.py").write_text("def x():\n    from crackseg.core import a\n")
    assert cycles(package) == [["crackseg.core.a", "crackseg.core.b", "crackseg.core.a"]]


def test_every_room_is_a_package_with_a_sign_that_imports_nothing():
    rooms = sorted(path.name for path in PACKAGE.iterdir() if path.is_dir() and path.name != "__pycache__")
    assert rooms == sorted(ALLOWED)
    for init in sorted(PACKAGE.glob("*/**/__init__.py")):
        tree = ast.parse(init.read_text())
        docstring = ast.get_docstring(tree)
        assert docstring and len(tree.body) == 1, f"{init}: a docstring saying what lives here and what it may import, nothing else"


def test_the_readme_names_every_module_and_states_the_rule():
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("## Layout"):].split("```")[1]
    for room, allowed in ALLOWED.items():
        assert f"\n  {room}/" in block, f"README's layout lacks {room}/"
    rooms = re.split(r"\n  (" + "|".join(ALLOWED) + r")/", block.split("The rule")[0])
    listed = {room: set(re.findall(r"[a-z_]+", text)) for room, text in zip(rooms[1::2], rooms[2::2])}
    for path in _modules(PACKAGE):
        room = path.relative_to(PACKAGE).parts[0] if path.parent != PACKAGE else None
        if room and path.stem != "__init__":
            assert path.stem in listed[room], f"README's layout does not name {path.relative_to(ROOT)} under {room}/"
    rule = " ".join(block.split())
    for room, allowed in ALLOWED.items():
        if room != "cli":
            arrow = ", ".join(sorted(allowed, key=list(ALLOWED).index, reverse=True)) or "nothing"
            assert f"{room} → {arrow}" in rule, f"README's rule for {room} should read '{room} → {arrow}'"


@pytest.mark.parametrize("room", TORCH_FREE)
def test_torch_free_rooms_start_without_torch(room):
    modules = [_dotted(path, PACKAGE) for path in _modules(PACKAGE / room)]
    code = f"import sys\nfor name in {modules!r}:\n    __import__(name)\nprint(sorted(m for m in ('torch', 'torchvision') if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert loaded.strip() == "[]", f"importing crackseg.{room} loads {loaded.strip()}"


def test_no_module_is_longer_than_the_limit():
    long = [f"{path.relative_to(ROOT)} ({count})" for path in _modules(PACKAGE)
            if (count := len(path.read_text().splitlines())) > MAX_LINES]
    assert not long, f"split these at a seam: {long}"
    assert len((PACKAGE / "training" / "train.py").read_text().splitlines()) <= TRAIN_LINES


def test_no_function_is_longer_than_the_limit():
    long = [f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1})"
            for path in _modules(PACKAGE) for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"split these into steps: {long}"


def test_no_function_takes_more_than_seven_parameters():
    """Past seven, arguments belong in an options dataclass (InferenceOptions, PredictOptions, RasterRun, ...)."""
    crowded = []
    for path in _modules(PACKAGE):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                count = len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs) + bool(args.vararg) + bool(args.kwarg)
                if count > 7:
                    crowded.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({count})")
    assert not crowded, crowded


def test_tests_mirror_the_packages():
    rooms = {path.name for path in (ROOT / "tests").iterdir() if path.is_dir() and path.name != "__pycache__"}
    assert rooms <= set(ALLOWED), f"test folders without a package: {sorted(rooms - set(ALLOWED))}"
    names = [path.name for path in (ROOT / "tests").rglob("test_*.py")]
    assert len(names) == len(set(names)), "test file names must be unique across tests/ (pytest imports them by name)"
