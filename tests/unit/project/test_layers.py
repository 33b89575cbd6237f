"""The package's layers, checked on its source: which module may import which.

A module imports only from its own package or from the layers below it (``TYPE_CHECKING``
and function-level imports count too); ``sources/`` sees only ``_base`` and ``errors``;
nothing under ``_worker/`` imports code of the training process's side; ``ray`` is imported
only by ``ray.py`` and ``_engines/ray/``. The rules are also written in each subpackage's
``__init__.py`` and in docs/architecture.md.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import asyncloader
from asyncloader._engines import start_method
from tests.helpers.parsing import parse

PACKAGE = Path(asyncloader.__file__).parent

#: The private layers, lowest first: each may import its own package and those before it.
LAYERS = (
    "_base",
    "_images",
    "_config",
    "_tuning",
    "_worker",
    "_checkpoint",
    "_engines",
    "_pipeline",
)
#: Public modules: they sit on top and may import every layer.
PUBLIC = ("__init__", "loader", "diagnose", "images", "ray", "trace")
#: What a worker process's code must never import: the training process's side.
PARENT_SIDE = ("_checkpoint", "_engines", "_pipeline", "sources", *PUBLIC[1:])
RAY_IMPORTERS = ("asyncloader.ray", "asyncloader._engines.ray")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(module: str, source: str, is_package: bool = False) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of everything ``source`` imports, anywhere in it (function
    bodies and ``if TYPE_CHECKING:`` included), relative imports resolved against ``module``.
    ``from a.b import c`` gives ``a.b.c`` (``c`` may be a module or a name in ``a.b``)."""
    found = []
    for node in ast.walk(parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                parts = parts if is_package else parts[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def _where(module: str) -> str:
    """The part of asyncloader ``module`` belongs to: a layer, ``sources``, ``errors`` or a
    public module's name."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def violation(module: str, imported: str) -> str | None:
    """Why ``module`` (in asyncloader) may not import ``imported``; ``None`` when it may."""
    here = _where(module)
    top = imported.split(".")[0]
    if top == "ray" and not module.startswith(RAY_IMPORTERS):
        return "only asyncloader.ray and asyncloader._engines.ray import ray"
    if top != "asyncloader":
        return None
    there = _where(imported)
    if imported.startswith("asyncloader._engines.ray") and not module.startswith(RAY_IMPORTERS):
        return "only asyncloader.ray imports asyncloader._engines.ray (it imports ray)"
    if there == here or there == "errors":
        return None
    if here == "errors":
        return "errors imports nothing of asyncloader"
    if here == "sources":
        return None if there == "_base" else "sources see only _base and errors"
    if here in PUBLIC:
        return None
    if here == "_worker" and there in PARENT_SIDE:
        return "code that runs in a worker process imports no training-process code"
    if there not in LAYERS:
        return (
            f"the core sees {there} only through _base"
            if there == "sources"
            else (f"a private layer imports no public module ({there})")
        )
    if LAYERS.index(there) > LAYERS.index(here):
        return f"{here} is below {there}: layers import only their own package or lower ones"
    return None


def offenders() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        for line, imported in imports_of(module, path.read_text(), path.name == "__init__.py"):
            why = violation(module, imported)
            if why is not None:
                rel = path.relative_to(PACKAGE.parent)
                found.append(f"{rel}:{line} imports {imported}: {why}")
    return found


def test_every_module_imports_only_its_own_layer_or_lower_ones():
    """No module imports upwards, TYPE_CHECKING and function-level imports included."""
    assert offenders() == []


def faced(source: str) -> list[str]:
    """The names a package's ``__init__`` lists in ``__all__`` (none when it has none)."""
    for node in parse(source).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "__all__":
            return list(ast.literal_eval(node.value))
    return []


def import_graph() -> dict[str, set[str]]:
    """Each module of the package, and the modules of the package it imports anywhere
    (``TYPE_CHECKING`` and function-level imports included; ``from a.b import c`` counts as
    ``a.b.c`` where that is a module, else as ``a.b``)."""
    paths = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
    offered = {
        _module_name(path): set(faced(path.read_text())) for path in PACKAGE.rglob("__init__.py")
    }

    def resolve(name: str) -> str:
        package, _, last = name.rpartition(".")
        if last in offered.get(package, ()):  # a name the face offers, not its module
            return package
        while name not in paths:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        found = imports_of(module, path.read_text(), path.name == "__init__.py")
        named = {resolve(name) for _, name in found if name.startswith("asyncloader.")}
        graph[module] = named - {module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected parts of two modules or more
    (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, edges = work[-1]
            step = next((e for e in edges if e not in index or e in stack), None)
            if step is not None and step not in index:
                index[step] = low[step] = len(index)
                stack.append(step)
                work.append((step, iter(sorted(graph[step]))))
                continue
            if step is not None:
                low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = stack[stack.index(node) :]
                del stack[stack.index(node) :]
                if len(part) > 1:
                    found.append(sorted(part))
    return found


def test_no_module_is_part_of_an_import_circle():
    """No circle of imports anywhere in the package, inside a layer too, TYPE_CHECKING
    imports included: a circle means a definition sits in the wrong module."""
    assert circles(import_graph()) == []


def test_the_circle_finder_finds_circles():
    """A circle of three, a self-contained pair, and nothing in a chain."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": {"d"}, "f": {"a"}}
    assert sorted(circles(graph)) == [["a", "b", "c"], ["d", "e"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


#: Nested private packages with a face of their own (imported only through it).
NESTED_FACES = ("asyncloader._engines.ray",)


def face_of(module: str) -> str | None:
    """The face through which another layer imports ``module``: its nested package's or its
    layer's package; ``None`` for a module outside the private layers."""
    for nested in NESTED_FACES:
        if module == nested or module.startswith(nested + "."):
            return nested
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and parts[1] in LAYERS else None


def past_the_face(graph: dict[str, set[str]]) -> list[str]:
    """``module imports target`` wherever a module imports a private layer's inner module
    from outside that layer (or nested face): other layers see only its ``__init__``."""
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            face = face_of(target)
            if face is not None and face != target and face_of(module) != face:
                found.append(f"{module} imports {target}, past the face {face}")
    return found


def test_other_layers_import_a_private_layer_only_through_its_face():
    """Each private layer's __init__ names what it offers; no other layer, public module or
    source reaches into the modules behind it."""
    assert past_the_face(import_graph()) == []


def test_the_face_check_names_an_import_past_it():
    graph = {
        "asyncloader.loader": {"asyncloader._pipeline", "asyncloader._pipeline.epoch"},
        "asyncloader._pipeline.epoch": {"asyncloader._pipeline.device", "asyncloader._base"},
        "asyncloader.ray": {"asyncloader._engines.ray"},
        "asyncloader._engines.local_pool": {"asyncloader._engines.ray.group"},
    }
    assert past_the_face(graph) == [
        "asyncloader._engines.local_pool imports asyncloader._engines.ray.group, past the face "
        "asyncloader._engines.ray",
        "asyncloader.loader imports asyncloader._pipeline.epoch, past the face "
        "asyncloader._pipeline",
    ]


def test_the_checker_names_an_offending_import():
    """The walk resolves relative and TYPE_CHECKING imports and names what breaks a rule."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from .._pipeline.epoch import Epoch\n"
        "def f():\n"
        "    import ray\n"
    )
    found = imports_of("asyncloader._worker.loop", source)
    assert (3, "asyncloader._pipeline.epoch.Epoch") in found
    assert violation("asyncloader._worker.loop", "asyncloader._pipeline.epoch.Epoch")
    assert violation("asyncloader._worker.loop", "ray")
    assert violation("asyncloader._base.kinds", "asyncloader._config.options")
    assert violation("asyncloader.sources._sharded", "asyncloader._worker.startup")
    assert violation("asyncloader._config.options", "asyncloader.sources.SourceKind")
    assert violation("asyncloader._pipeline.epoch", "asyncloader._engines.ray.group")
    assert violation("asyncloader._tuning.meter", "asyncloader.sources._retry.RETRIES")
    assert violation("asyncloader._engines.local_pool", "asyncloader._worker.startup") is None
    assert violation("asyncloader.sources._sharded", "asyncloader._base.worker_info") is None
    assert violation("asyncloader._engines.ray.group", "ray") is None


def test_private_packages_are_layers_with_a_face_and_plain_module_names():
    """Every private subpackage is a known layer. A layer's __init__ is its face: its
    docstring (what the layer does and may import), then imports of what it offers the other
    layers and an ``__all__`` naming exactly those; a subpackage of sources may be its
    docstring alone. Modules inside drop the leading underscore."""
    packages = {p.parent for p in PACKAGE.rglob("__init__.py")} - {PACKAGE, PACKAGE / "sources"}
    # sources/ may hold private subpackages of its own (sources/_cache), under the same rules
    assert {p.relative_to(PACKAGE).parts[0] for p in packages} - {"sources"} == set(LAYERS)
    for package in packages:
        tree = parse((package / "__init__.py").read_text())
        assert "Imports" in (ast.get_docstring(tree) or ""), package
        offered = [
            alias.asname or alias.name
            for node in tree.body
            if isinstance(node, ast.ImportFrom) and node.module != "__future__"
            for alias in node.names
        ]
        assert sorted(offered) == sorted(faced((package / "__init__.py").read_text())), package
        kinds = {type(node) for node in tree.body[1:]}
        assert kinds <= {ast.ImportFrom, ast.Assign}, package
        underscored = [p.name for p in package.glob("_*.py") if p.name != "__init__.py"]
        assert underscored == [], package
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert top == sorted((*PUBLIC, "errors"))


def test_the_fork_servers_preload_names_modules_that_exist():
    """Every module the fork server preloads (``_PRELOAD``) can be found by that name."""
    for name in start_method._PRELOAD:
        if name != "__main__":
            assert importlib.util.find_spec(name) is not None, name
            importlib.import_module(name)
