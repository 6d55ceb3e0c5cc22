"""The package's shape, checked from its source: dependencies point down, no import cycle, files stay small."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "relaygen_integrations"
NAME = PACKAGE.name
MAX_LINES = 500
ABOVE_THE_ENGINE = ("chat", "langchain", "llama_index", "serve", "bench", "calibrate", "cli")
CORE, LOCAL, REMOTE = f"{NAME}.engine.core", f"{NAME}.engine.local", f"{NAME}.engine.remote"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, node: ast.ImportFrom) -> list[str]:
    """The package modules an ``from ... import ...`` names (a relative import resolved against ``module``)."""
    if node.level:
        package = module.split(".")
        is_package = (PACKAGE.parent / Path(*package) / "__init__.py").exists()
        base = package if is_package else package[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join([*base, node.module] if node.module else base)
    else:
        target = node.module or ""
    if not target.startswith(NAME):
        return []
    # "from .x import y" may import the submodule x.y itself.
    return [target] + [f"{target}.{alias.name}" for alias in node.names]


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def import_statements(path: Path, top_level_only: bool, type_checking: bool = False) -> list[ast.stmt]:
    """The import statements of ``path`` (at import time only, or anywhere incl. inside functions;
    ``type_checking``: the annotation-only imports under ``if TYPE_CHECKING:`` too)."""
    found: list[ast.stmt] = []

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.append(node)
            elif isinstance(node, ast.If) and _is_type_checking(node):
                if type_checking:  # annotations only: never imported at run time, but still a dependency
                    visit(node.body)
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
                visit(getattr(node, "finalbody", []))
            elif not top_level_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(node.body)

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return found


def imports(path: Path, top_level_only: bool, type_checking: bool = False) -> set[str]:
    """Modules of this package that ``path`` imports (:func:`import_statements`)."""
    module = module_name(path)
    found: set[str] = set()
    for node in import_statements(path, top_level_only, type_checking):
        if isinstance(node, ast.ImportFrom):
            found.update(_resolve(module, node))
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith(NAME))
    return found


def graph(top_level_only: bool, type_checking: bool = False) -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {
        name: {m for m in imports(path, top_level_only, type_checking) if m in modules and m != name}
        for name, path in modules.items()
    }


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_no_import_cycle() -> None:
    # A lazy import inside a function, or one under TYPE_CHECKING, still ties the two modules together.
    edges = graph(top_level_only=False, type_checking=True)
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            # A package's own __init__ importing its submodules is not a cycle back into it.
            if nxt.startswith(node + "."):
                continue
            if state.get(nxt) == 1:
                cycle = [*stack[stack.index(nxt) :], nxt]
                if not all(later.startswith(cycle[0] + ".") for later in cycle[1:-1]):
                    raise AssertionError("import cycle: " + " -> ".join(cycle))
            elif nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            walk(node)


def test_the_engine_imports_nothing_above_it() -> None:
    upward = {f"{NAME}.{name}" for name in ABOVE_THE_ENGINE}
    for name, targets in graph(top_level_only=False).items():
        if name.startswith(f"{NAME}.engine"):
            bad = sorted(t for t in targets if any(t == u or t.startswith(u + ".") for u in upward))
            assert not bad, f"{name} imports {bad}: the engine must stay framework-free"


def test_no_module_is_over_the_size_limit() -> None:
    sizes = {
        str(p.relative_to(PACKAGE)): len(p.read_text(encoding="utf-8").splitlines()) for p in PACKAGE.rglob("*.py")
    }
    assert {f: n for f, n in sizes.items() if n > MAX_LINES} == {}


def test_the_core_imports_neither_backend() -> None:
    """``engine/core`` is what every backend shares; a backend is a folder that plugs into it, never the reverse."""
    for name, targets in graph(top_level_only=False, type_checking=True).items():
        if _within(name, CORE):
            bad = sorted(t for t in targets if _within(t, LOCAL) or _within(t, REMOTE) or t == f"{NAME}.engine.engine")
            assert not bad, f"{name} imports {bad}: the core must not know any backend or the front"


def test_the_backends_do_not_import_each_other() -> None:
    for name, targets in graph(top_level_only=False, type_checking=True).items():
        for own, other in ((LOCAL, REMOTE), (REMOTE, LOCAL)):
            if _within(name, own):
                bad = sorted(t for t in targets if _within(t, other) or t == f"{NAME}.engine.engine")
                assert not bad, f"{name} imports {bad}: a backend depends on the core only"


def test_folders_not_prefixes() -> None:
    """A family of modules is a package (``cli/``, ``bench/``, ``serve/``), not a file-name prefix."""
    flat = sorted(p.name for p in PACKAGE.glob("*.py") if p.name.startswith(("cli_", "bench_", "serve_")))
    assert flat == []
    assert sorted(p.name for p in (PACKAGE / "engine").glob("*.py")) == ["__init__.py", "engine.py"]


def test_no_module_imports_a_private_name_of_another() -> None:
    """A name a module keeps private (``_name``) is not another module's interface."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(NAME)):
                found += [f"{path.relative_to(PACKAGE)}: {a.name}" for a in node.names if a.name.startswith("_")]
    assert found == []


