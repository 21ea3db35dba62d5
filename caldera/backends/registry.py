"""What the daemon needs of the backends before any run: the profile names, the
capabilities they give `register`, and the registry of the runs going on now.

Light on purpose (no backend, no TOML parser, no event or failure tables): a daemon
that never gets an `agent_run` imports only this module of the backends; the rest
(base, service, codex_config with tomllib, events, failures, runlog) waits for the
first run (what that saves: docs/performance.md, section 2). `base` and `service`
re-export these names.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from caldera.config import llm_gateway

DEFAULT_PROFILE = "codex"
# profile name -> "module:Class"; the class is imported only when a run needs it.
PROFILES = {"codex": "caldera.backends.codex:CodexBackend",
            "opencode": "caldera.backends.opencode.driver:OpenCodeBackend"}


class Refused(Exception):
    """The request is wider than the agent's configured policy, or otherwise not allowed."""


def gateway_settings(environ: Mapping[str, str]) -> dict[str, Any] | None:
    found = llm_gateway(environ)
    if not (found["base_url"] and found["api_key"]):
        return None
    return found


def capabilities(env: Mapping[str, str] | None = None) -> list[str]:
    """Capability strings for `register.capabilities` (cheap: no process is started)."""
    env = os.environ if env is None else env
    caps = ["agent.run", "agent.interrupt"]
    for name in PROFILES:
        caps.append(f"backend.{name}")

    if gateway_settings(env) is not None:
        caps.append("llm.gateway")
    return caps


class LiveRun(Protocol):
    """A run going on now, as the registry sees it (`service.RunHandle` is one): its id, and the
    interrupt that reaches its backend (at once, or as soon as the turn is prepared)."""

    @property
    def run_id(self) -> str: ...

    def interrupt(self) -> None: ...


QUEUED_KEPT = 1000  # accepted runs not yet started that are remembered (oldest forgotten first)


class ActiveRuns:
    """run_id -> handle, so that agent_interrupt reaches a running agent_run; and the runs
    accepted but not started yet (queued behind another run, or between the command's start
    and the turn's), so that an interrupt sent then is not lost: the run is interrupted as
    soon as it starts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, LiveRun] = {}
        self._queued: dict[str, bool] = {}  # run_id -> interrupted before it started
        self.events_dropped = 0  # run events the plane never got (it was away too long)

    def queue(self, run_id: object) -> None:
        """An agent_run with this id was accepted (journaled); its turn has not started."""
        if not isinstance(run_id, str):
            return
        with self._lock:
            self._queued.setdefault(run_id, False)
            while len(self._queued) > QUEUED_KEPT:
                self._queued.pop(next(iter(self._queued)))

    def forget(self, run_id: object) -> None:
        """The run's command is finished: whatever it did, nothing waits for it any more."""
        if not isinstance(run_id, str):  # never queued
            return
        with self._lock:
            self._queued.pop(run_id, None)

    def interrupt(self, run_id: str) -> str | None:
        """'running' or 'queued' when the interrupt reached the run (now, or at its start);
        None when no such run is running or waiting here."""
        with self._lock:
            handle = self._runs.get(run_id)
            if handle is None and run_id in self._queued:
                self._queued[run_id] = True
                return "queued"
        if handle is None:
            return None
        handle.interrupt()
        return "running"

    def count_dropped(self, n: int) -> None:
        with self._lock:
            self.events_dropped += n

    def add(self, handle: LiveRun) -> None:
        with self._lock:
            if handle.run_id in self._runs:
                raise Refused(f"run {handle.run_id} is already running")
            self._runs[handle.run_id] = handle
            early = self._queued.pop(handle.run_id, False)
        if early:  # interrupted while it waited: the turn is interrupted as soon as it is prepared
            handle.interrupt()

    def remove(self, run_id: str) -> None:
        with self._lock:
            self._runs.pop(run_id, None)

    def get(self, run_id: str) -> LiveRun | None:
        with self._lock:
            return self._runs.get(run_id)
