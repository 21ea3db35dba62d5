"""The command contract: what a handler is given, what it returns, and how a command type
maps to its handler (SPEC section 8; docs/architecture.md, "Command handlers").

A handler is a plain function `handler(ctx, payload) -> result`:
- `ctx` is its domain's context: a class with `__slots__` that extends `Call` (the command, its
  cancel, its deadline) with the few parts that domain's handlers use, nothing more. Each
  domain declares its own (agents/driver.AgentCall, agents/revisions.RevisionCall,
  skills/commands.SkillCall, backends/commands.RunCall, daemon/builtin.BuiltinCall); the
  daemon builds it per command.
- `payload` was validated against `schemas/commands/<type>.schema.json` before the call.
- it returns the finish `result` (succeeded) or raises `errors.CommandError(message,
  result=…)` (failed).

A `Route` pairs a handler with the builder of its context. The daemon, the one package that
knows every domain, holds the table of routes (daemon/dispatch.py) and binds a route per
command. A handler's module is imported when its first command arrives (`lazy_module`): a
daemon never pays for a domain it is not asked to use.
"""
from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from functools import partial
from typing import Any, Generic, TypeVar

from caldera.protocol.command import Command

Payload = dict[str, Any]
Result = dict[str, Any]
Bound = Callable[[Payload], Result]  # a handler with its context: what the command's thread calls

PartsT = TypeVar("PartsT", contravariant=True)
ContextT = TypeVar("ContextT")


class Call:
    """What every handler is given, whatever its domain.

    command:  the frozen Command parsed at fetch (protocol/command.py).
    cancel:   set when the command's timeout passes or the operator cancels; long work
              checks it, and subprocesses are killed on it.
    deadline: time.monotonic() by which the command must be finished (0.0: none).

    Plain classes with `__slots__`, not dataclasses: `dataclasses` (with `inspect`) is 1.3 MiB
    of an idle daemon's PSS (docs/performance.md, section 10). A domain's context adds its
    parts to `__slots__` and `__init__`; `fields(ctx)` names them all. Treat one as frozen:
    nothing assigns to it after it is made.
    """

    __slots__ = ("command", "cancel", "deadline")

    def __init__(self, command: Command, cancel: threading.Event, deadline: float) -> None:
        self.command = command
        self.cancel = cancel
        self.deadline = deadline


def fields(ctx: Call | type[Call]) -> tuple[str, ...]:
    """The names a context is made with, its base's first (as `dataclasses.fields` gave them)."""
    cls = ctx if isinstance(ctx, type) else type(ctx)
    return tuple(name for klass in reversed(cls.__mro__) for name in klass.__dict__.get("__slots__", ()))


Handler = Callable[[ContextT, Payload], Result]


class Route(Generic[PartsT, ContextT]):
    """One command type's way to its handler: `handler()` returns the function (importing
    its module on the first call), `context(parts, call)` builds what it is given from the
    runtime's parts. Made by `route()`, where mypy checks the pair: the handler must take
    what the builder makes."""

    __slots__ = ("context", "handler")

    def __init__(self, context: Callable[[PartsT, Call], ContextT], handler: Callable[[], Handler[ContextT]]) -> None:
        self.context = context
        self.handler = handler

    def bind(self, parts: PartsT, call: Call) -> Bound:
        """The handler given its context: what the command's thread runs with the payload."""
        handler = self.handler()
        return partial(handler, self.context(parts, call))


def route(context: Callable[[PartsT, Call], ContextT], handler: Callable[[], Handler[ContextT]]) -> Route[PartsT, Any]:
    """A Route for a table of every domain's routes. The context type is inferred from both
    arguments here, so a handler that does not take what the builder makes is a mypy error
    (a `Route(...)` written straight into a `Route[P, Any]` table would be checked against Any)."""
    return Route(context, handler)


class LazyModule:
    """A module imported on its first attribute read (thread-safe: importlib's module lock).
    Only names the daemon's route table uses go through one; their types come from the same
    modules imported under TYPE_CHECKING, so that mypy checks every route."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name}>"
