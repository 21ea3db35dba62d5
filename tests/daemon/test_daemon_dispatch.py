"""The daemon's table of routes (daemon/dispatch.py): every command type reaches a handler
that takes the context its route builds, each domain's module is imported only by its first
command, and an unknown type is refused with the sentence the plane sees."""
import inspect
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from core_helpers import install_agent, make_parts

from caldera.daemon import dispatch
from caldera.errors import CommandError
from caldera.protocol import schemas
from caldera.protocol.command import parse_command
from caldera.protocol.handlers import Call, fields

ROOT = Path(__file__).resolve().parents[2]


def call(command_type):
    return Call(parse_command({"id": 1, "command_type": command_type}), threading.Event(), 0.0)


def test_every_route_binds_its_handler_to_the_context_it_takes(caldera_env):
    """Each route's handler, once imported, is a function of (context, payload) whose context
    parameter is the type the route's builder makes from a real runtime's parts; only the
    parts that domain uses are in it."""
    install_agent(caldera_env)
    parts = make_parts()
    try:
        table = dispatch.routes()
        for command_type, route in table.items():
            assert schemas.schema_exists(dispatch.schema_name(command_type)), command_type
            handler = route.handler()
            context = route.context(parts, call(command_type))
            assert list(inspect.signature(handler).parameters) == ["ctx", "payload"], command_type
            annotation = inspect.signature(handler).parameters["ctx"].annotation
            assert annotation == type(context).__name__, (command_type, annotation)
            assert isinstance(context, Call) and context.command.type == command_type
            assert len(fields(context)) <= 10, (command_type, type(context))
    finally:
        parts.pool.shutdown(wait=False)


def test_an_unknown_type_is_refused_naming_it(caldera_env):
    install_agent(caldera_env)
    parts = make_parts()
    try:
        with pytest.raises(CommandError, match="^unsupported command type: no_such_thing$"):
            dispatch.binder(parts)(call("no_such_thing"))
    finally:
        parts.pool.shutdown(wait=False)


def test_every_route_in_the_table_is_made_by_route():
    """`route()` is where mypy checks a handler against its context; a `Route(...)` written
    into the table (typed Route[Parts, Any]) would be checked against Any."""
    import ast

    source = Path(dispatch.__file__).read_text(encoding="utf-8")
    [table] = [node for node in ast.walk(ast.parse(source))
               if isinstance(node, ast.FunctionDef) and node.name == "routes"]
    [returned] = [node.value for node in ast.walk(table) if isinstance(node, ast.Return)]
    assert isinstance(returned, ast.Dict) and len(returned.values) == len(dispatch.routes())
    made = [ast.unparse(value.func) for value in returned.values if isinstance(value, ast.Call)]
    assert made == ["route"] * len(returned.values)


def test_the_table_imports_no_domain_until_its_first_command():
    """Building the table leaves the domains' handler modules unimported; a skill command's
    route, once its handler is looked up, imports the skills' module and no other."""
    probe = """
import sys, threading
from types import SimpleNamespace
from caldera.daemon import dispatch
from caldera.protocol import schemas
from caldera.protocol.command import parse_command
from caldera.protocol.handlers import Call
DOMAINS = ("caldera.agents.revisions", "caldera.agents.adapter.commands", "caldera.agents.process.commands",
           "caldera.backends.commands", "caldera.skills.commands")
table = dispatch.routes()
print(sorted(m for m in DOMAINS if m in sys.modules))
table["install_skill"].handler()
print(sorted(m for m in DOMAINS if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["[]", "['caldera.skills.commands']"]
