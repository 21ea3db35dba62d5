"""Starting the agent once: its files, its environment (built from nothing), its account,
then `proc.spawn` (argv, own process group, stdout+stderr on one pipe)."""
from __future__ import annotations

import logging
import os
import pwd

from caldera import TYPE_CHECKING
from caldera.agents.process import environment, files
from caldera.agents.process.supervisor import LaunchError
from caldera.config import merged_env
from caldera.errors import ConfigError
from caldera.host import proc

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Mapping
    from typing import Protocol

    from caldera.agents.process.spec import ProcessSpec
    from caldera.config import AgentPaths
    from caldera.redact import Redactor

    class LaunchState(Protocol):
        """What a launch reads of its driver as it is now: the spec (a blueprint update
        replaces it) and the redactor the agent's secret values are added to."""

        @property
        def spec(self) -> ProcessSpec: ...

        @property
        def redactor(self) -> Redactor: ...

log = logging.getLogger("caldera.agents.process")


def account_ids(name: str | None) -> tuple[int, int] | None:
    """(uid, gid) of the account to run as, or None to run as the runtime's own user."""
    if name is None:
        return None
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise LaunchError(f"account {name!r}: no such user on this host") from None
    if entry.pw_uid == os.geteuid():
        return None
    if os.geteuid() != 0:
        raise LaunchError(f"account {name!r}: the runtime runs as uid {os.geteuid()}, not root, "
                          "so it can't start the agent as another user")
    return entry.pw_uid, entry.pw_gid


class Launcher:
    """launch() -> Popen; what the last launch learned (secret values, problems) stays readable."""

    def __init__(self, state: LaunchState, paths: AgentPaths, *, environ: Mapping[str, str] = os.environ) -> None:
        self.state, self.paths, self.environ = state, paths, environ
        self.problems: list[str] = []

    def __call__(self) -> subprocess.Popen[bytes]:
        spec = self.state.spec
        if not spec.workdir.is_dir():
            raise LaunchError(f"runtime.workdir {spec.workdir} does not exist")
        owner = account_ids(spec.account)
        try:
            runtime_env, secrets_env = merged_env(self.paths, self.environ)
        except (OSError, ConfigError) as exc:
            raise LaunchError(f"secrets.env/agent.env can't be read: {exc}") from None
        try:
            agent_files = files.prepare(spec, self.paths.state_dir, owner)
        except OSError as exc:
            raise LaunchError(f"the agent's files can't be made: {exc}") from None
        built = environment.build_env(spec, agent_name=spec.name, files=agent_files, runtime_env=runtime_env,
                                      secrets_env=secrets_env, secrets_dir=self.paths.secrets_dir,
                                      environ=self.environ)
        for value in built.secret_values:
            self.state.redactor.add(value)
        self.problems = built.problems
        for problem in built.problems:
            log.warning("%s", problem)
        try:
            return proc.spawn(list(spec.command), env=built.env, cwd=str(spec.workdir),
                              user=owner[0] if owner else None, group=owner[1] if owner else None)
        except (OSError, ValueError) as exc:
            raise LaunchError(f"{spec.command[0]}: {getattr(exc, 'strerror', None) or exc}") from None
