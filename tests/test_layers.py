"""The package's layers (docs/architecture.md): imports only go down, and no module is in a
circle of imports. Every import counts: at the top, under `if TYPE_CHECKING:` (what mypy and
a reader follow) and inside a function.

cli -> daemon -> agents | skills | backends -> protocol | host -> base (config, errors, redact).
agents, skills and backends are siblings and never import each other; plane is a separate
server that imports only protocol, host and base; host never imports protocol.
"""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "caldera"
MAY_IMPORT = {
    "cli": {"daemon", "agents", "skills", "backends", "plane", "protocol", "host", "base"},
    "daemon": {"agents", "skills", "backends", "protocol", "host", "base"},
    "agents": {"protocol", "host", "base"},
    "skills": {"protocol", "host", "base"},
    "backends": {"protocol", "host", "base"},
    "plane": {"protocol", "host", "base"},
    "protocol": {"host", "base"},
    "host": {"base"},
    "base": {"base"},
}
BASE = {"config", "errors", "redact", "__init__", "__version__", "TYPE_CHECKING"}


def layer_of(dotted: str) -> str:
    parts = dotted.split(".")
    name = parts[1] if len(parts) > 1 else "__init__"
    return "base" if name in BASE else name


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path):
    """(imported module, line) for every import of caldera's in the file: at the top, inside
    `if TYPE_CHECKING:` (what mypy and a reader follow) and inside functions (deferred)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "caldera":
            if node.module == "caldera":
                yield from ((f"caldera.{alias.name}", node.lineno) for alias in node.names)
            else:
                yield node.module, node.lineno
        elif isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names if alias.name.split(".")[0] == "caldera")


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the modules it imports, as Python runs them: `from caldera.x import y` runs
    caldera.x (its __init__) and, when y is a submodule, caldera.x.y; `import caldera.x.y`
    runs caldera.x and caldera.x.y. A package's __init__ is a module like any other here."""
    paths = {module_name(p, package): p for p in package.rglob("*.py")}

    def with_parents(dotted: str) -> set[str]:
        parts = dotted.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}

    graph = {}
    for name, path in paths.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == package.name:
                edges |= with_parents(node.module)
                edges |= {f"{node.module}.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    edges |= with_parents(alias.name)
        graph[name] = {e for e in edges if e in paths and e != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def wrong_layer_imports(package: Path = PACKAGE) -> list[str]:
    """Imports up a layer; and relative imports, which neither check here could follow."""
    wrong = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level:
                wrong.append(f"{path.relative_to(package.parent)}:{node.lineno} imports relatively")
        me = layer_of(module_name(path, package))
        for target, line in imports(path):
            other = layer_of(target)
            if other != me and other not in MAY_IMPORT[me]:
                wrong.append(f"{path.relative_to(package.parent)}:{line} ({me}) imports {target} ({other})")
    return wrong


def test_imports_only_go_down_type_only_ones_included():
    assert wrong_layer_imports() == []


def test_the_import_graph_has_no_cycle_type_only_imports_included():
    assert cycles(import_graph()) == []


def test_a_type_only_import_up_a_layer_or_round_a_circle_is_found(tmp_path):
    """The two checks above read `if TYPE_CHECKING:` imports as imports."""
    package = tmp_path / "caldera"
    for layer in ("agents", "daemon"):
        (package / layer).mkdir(parents=True)
        (package / layer / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "agents" / "commands.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from caldera.daemon.dispatch import Context\n")
    (package / "daemon" / "dispatch.py").write_text(
        "def route():\n    from caldera.agents import commands\n    return commands\n")
    assert wrong_layer_imports(package) == [
        "caldera/agents/commands.py:3 (agents) imports caldera.daemon.dispatch (daemon)"]
    assert cycles(import_graph(package)) == [["caldera.agents.commands", "caldera.daemon.dispatch"]]


def test_a_circle_through_a_package_init_or_a_relative_import_is_found(tmp_path):
    """`from caldera.agents.process import files` runs process/__init__.py first: a circle
    through an __init__ is a circle (at run time, a partially initialised module)."""
    package = tmp_path / "caldera"
    (package / "agents" / "process").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "agents" / "__init__.py").write_text("")
    (package / "agents" / "process" / "__init__.py").write_text("from caldera.agents.process.driver import Driver\n")
    (package / "agents" / "process" / "files.py").write_text("")
    (package / "agents" / "process" / "driver.py").write_text("from caldera.agents.process import files\n")
    assert cycles(import_graph(package)) == [["caldera.agents.process", "caldera.agents.process.driver"]]
    (package / "agents" / "process" / "files.py").write_text("from . import driver\n")
    assert wrong_layer_imports(package) == ["caldera/agents/process/files.py:1 imports relatively"]


def test_the_top_level_names_the_layers():
    # schemas, examples: package data, no layer (links to the top-level schemas/ and examples/;
    # docs/packaging.md, "The wheel")
    entries = sorted(p.name for p in PACKAGE.iterdir() if p.name not in ("__pycache__", "schemas", "examples"))
    assert len(entries) <= 12, entries
    assert {"cli", "daemon", "protocol", "agents", "host", "skills", "backends", "plane"} <= set(entries)


def test_every_package_says_what_it_owns_and_may_import():
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        assert "May import" in doc, f"{init} does not say what it may import"


def test_the_shared_agent_modules_import_no_mode():
    """manifest, settings, window, revisions, blueprint, contract, trust (the trust boundary),
    updates (blueprint updates in the state dir) and current (what a reload replaces) serve
    every mode: the knot manifest <-> adapter stays untied (a mode imports them, never the
    other way round). They may name the driver interface both modes satisfy (driver.py)."""
    shared = ("manifest", "settings", "window", "revisions", "blueprint", "contract", "trust", "updates", "current")
    wrong = [f"{name}.py imports {target}" for name in shared
             for target, _ in imports(PACKAGE / "agents" / f"{name}.py")
             if target.startswith("caldera.agents.") and target.split(".")[2] not in (*shared, "driver")]
    assert wrong == []


def test_typing_constant_is_defined_once():
    """`caldera.TYPE_CHECKING` is the one stand-in for typing's constant (caldera/__init__.py
    says why); a module that defines its own copy drifts from it."""
    def defines_it(path: Path) -> bool:
        return any(isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "TYPE_CHECKING" for t in node.targets)
                   for node in ast.parse(path.read_text(encoding="utf-8")).body)

    copies = [str(p.relative_to(PACKAGE.parent)) for p in sorted(PACKAGE.rglob("*.py"))
              if p != PACKAGE / "__init__.py" and defines_it(p)]
    assert copies == []
    assert defines_it(PACKAGE / "__init__.py")


def test_nothing_in_caldera_probes_with_hasattr():
    """A driver is asked through its declared interface (agents/driver.py: `AgentDriver`, and
    `as_process_driver` for what only process mode has), never probed for an attribute; no other
    `hasattr` remains in the package either, so the rule is simply: none."""
    wrong = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
             for path in sorted(PACKAGE.rglob("*.py"))
             for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "hasattr"]
    assert wrong == []


def test_the_architecture_table_names_every_module_of_the_layers_it_lists():
    """daemon/, agents/, protocol/ and host/ list their modules one by one in the layer table
    (docs/architecture.md); a module added there is named there too (skills/, backends/ and
    plane/ describe what they own instead)."""
    import re

    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(\w+)/` \|([^\n]*)", doc, re.M))
    missing = [f"{layer}/{path.name}" for layer in ("daemon", "agents", "protocol", "host")
               for path in sorted((PACKAGE / layer).glob("*.py"))
               if path.stem != "__init__" and f"`{path.stem}`" not in rows[layer]]
    assert missing == []