def test_the_adapters_reach_the_engine_through_its_public_face() -> None:
    """The chat layer and both framework adapters ask the engine (``engine.grammar_tokenizer``,
    ``engine.context_window``), never its backend: a new backend then needs no change above the engine."""
    found = []
    for folder in ("chat", "langchain", "llama_index"):
        for path in (PACKAGE / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Attribute) and node.attr == "backend":
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert found == []


# The transcript's writers: what changes its text, ids, spans, counts or end.
TRANSCRIPT_WRITERS = {"settle_run", "accept_run", "reject_from", "end", "feed", "account_forward", "push", "release",
                      "finish", "note"}  # fmt: skip


def test_only_the_loop_writes_the_transcript() -> None:
    """Sessions are token sources: they read the transcript and return a Step (tokens, passes, log probabilities,
    a verdict, their own end); ``core/loop.py`` records it. No backend, and no server built on one, calls a
    transcript's (or its log-probability ledger's) writing methods."""
    found = []
    for folder in ("engine/local", "engine/remote", "serve"):
        for path in (PACKAGE / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    target = ast.unparse(node.func.value)
                    if node.func.attr in TRANSCRIPT_WRITERS and ("transcript" in target or "logprobs" in target):
                        found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {target}.{node.func.attr}")
    assert found == []


def test_one_reader_of_a_pairs_shipped_profile() -> None:
    """What a pair ships is asked of one object (``engine/core/shipped.py``, the file parsed once): no other module
    finds the profiles folder or reads a pair's profile file itself."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "shipped.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value == "profiles":
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: the profiles folder")
            # `relaygen tune --profile-from` writes the file: only the CLI needs its path.
            names_the_path = isinstance(node, ast.Call) and ast.unparse(node.func).endswith("shipped_profile_path")
            if names_the_path and path.parent.name != "cli":
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


# Third-party libraries worth deferring: each costs a noticeable import (or pulls one that does).
HEAVY_LIBRARIES = frozenset({"torch", "transformers", "matplotlib", "fastapi", "uvicorn", "langchain_core",
                             "llama_index", "gguf", "llguidance", "openai", "httpx", "numpy"})  # fmt: skip


def _heavy_imports(path: Path) -> set[str]:
    found = set()
    for node in import_statements(path, top_level_only=True):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found & HEAVY_LIBRARIES


def _lazy_names(path: Path, module: str) -> dict[str, str]:
    """A package that imports its names on first access (a module ``__getattr__``) lists under ``TYPE_CHECKING``
    where each lives: name -> module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    if not any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body):
        return {}
    homes = {}
    for block in (n for n in tree.body if isinstance(n, ast.If) and _is_type_checking(n)):
        for node in (n for n in block.body if isinstance(n, ast.ImportFrom)):
            target = _resolve(module, node)[0]
            homes.update({alias.asname or alias.name: target for alias in node.names})
    return homes


def deferred_imports_without_a_reason() -> list[str]:
    """Imports inside functions whose module would neither close an import cycle nor load a heavy library that
    the importing module does not load already (see the test below)."""
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    top = graph(top_level_only=True)
    lazy = {name: _lazy_names(path, name) for name, path in paths.items() if path.name == "__init__.py"}

    def closure(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            parts = name.split(".")
            todo += [
                *top.get(name, ()),
                *(".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in paths),
            ]
        return seen

    def heavy(name: str) -> set[str]:
        return set().union(*(_heavy_imports(paths[m]) for m in closure(name)))

    def home(package: str, name: str) -> str:
        seen = set()
        while package in lazy and name in lazy[package] and package not in seen:
            seen.add(package)
            package = lazy[package][name]
        return f"{package}.{name}" if f"{package}.{name}" in paths else package

    unjustified = []
    for module, path in sorted(paths.items()):
        for function in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if not isinstance(node, ast.ImportFrom) or not _resolve(module, node):
                    continue
                package = _resolve(module, node)[0]
                for target in {home(package, alias.name) for alias in node.names}:
                    if target in paths and module not in closure(target) and not heavy(target) - heavy(module):
                        unjustified.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {target}")
    return unjustified


def test_every_deferred_import_breaks_a_cycle_or_defers_a_heavy_library() -> None:
    """An import inside a function hides a dependency from the reader; it is kept only where it pays: the module it
    imports would close an import cycle at load time, or would load a heavy library (torch, transformers, an HTTP
    stack, ...) that the importing module does not load already (so ``relaygen --help`` and the light entry points
    stay light). A name taken from a lazy package counts from the module it really lives in."""
    assert deferred_imports_without_a_reason() == []
