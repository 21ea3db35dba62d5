"""dispatch.py's `_CHECKED` table (inside `if TYPE_CHECKING:`, never run) is how mypy checks
every handler against `Handler`; it must name exactly the handlers HANDLERS resolves."""
import ast
from pathlib import Path

from caldera.daemon import dispatch

SOURCE = Path(dispatch.__file__).read_text(encoding="utf-8")


def checked_table(source: str) -> dict[str, str]:
    """`_CHECKED`'s entries as HANDLERS spells them ("module:function"), read from the AST."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            aliases: dict[str, str] = {}
            for inner in node.body:
                if isinstance(inner, ast.ImportFrom):
                    aliases.update({a.asname or a.name: f"{inner.module}.{a.name}" for a in inner.names})
                elif (isinstance(inner, ast.AnnAssign) and isinstance(inner.target, ast.Name)
                      and inner.target.id == "_CHECKED"):
                    assert isinstance(inner.value, ast.Dict)
                    table = {}
                    for key, value in zip(inner.value.keys, inner.value.values, strict=True):
                        assert isinstance(key, ast.Constant) and isinstance(value, ast.Attribute)
                        assert isinstance(value.value, ast.Name)
                        table[key.value] = f"{aliases[value.value.id]}:{value.attr}"
                    return table
    raise AssertionError("dispatch.py has no _CHECKED table under `if TYPE_CHECKING:`")


def test_the_checked_table_names_every_handler_as_handlers_does():
    assert checked_table(SOURCE) == dispatch.HANDLERS


def test_a_handler_missing_from_the_checked_table_is_seen():
    source = SOURCE.replace('        "agent_interrupt": backend_commands.agent_interrupt,\n', "")
    assert checked_table(source) != dispatch.HANDLERS
