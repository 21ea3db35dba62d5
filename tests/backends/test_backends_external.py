"""CALDERA_RUN_SANDBOX=external: the container is the sandbox (docs/container.md, "Code agents
where user namespaces are forbidden").

The setting's reading and its refusal off a container (unit), then every real CLI (the
drivers of the contract suite, each against its own fake provider) where bubblewrap cannot
start, simulated by a `bwrap` first on PATH that fails as one without user namespaces does:
with the setting the agent's command runs and every `backend_status` says `external`; without
it, the same command does not run (nothing widens).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_backends_contract import (  # noqa: F401 -- the contract suite's fixtures: each real CLI, closed at the end
    Turn,
    _drivers_closed,
    driver,
)

from caldera import config
from caldera.backends import confine as shared
from caldera.backends import registry, service
from caldera.backends.base import Policy
from caldera.backends.claude_code import config as cc
from caldera.backends.codex.backend import sandbox_policy
from caldera.backends.opencode import confine
from caldera.backends.opencode import policy as oc_policy
from caldera.backends.registry import Refused
from caldera.daemon.governance import run_confinement
from caldera.daemon.startnotes import run_sandbox_problem
from caldera.errors import ConfigError
from caldera.host import container

MARK = "ran-$((6*7))-outside"  # the command; its output, below, is only there if it ran
RAN = "ran-42-outside"
CONTAINER = {"container": "ci"}  # what nspawn and Podman put in the environment


@pytest.fixture(autouse=True)
def _a_container(monkeypatch):
    """The runtime's own environment says container= (as nspawn's and Podman's do): an
    agent's env (CONTAINER in agent.env) no longer counts (issue 43 review F5)."""
    monkeypatch.setenv("container", "ci")


# ---------------------------------------------------------------- the setting

@pytest.mark.parametrize("raw, external", [(None, False), ("", False), (" ", False), ("external", True),
                                           ("External ", True)])
def test_the_setting_is_external_or_nothing(raw, external):
    env = {} if raw is None else {"CALDERA_RUN_SANDBOX": raw}
    assert config.run_sandbox_external(env) is external


@pytest.mark.parametrize("raw", ["none", "off", "true", "bubblewrap"])
def test_any_other_value_is_a_sentence_naming_the_variable(raw):
    with pytest.raises(ConfigError, match=f"CALDERA_RUN_SANDBOX='{raw}': the only value is 'external'"):
        config.run_sandbox_external({"CALDERA_RUN_SANDBOX": raw})
    with pytest.raises(Refused, match="the only value is 'external'"):
        registry.confinement({"CALDERA_RUN_SANDBOX": raw})


def test_external_is_refused_on_a_host_that_is_not_a_container(monkeypatch):
    monkeypatch.setattr(container, "evidence", lambda environ=None, root="/": None)
    env = {"CALDERA_RUN_SANDBOX": "external", "CALDERA_WORKSPACE_ROOTS": "/srv"}
    with pytest.raises(Refused, match="this host is not a container .*: remove it"):
        registry.confinement(env)
    # every workspace-write run is blocked with that sentence, and so is a read-only one: the
    # setting is wrong for the host, whatever the run asks
    with pytest.raises(Refused, match="not a container"):
        service.policy_from_request({"sandbox": "workspace-write"}, env)
    assert run_confinement(env) == {"code_agent_confinement": "refused"}


def test_caldera_run_says_it_once_at_start(monkeypatch):
    assert run_sandbox_problem({}) is None
    assert run_sandbox_problem({"CALDERA_RUN_SANDBOX": "external", **CONTAINER}) is None
    assert "the only value is 'external'" in run_sandbox_problem({"CALDERA_RUN_SANDBOX": "on"})
    monkeypatch.setattr(container, "evidence", lambda environ=None, root="/": None)
    assert "this host is not a container" in run_sandbox_problem({"CALDERA_RUN_SANDBOX": "external"})


