"""What a backend's run would say of the agent's secret projection, asked before any run:
`caldera check` and `caldera backends --agent NAME` print these sentences, the same a run ends
`secret-unavailable` (or `backend-failed`) with.

First the projection's owner and modes (`access`, as the run's `base.run_turn` checks them),
then the backend's own reading of it (each one's plan, as its `prepare` makes it before
anything is spawned: a missing or empty file, a config that does not parse). Only for a
backend with a projection of its own: one without is the gateway's or not configured at all,
which the backends' listing already says.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import NamedTuple

from caldera import errors
from caldera.backends import access
from caldera.backends.failures import BackendFailure
from caldera.backends.projection import Projection
from caldera.backends.registry import PROFILES, Refused, projected


class Readiness(NamedTuple):
    profile: str
    problem: str | None  # the sentence, None: the projection is usable
    warning: str | None = None  # said by `caldera check`, the run goes on (access.Findings)


def _codex(env: Mapping[str, str], secrets_dir: str | None, credentials_dir: str | None) -> None:
    from caldera.backends.codex import config

    config.plan_provider(Projection.locate(secrets_dir, credentials_dir), env)


def _claude_code(env: Mapping[str, str], secrets_dir: str | None, credentials_dir: str | None) -> None:
    from caldera.backends.claude_code import config

    config.plan_provider(Projection.locate(secrets_dir, credentials_dir, backend=config.PROFILE), env,
                         with_proxy=False)


def _opencode(env: Mapping[str, str], secrets_dir: str | None, credentials_dir: str | None) -> None:
    from caldera.backends.opencode import provider

    provider.plan_server(env, secrets_dir, credentials_dir)


# profile -> the backend's own reading of its projection (tests check it names every profile)
PLANS: dict[str, Callable[[Mapping[str, str], str | None, str | None], None]] = {
    "codex": _codex, "claude-code": _claude_code, "opencode": _opencode}


def reader(account: str | None) -> access.Reader:
    """Who will read the projection: this process, or as root the agent's account (`account`:
    the one caldera.host.privdrop makes root's agent verbs become) when that account exists."""
    if os.geteuid() == 0 and account:
        return access.Reader.named(account) or access.Reader.current()
    return access.Reader.current()


def check(env: Mapping[str, str], secrets_dir: str | None, credentials_dir: str | None,
          who: access.Reader) -> list[Readiness]:
    """One entry per profile whose projection is there (or cannot be looked at)."""
    out = []
    for profile in PROFILES:
        wrong, warning = access.findings(secrets_dir, profile, who)
        if wrong is None and not projected(profile, secrets_dir, credentials_dir):
            continue
        out.append(Readiness(profile, wrong or _planned(profile, env, secrets_dir, credentials_dir), warning))
    return out


def _planned(profile: str, env: Mapping[str, str], secrets_dir: str | None, credentials_dir: str | None) -> str | None:
    try:
        PLANS[profile](env, secrets_dir, credentials_dir)
    except (BackendFailure, Refused, errors.Refused) as exc:
        return exc.message if isinstance(exc, BackendFailure) else str(exc)
    except OSError as exc:  # a backend's own read that met what access did not see (a race)
        return f"{exc.filename or 'the projection'}: {exc.strerror}"
    return None
