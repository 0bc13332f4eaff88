"""No import cycle among ``heart``'s modules.

A cycle at module level works only as long as the import order that happens to run first
never changes: the second module of the circle sees the first one half-initialised, and a
name it takes with ``from x import y`` may not exist yet. Shared helpers belong in a module
both sides import (``heart.coercion`` for the argument correctors that ``heart.primitives``
and ``heart.middleware`` both use).

The graph is read from the source with :mod:`ast`: module-level import statements only
(also inside a module-level ``try`` / ``if``), not imports inside a function or a class
body's method, and not those under ``if TYPE_CHECKING:`` (they never run). With
``anywhere=True`` it also holds the imports inside functions: a lazy import closes a circle of
dependencies as surely as one at the top, even when the order of execution hides it.
"""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "heart"


def heart_modules() -> dict[str, Path]:
    """Every module under ``heart/`` (packages as their ``__init__.py``), by dotted name."""
    root = REPO / PACKAGE
    modules = {PACKAGE: root / "__init__.py"}
    for info in pkgutil.walk_packages([str(root)], prefix=PACKAGE + "."):
        relative = Path(*info.name.split(".")[1:])
        modules[info.name] = root / relative / "__init__.py" if info.ispkg else root / relative.with_suffix(".py")
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def module_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The import statements that run when the module is imported: the module's own body and
    the bodies of its module-level ``if`` / ``try`` / ``with`` blocks (not ``if TYPE_CHECKING``)."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.append(node)
            elif isinstance(node, ast.If):
                if not _is_type_checking(node.test):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, ast.With):
                visit(node.body)

    visit(tree.body)
    return found


def all_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement at any depth (inside functions too), but for those under ``if
    TYPE_CHECKING:``."""
    typing_only = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If) and _is_type_checking(block.test)
                   for statement in block.body for node in ast.walk(statement)}
    return [node for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in typing_only]


def imported_heart_modules(name: str, path: Path, modules: dict[str, Path], anywhere: bool = False) -> set[str]:
    """The modules of ``heart`` that module ``name`` imports at module level (``anywhere``:
    at any depth, :func:`all_imports`)."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    targets: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in (all_imports if anywhere else module_level_imports)(tree):
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
            continue
        if node.level:  # relative: from . import x, from ..y import z
            base = package.split(".")
            base = base[: len(base) - (node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        for alias in node.names:  # from pkg import submodule imports the submodule
            if f"{source}.{alias.name}" in modules:
                targets.add(f"{source}.{alias.name}")
            else:
                targets.add(source)
    return {t for t in targets if t in modules and t != name}


def import_graph(anywhere: bool = False) -> dict[str, set[str]]:
    modules = heart_modules()
    return {name: imported_heart_modules(name, path, modules, anywhere) for name, path in modules.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (or a module that
    imports itself), each as the path ``a -> b -> ... -> a``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def strongconnect(node: str) -> None:  # Tarjan; the graph is small, recursion is fine
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                strongconnect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            strongconnect(node)

    cycles = []
    for component in components:
        members = set(component)
        start = component[0]
        if len(component) == 1 and start not in graph.get(start, ()):
            continue
        # the shortest way back to start, within the component (breadth first)
        previous: dict[str, str] = {}
        frontier, seen, end = [start], {start}, None
        while frontier and end is None:
            following = []
            for node in frontier:
                for target in sorted(graph[node] & members):
                    if target == start:
                        end = node
                        break
                    if target not in seen:
                        seen.add(target)
                        previous[target] = node
                        following.append(target)
                if end is not None:
                    break
            frontier = following
        path = [end]
        while path[-1] != start:
            path.append(previous[path[-1]])
        cycles.append([*reversed(path), start])
    return cycles


def test_the_cycle_finder_finds_and_prints_a_cycle():
    graph = {"heart.a": {"heart.b"}, "heart.b": {"heart.c"}, "heart.c": {"heart.a", "heart.d"},
             "heart.d": set(), "heart.e": {"heart.e"}}
    assert find_cycles(graph) == [["heart.a", "heart.b", "heart.c", "heart.a"], ["heart.e", "heart.e"]]
    assert find_cycles({"heart.a": {"heart.b"}, "heart.b": set()}) == []


def test_the_graph_reads_module_level_imports_only(tmp_path):
    source = ("import heart.x\nfrom heart import y\nfrom . import z\nfrom .w import thing\n"
              "try:\n    from heart.t import q\nexcept ImportError:\n    pass\n"
              "if TYPE_CHECKING:\n    from heart.typed import T\n"
              "def f():\n    from heart.late import g\n"
              "class C:\n    def m(self):\n        import heart.later\n")
    path = tmp_path / "mod.py"
    path.write_text(source)
    modules = {f"heart.{n}": tmp_path for n in ("x", "y", "z", "w", "t", "typed", "late", "later", "mod")}
    modules["heart"] = tmp_path
    assert imported_heart_modules("heart.mod", path, modules) == {"heart.x", "heart.y", "heart.z", "heart.w", "heart.t"}


def test_heart_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 30 and "heart.primitives" in graph and "heart.runtime.llamacpp" in graph
    cycles = find_cycles(graph)
    for cycle in cycles:
        print("import cycle: " + " -> ".join(cycle))
    assert not cycles, "import cycles among heart's modules (module-level imports):\n" + \
        "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_the_graph_reads_imports_at_any_depth_when_asked(tmp_path):
    source = ("import heart.x\ndef f():\n    from heart.late import g\n"
              "class C:\n    def m(self):\n        import heart.later\n"
              "if TYPE_CHECKING:\n    from heart.typed import T\n")
    path = tmp_path / "mod.py"
    path.write_text(source)
    modules = {f"heart.{n}": tmp_path for n in ("x", "late", "later", "typed", "mod")}
    assert imported_heart_modules("heart.mod", path, modules, anywhere=True) == {"heart.x", "heart.late", "heart.later"}


def test_heart_has_no_import_circle_even_through_lazy_imports():
    graph = import_graph(anywhere=True)
    assert sum(len(edges) for edges in graph.values()) > 100  # the finder sees the imports at all
    assert "heart.environments.bfcl" in graph["heart.environments"]  # imported inside load_environment
    assert "heart.toolface" not in graph["heart.provenance"]  # imported under TYPE_CHECKING only
    cycles = find_cycles(graph)
    assert not cycles, "modules of heart/ that import each other (at any depth):\n" + "\n".join(
        " -> ".join(cycle) for cycle in cycles)


def test_the_runtime_reaches_no_environment_library_primitive_or_toolface():
    """Model serving stands below what the loop runs over: the gold teacher, which reads
    environments, the library, primitives and ToolFace, lives on the data side."""
    graph = import_graph(anywhere=True)
    reached, todo = set(), [name for name in graph if name.startswith("heart.runtime")]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo += graph[name]
    assert "heart.roles.router" in reached  # the finder follows the runtime's imports at all
    above = sorted(name for name in reached if name.startswith(("heart.environments", "heart.library",
                                                                "heart.primitives", "heart.toolface")))
    assert not above, f"heart/runtime/ reaches {above}"


def test_middleware_and_primitives_share_the_correctors_without_a_circle():
    """heart.primitives imports heart.middleware; the middleware takes the correctors it
    applies from heart.coercion, never from heart.primitives (not even lazily in a function)."""
    graph = import_graph()
    assert "heart.coercion" in graph["heart.middleware"] and "heart.coercion" in graph["heart.primitives"]
    tree = ast.parse((REPO / "heart" / "middleware.py").read_text(encoding="utf-8"))
    anywhere = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names} | \
        {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert "heart.primitives" not in anywhere