def test_external_on_a_container_widens_only_workspace_write_runs():
    env = {"CALDERA_RUN_SANDBOX": "external", **CONTAINER}
    assert registry.confinement(env) == "external"
    policy = service.policy_from_request({}, env)
    assert policy.external and policy.as_dict()["confinement"] == "external"
    read_only = service.policy_from_request({"sandbox": "read-only"}, env)
    assert not read_only.external and read_only.as_dict()["confinement"] == "backend"


def test_without_the_setting_nothing_widens():
    for env in ({}, CONTAINER, {"CALDERA_RUN_SANDBOX": ""}):
        assert registry.confinement(env) == "backend"
        assert not service.policy_from_request({}, env).external
    assert run_confinement({"CALDERA_WORKSPACE_ROOTS": "/srv"}) == {"code_agent_confinement": "backend"}
    assert run_confinement({}) == {}  # no workspace roots: no run can start, nothing said


def test_the_report_says_external():
    env = {"CALDERA_RUN_SANDBOX": "external", "CALDERA_WORKSPACE_ROOTS": "/srv", **CONTAINER}
    assert run_confinement(env) == {"code_agent_confinement": "external"}


# ---------------------------------------------------------------- each backend's part

def test_codex_is_sent_external_sandbox_only_for_an_external_run():
    assert sandbox_policy(Policy(60)) is None
    assert sandbox_policy(Policy(60, external=True)) == {"type": "externalSandbox", "networkAccess": "restricted"}
    assert sandbox_policy(Policy(60, network=True, external=True))["networkAccess"] == "enabled"


def test_claude_codes_sandbox_is_off_only_for_an_external_run():
    confined = cc.confine(["/secrets"], ["/w"])
    own = cc.policy_settings(Policy(60), "/w", confined, {})
    assert own["sandbox"]["enabled"] is True and own["sandbox"]["failIfUnavailable"] is True
    assert own["permissions"]["allow"] == []
    external = cc.policy_settings(Policy(60, external=True), "/w", confined, {})
    assert external["sandbox"] == {"enabled": False} and external["permissions"]["allow"] == ["Bash"]
    assert external["permissions"]["deny"] == own["permissions"]["deny"]  # the file tools' rules stay


def test_opencode_allows_bash_unconfined_only_for_an_external_run(tmp_path):
    external = Policy(60, external=True)
    assert "CALDERA_RUN_SANDBOX=external" in oc_policy.commands(external, confined=True)
    assert {"permission": "bash", "pattern": "*", "action": "deny"} not in oc_policy.rules(external, True)
    assert {"permission": "bash", "pattern": "*", "action": "deny"} in oc_policy.rules(Policy(60), False)
    wrapper = confine.unconfined_wrapper("/usr/bin:/bin")
    assert "unset OPENCODE_SERVER_PASSWORD OPENCODE_SERVER_USERNAME" in wrapper and "bwrap" not in wrapper
    script = tmp_path / "bash"
    script.write_text(wrapper)
    script.chmod(0o700)
    out = subprocess.run([str(script), "-c", "echo ${OPENCODE_SERVER_PASSWORD:-none}"], capture_output=True,
                         text=True, env={"OPENCODE_SERVER_PASSWORD": "pw", "PATH": "/usr/bin:/bin"}, check=True)
    assert out.stdout == "none\n"


