"""The package's layers (docs/architecture.md): imports only go down.

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
# The one upward import allowed, and only for types (inside `if TYPE_CHECKING:`, never run):
# a command handler in agents/, skills/ or backends/ names the context the daemon gives it.
TYPE_ONLY_UP = {"caldera.daemon.dispatch"}


def layer_of(dotted: str) -> str:
    parts = dotted.split(".")
    name = parts[1] if len(parts) > 1 else "__init__"
    return "base" if name in BASE else name


def type_only_lines(tree: ast.AST) -> set[int]:
    """The lines of the imports inside `if TYPE_CHECKING:` blocks."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for inner in node.body:
                for sub in ast.walk(inner):
                    if isinstance(sub, (ast.Import, ast.ImportFrom)):
                        lines.add(sub.lineno)
    return lines


def imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "caldera":
            if node.module == "caldera":
                yield from ((f"caldera.{alias.name}", node.lineno) for alias in node.names)
            else:
                yield node.module, node.lineno
        elif isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names if alias.name.split(".")[0] == "caldera")


def test_imports_only_go_down():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        me = layer_of(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
        typing_only = type_only_lines(ast.parse(path.read_text(encoding="utf-8")))
        for target, line in imports(path):
            if target in TYPE_ONLY_UP and line in typing_only:
                continue
            other = layer_of(target)
            if other != me and other not in MAY_IMPORT[me]:
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({me}) imports {target} ({other})")
    assert wrong == []


def test_a_type_only_import_is_allowed_up_only_inside_type_checking(tmp_path):
    source = tmp_path / "handler.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    from caldera.daemon.dispatch import CommandContext\n"
                      "from caldera.daemon.dispatch import HANDLERS\n")
    tree = ast.parse(source.read_text())
    assert sorted(imports(source)) == [("caldera.daemon.dispatch", 3), ("caldera.daemon.dispatch", 4)]
    assert type_only_lines(tree) == {3}  # line 4 runs: it is still an upward import


def test_the_top_level_names_the_layers():
    # schemas: package data, no code (a link to the top-level schemas/; docs/packaging.md, "The wheel")
    entries = sorted(p.name for p in PACKAGE.iterdir() if p.name not in ("__pycache__", "schemas"))
    assert len(entries) <= 12, entries
    assert {"cli", "daemon", "protocol", "agents", "host", "skills", "backends", "plane"} <= set(entries)


def test_every_package_says_what_it_owns_and_may_import():
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        assert "May import" in doc, f"{init} does not say what it may import"


def test_the_shared_agent_modules_import_no_mode():
    """manifest, settings, window, revisions, blueprint, contract, trust (the trust boundary) and
    updates (blueprint updates in the state dir) serve every mode: the knot manifest <-> adapter
    stays untied (a mode imports them, never the other way round)."""
    shared = ("manifest", "settings", "window", "revisions", "blueprint", "contract", "trust", "updates")
    wrong = [f"{name}.py imports {target}" for name in shared
             for target, _ in imports(PACKAGE / "agents" / f"{name}.py")
             if target.startswith("caldera.agents.") and target.split(".")[2] not in shared]
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