def test_roots_bubblewrap_takes_a_user_namespace_only_where_it_needs_one(monkeypatch):
    tried = []

    def works(bwrap, true, userns=()):
        tried.append(userns)
        return userns == ("--unshare-user",)

    monkeypatch.setattr(shared, "works", works)
    monkeypatch.setattr(shared, "nests", lambda bwrap, true, userns=(): True)
    monkeypatch.setattr(shared.os, "geteuid", lambda: 0)
    assert shared.userns_here("/usr/bin/bwrap", "/bin/true") == ("--unshare-user",)
    assert tried == [(), ("--unshare-user",)]
    monkeypatch.setattr(shared.os, "geteuid", lambda: 1000)  # any other uid gets one anyway: one probe
    tried.clear()
    assert shared.userns_here("/usr/bin/bwrap", "/bin/true") is None and tried == [()]
    sandbox = confine.Confinement(bwrap="/usr/bin/bwrap", shell="/bin/bash", roots=(), covered=(), hidden=(),
                                  network=False, server=True, userns=("--unshare-user",))
    before, _ = sandbox.argv("/srv/s")
    assert before[:2] == ["/usr/bin/bwrap", "--unshare-user"]
    assert sandbox.server_argv("/srv/s", "/usr/bin/opencode")[:2] == ["/usr/bin/bwrap", "--unshare-user"]


# ---------------------------------------------------------------- what says "container"

def _root(tmp_path: Path, pid1_cmdline: bytes = b"/sbin/init\0", pid1_env: bytes = b"") -> Path:
    (tmp_path / "proc" / "1").mkdir(parents=True)
    (tmp_path / "proc" / "1" / "cmdline").write_bytes(pid1_cmdline)
    (tmp_path / "proc" / "1" / "environ").write_bytes(pid1_env)
    (tmp_path / "run" / "systemd").mkdir(parents=True)
    return tmp_path


def test_a_plain_host_is_no_container(tmp_path):
    assert container.evidence({}, str(_root(tmp_path))) is None


@pytest.mark.parametrize("marker, said", [("run/systemd/container", "/run/systemd/container (systemd's)"),
                                          (".dockerenv", "/.dockerenv (Docker's)"),
                                          ("run/.containerenv", "/run/.containerenv (Podman's)")])
def test_a_container_runtimes_mark_says_container(tmp_path, marker, said):
    root = _root(tmp_path)
    (root / marker).write_text("")
    assert container.evidence({}, str(root)) == said


def test_the_environment_pid_1_and_kubernetes_say_container(tmp_path):
    root = str(_root(tmp_path, pid1_env=b"PATH=/bin\0container=systemd-nspawn\0"))
    assert container.evidence({}, root) == "container=systemd-nspawn in PID 1's environment"
    assert container.evidence({"container": "podman"}, root) == "container=podman in the environment"
    plain = str(_root(tmp_path / "b"))
    assert container.evidence({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, plain) == \
        "KUBERNETES_SERVICE_HOST (a Kubernetes pod)"


@pytest.mark.parametrize("argv", [b"caldera\0run\0", b"/usr/bin/python3\0/usr/bin/caldera\0run\0"])
def test_caldera_run_as_pid_1_says_container(tmp_path, argv):
    assert container.evidence({}, str(_root(tmp_path, argv))) == "caldera run is PID 1"


def test_caldera_run_under_systemd_is_no_container(tmp_path):
    root = _root(tmp_path, b"/lib/systemd/systemd\0--system\0")
    assert container.evidence({}, str(root)) is None


# ---------------------------------------------------------------- the real CLIs

NO_NAMESPACES = Path(__file__).resolve().parents[2] / ".ci" / "no-namespaces.py"


def _no_bwrap(tmp: Path) -> dict[str, str]:
    """A PATH whose `bwrap` fails as bubblewrap does where user namespaces are forbidden (for
    the runtime's own look at it: OpenCode's)."""
    bin_dir = tmp / "fakebin"
    bin_dir.mkdir()
    fake = bin_dir / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: Creating new namespace failed: Operation not permitted' >&2\nexit 1\n")
    fake.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}


def _forbidden(tmp: Path, binary: str | None) -> str | None:
    """The CLI under Docker's default seccomp filter (.ci/no-namespaces.py): no namespace can
    be made by it or anything it starts, so no bubblewrap of its own (Codex's bundled one
    included) starts either."""
    if binary is None or binary.endswith("/opencode"):
        return binary  # it has no sandbox of its own: the runtime's look at bwrap (the PATH above) decides
    wrapper = tmp / "cli-without-namespaces"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {NO_NAMESPACES} {binary} \"$@\"\n")
    wrapper.chmod(0o755)
    return str(wrapper)


def _outputs(turn: Turn) -> str:
    return "\n".join(str(o.get("output") or "") for o in turn.of("command_output"))


def test_external_runs_the_command_where_bubblewrap_cannot_start(driver, tmp_path):
    env = {**_no_bwrap(tmp_path), "CALDERA_RUN_SANDBOX": "external", **CONTAINER}
    turn = Turn(driver, tmp_path, [driver.command(f"echo {MARK}"), driver.text("done")], extra_env=env,
                binary=_forbidden(tmp_path, driver.binary()))
    assert turn.terminal["status"] == "completed", turn.events
    assert RAN in _outputs(turn), turn.events
    starting = next(s for s in turn.of("backend_status") if s["phase"] == "starting")
    assert starting["policy"]["confinement"] == "external"
    if driver.profile != "claude-code":  # it says no `commands`; those who do name /proc/1/environ (F4)
        assert "/proc/1/environ" in starting["commands"] and "CLAWMANAGER_LLM_API_KEY" in starting["commands"]
    turn.assert_no_leak()


def test_without_the_setting_the_command_does_not_run_where_bubblewrap_cannot_start(driver, tmp_path):
    turn = Turn(driver, tmp_path, [driver.command(f"echo {MARK}"), driver.text("done")],
                extra_env={**_no_bwrap(tmp_path), **CONTAINER}, binary=_forbidden(tmp_path, driver.binary()))
    assert RAN not in _outputs(turn), turn.events
    starting = next(s for s in turn.of("backend_status") if s["phase"] == "starting")
    assert starting["policy"]["confinement"] == "backend"
    turn.assert_nothing_left(Path(turn.result["log"]).read_text())


def test_an_agents_env_saying_container_does_not_make_the_host_one(monkeypatch, tmp_path):
    """agent.env is the agent's configuration: its container= or KUBERNETES_SERVICE_HOST must
    not take the commands out of every sandbox on a host that is not a container."""
    monkeypatch.delenv("container")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    real, plain = container.evidence, str(_root(tmp_path))
    monkeypatch.setattr(container, "evidence", lambda environ=None, root="/": real(environ, plain))
    agent_env = {"CALDERA_RUN_SANDBOX": "external", "KUBERNETES_SERVICE_HOST": "10.0.0.1", **CONTAINER}
    with pytest.raises(Refused, match="this host is not a container"):
        registry.confinement(agent_env)
    monkeypatch.setenv("container", "ci")  # the runtime's own environment: it is one
    assert registry.confinement(agent_env) == registry.CONFINEMENT_EXTERNAL


def test_external_a_commands_setsid_child_does_not_outlive_the_run(driver, tmp_path):
    """No sandbox's pid namespace in external mode: a `setsid` child leaves the CLI's process
    group, and a reaper of the run's own ends it at the run's end (OpenCode's server, which
    outlives runs, is the documented exception: docs/container.md)."""
    if driver.profile == "opencode":
        pytest.skip("OpenCode's server outlives the run: its commands' leftovers go with it (docs/container.md)")
    pidfile = tmp_path / "ws" / "left.pid"
    script = f"setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $! > {pidfile.name}; echo {MARK}"
    env = {**_no_bwrap(tmp_path), "CALDERA_RUN_SANDBOX": "external", **CONTAINER}
    turn = Turn(driver, tmp_path, [driver.command(script), driver.text("done")], extra_env=env,
                binary=_forbidden(tmp_path, driver.binary()))
    assert turn.terminal["status"] == "completed", turn.events
    assert RAN in _outputs(turn), turn.events
    pid = int(pidfile.read_text())
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        state = "gone"
    if state != "gone":
        os.kill(pid, 9)
    assert state in ("gone", "Z"), state
