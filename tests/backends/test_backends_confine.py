"""caldera's bubblewrap around Codex's app-server (backends/confine.py, codex/sandbox.py) and
what the state report says of it, without the real CLI (test_backends_containment.py runs the
real CLIs against it)."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest
from backends_helpers import environment, execute, mock_binary, of_type, request, workspace, write_projection

from caldera import config
from caldera.backends import base, confine, registry
from caldera.backends import failures as fk
from caldera.backends.codex import sandbox
from caldera.daemon.governance import SandboxHealth
from caldera.redact import Redactor


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def _bwrap_works() -> bool:
    return confine.unavailable(os.environ.get("PATH", "/usr/bin:/bin")) is None


def test_the_box_covers_the_roots_and_binds_back_only_the_run_and_its_workspace(tmp_path):
    etc, var = tmp_path / "etc", tmp_path / "var"
    (etc / "agents" / "a1" / "secrets").mkdir(parents=True)
    (var / "a1" / "runs" / "r1").mkdir(parents=True)
    (var / "a1" / "session.json").write_text("{}")
    ws = tmp_path / "ws"
    ws.mkdir()
    env = base.Environment(redactor=Redactor(), logs_dir=str(var / "a1" / "logs"), runs_dir=str(var / "a1" / "runs"),
                           secrets_dir=str(etc / "agents" / "a1" / "secrets"), config_root=str(etc),
                           state_root=str(var))
    box = confine.Box("/usr/bin/bwrap", tuple(confine.runtime_roots(env.config_root, env.state_root, None)),
                      tuple(confine.private_paths(env.secrets_dir, str(var / "a1"), None)), flags=sandbox.FLAGS)
    run = SimpleNamespace(workspace=str(ws), policy=SimpleNamespace(sandbox="workspace-write"))
    argv = sandbox.argv(box, run, var / "a1" / "runs" / "r1", ["/opt/codex/bin/codex", "app-server"])
    assert argv[-3:] == ["--", "/opt/codex/bin/codex", "app-server"]
    assert "--unshare-pid" in argv and "--die-with-parent" in argv and "--unshare-net" not in argv
    assert "--cap-drop" not in argv  # Codex's own bubblewrap nests in it
    tmpfs = _pairs(argv, "--tmpfs")
    assert {"/tmp", "/var/tmp", "/run", str(var / "a1")} <= set(tmpfs)  # the roots: in /tmp here, covered by it
    assert _pairs(argv, "--bind") == [str(ws), str(var / "a1" / "runs" / "r1")]
    assert argv.index(str(var / "a1" / "runs" / "r1")) > max(i for i, a in enumerate(argv) if a == "--tmpfs")
    read_only = SimpleNamespace(workspace=str(ws), policy=SimpleNamespace(sandbox="read-only"))
    argv = sandbox.argv(box, read_only, var / "a1" / "runs" / "r1", ["/opt/codex/bin/codex", "app-server"])
    assert _pairs(argv, "--bind") == [str(var / "a1" / "runs" / "r1")] and str(ws) in _pairs(argv, "--ro-bind")


def test_a_bind_that_holds_a_root_or_a_secret_hides_it_again(tmp_path):
    """A workspace (or the binary's dir) above the state root: the root is covered again after
    it, and the run's dir inside that root bound after that."""
    state = tmp_path / "srv" / "state"
    (state / "a1" / "runs" / "r1").mkdir(parents=True)
    box = confine.Box("/usr/bin/bwrap", (str(state),), (str(state / "a1"),))
    argv = box.argv([str(tmp_path / "srv"), str(state / "a1" / "runs" / "r1")])
    order = [(argv[i], argv[i + 1]) for i in range(len(argv) - 1) if argv[i] in ("--bind", "--tmpfs")]
    assert order[-3:] == [("--bind", str(tmp_path / "srv")), ("--tmpfs", str(state)),
                          ("--bind", str(state / "a1" / "runs" / "r1"))]


def test_other_agents_workspace_roots_are_found_in_their_agent_env_less_this_agents_own(tmp_path):
    """Issue 41: the roots every agent.env under the config root names; this agent's own and a
    root both share are left out, as are a root that is not there, `/` and a broken agent.env."""
    etc = tmp_path / "etc"
    roots = {name: tmp_path / "ws" / name for name in ("me", "b", "c", "shared")}
    for path in roots.values():
        path.mkdir(parents=True)
    envs = {"me": f"CALDERA_WORKSPACE_ROOTS={roots['me']}:{roots['shared']}\n",
            "b": f"CALDERA_WORKSPACE_ROOTS={roots['b']}:{roots['shared']}:/:{tmp_path}/gone\n",
            "c": f"X=1\nCALDERA_WORKSPACE_ROOTS='{roots['c']}'\n", "broken": "not a line\n"}
    for name, text in envs.items():
        (etc / "agents" / name).mkdir(parents=True)
        (etc / "agents" / name / "agent.env").write_text(text)
    found = confine.other_workspace_roots(str(etc), [str(roots["me"]), str(roots["shared"])])
    assert found == sorted([str(roots["b"]), str(roots["c"])])
    assert confine.other_workspace_roots(None, []) == []
    assert confine.other_workspace_roots(str(tmp_path / "no"), []) == []


@pytest.fixture
def warnings():
    """The warnings caldera.backends logs (a handler of its own: another test may stop propagation)."""
    said: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("caldera.backends").addHandler(handler)
    yield said
    logging.getLogger("caldera.backends").removeHandler(handler)


def _hostile(tmp_path, make) -> tuple[str, str]:
    """A config root with agent `good` (its root a dir) and agent `bad`, whose agent.env `make`
    makes: (the config root, good's root)."""
    etc, good = tmp_path / "etc", tmp_path / "ws" / "good"
    good.mkdir(parents=True)
    for name in ("good", "bad"):
        (etc / "agents" / name).mkdir(parents=True)
    (etc / "agents" / "good" / "agent.env").write_text(f"CALDERA_WORKSPACE_ROOTS={good}\n")
    make(etc / "agents" / "bad" / "agent.env")
    return str(etc), str(good)


def _soon(call, timeout: float = 5.0):
    """call() in a thread: its result, or AssertionError where it is still running after `timeout`."""
    done: list = []
    worker = threading.Thread(target=lambda: done.append(call()), daemon=True)
    worker.start()
    worker.join(timeout)
    assert done, f"still running after {timeout} s"
    return done[0]


def test_another_agents_agent_env_that_is_a_fifo_is_passed_over_at_once(tmp_path, warnings):
    """rev41b: a FIFO blocked open() for good, and every run of every agent with it."""
    etc, good = _hostile(tmp_path, os.mkfifo)
    assert _soon(lambda: confine.other_workspace_roots(etc, [])) == [good]
    assert [w for w in warnings if "bad/agent.env cannot be read (" in w and "not a regular file" in w]


def test_another_agents_agent_env_that_is_dev_zero_or_huge_is_read_with_a_limit(tmp_path, warnings):
    """rev41b: a link to /dev/zero was read whole (in a child with 300 MB of address space: no
    MemoryError); one over 64 KiB is passed over; a link to a regular file is read as before."""
    etc, good = _hostile(tmp_path, lambda p: p.symlink_to("/dev/zero"))
    code = ("import resource\nresource.setrlimit(resource.RLIMIT_AS, (300 << 20, 300 << 20))\n"
            f"from caldera.backends.confine import other_workspace_roots as o\nprint(o({etc!r}, []))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert (done.returncode, done.stdout.strip()) == (0, str([good])), done.stderr[-300:]
    big, linked = tmp_path / "big", tmp_path / "ws" / "linked"
    linked.mkdir()
    big.write_text(f"CALDERA_WORKSPACE_ROOTS={tmp_path / 'ws'}\n" + "#" * (64 * 1024) + "\n")
    env = tmp_path / "etc" / "agents" / "bad" / "agent.env"
    env.unlink()
    env.symlink_to(big)
    assert confine.other_workspace_roots(etc, []) == [good]
    assert [w for w in warnings if "bad/agent.env cannot be read (" in w and "larger than 65536" in w]
    big.write_text(f"CALDERA_WORKSPACE_ROOTS={linked}\n")
    assert confine.other_workspace_roots(etc, []) == sorted([good, str(linked)])


def test_a_nul_byte_or_a_relative_root_in_another_agents_agent_env_is_passed_over(tmp_path):
    """rev41b: os.path.realpath raised ValueError on the NUL, and every run of this agent failed."""
    other = tmp_path / "ws" / "other"
    etc, good = _hostile(tmp_path, lambda p: p.write_bytes(
        b"CALDERA_WORKSPACE_ROOTS=/srv/a\x00b:ws/rel:" + str(other).encode() + b"\n"))
    other.mkdir()
    assert confine.other_workspace_roots(etc, []) == sorted([good, str(other)])


def test_another_agents_agent_env_this_account_cannot_read_is_said_once(tmp_path, warnings, monkeypatch):
    """rev41b: with one account per agent (agent.env root:GROUP 0640) the roots it names were
    left readable in silence; now a warning says so, once per file in a process. (As root,
    which reads a file of mode 000, opening it is made to fail as it would for an account.)"""
    etc, good = _hostile(tmp_path, lambda p: (p.write_text("CALDERA_WORKSPACE_ROOTS=/srv\n"), p.chmod(0)))
    if os.geteuid() == 0:
        real_open = os.open

        def denied(path, flags, *args):
            if str(path).endswith("bad/agent.env"):
                raise PermissionError(13, "Permission denied", path)
            return real_open(path, flags, *args)
        monkeypatch.setattr(os, "open", denied)
    assert confine.other_workspace_roots(etc, []) == [good]
    assert confine.other_workspace_roots(etc, []) == [good]
    said = [w for w in warnings if "bad/agent.env cannot be read (Permission denied)" in w]
    assert len(said) == 1 and "not hidden from this agent's commands" in said[0], warnings


def test_a_system_dir_or_one_holding_the_binary_is_never_hidden_as_another_agents_root(tmp_path, warnings):
    """rev41b: another agent naming /usr (or the CLI's dir) hid bash or the CLI from every other
    agent's runs; such a root is left visible, said once per (file, root)."""
    cli = tmp_path / "opt" / "cli" / "bin" / "cli"
    cli.parent.mkdir(parents=True)
    cli.write_text("")
    named = ["/", "/usr", "/etc/ssl", "/var", "/lib", str(tmp_path / "opt"), os.path.dirname(sys.executable)]
    etc, good = _hostile(tmp_path, lambda p: p.write_text(f"CALDERA_WORKSPACE_ROOTS={':'.join(named)}\n"))
    for _ in range(2):
        assert confine.other_workspace_roots(etc, [], [str(cli)]) == [good]
    said = [w for w in warnings if "bad/agent.env names " in w]
    assert len(said) == len({os.path.realpath(p) for p in named}), said
    assert any(f"holds {cli}" in w for w in said) and any("/usr as a workspace root" in w for w in said)
    assert confine.kept_because("/var/lib/caldera/ws", []) is None  # a root below /var is a workspace's


def test_the_box_covers_other_agents_roots_and_binds_back_this_agents_own_inside_one(tmp_path):
    """Another agent's root above this agent's (`/srv` holding `/srv/me`): covered, then this
    agent's root bound back read-only, the workspace writable inside it, and a third agent's
    root inside this one's hidden again."""
    srv = tmp_path / "srv"
    mine, ws, third = srv / "me", srv / "me" / "ws", srv / "me" / "third"
    for path in (ws, third, tmp_path / "run"):
        path.mkdir(parents=True, exist_ok=True)
    others = (str(srv), str(third))
    box = confine.Box("/usr/bin/bwrap", (), (), others=others, roots=confine.own_roots_in([str(mine)], others))
    argv = box.argv([str(ws), str(tmp_path / "run")])
    order = [(argv[i], argv[i + 1]) for i in range(len(argv) - 1) if argv[i] in ("--bind", "--ro-bind", "--tmpfs")]
    assert ("--tmpfs", "/tmp") in order  # it covers srv here (test_backends_containment.py: outside /tmp)
    assert not any(path == str(srv) for flag, path in order if flag != "--tmpfs")
    where = [order.index(pair) for pair in (("--ro-bind", str(mine)), ("--tmpfs", str(third)), ("--bind", str(ws)))]
    assert where == sorted(where)
    with pytest.raises(fk.BackendFailure, match="one of the runtime's roots or private paths"):
        box.argv([str(srv)])  # another agent's root itself is never bound back


def test_switched_off_or_without_bubblewrap_there_is_no_box_and_the_run_says_so(tmp_path):
    env = environment(tmp_path, None, None)
    assert sandbox.plan(env, "/bin/true", "/usr/bin:/bin", confined=False)[0] is None
    (tmp_path / "bin").mkdir()
    box, said = sandbox.plan(env, "/bin/true", str(tmp_path / "bin"))
    assert box is None and "bwrap" in said and "Codex's own sandbox only" in said


def test_a_run_says_what_confines_its_commands(tmp_path):
    script = {"on_turn": [{"method": "turn/completed", "params": {"turn": {"id": "$TURN", "status": "completed"}}}]}
    env = environment(tmp_path, mock_binary(tmp_path, script), write_projection(tmp_path))
    result, events = execute(request(workspace(tmp_path)), env)
    assert result["status"] == "completed", events
    said = of_type(events, "backend_status")[0]["commands"]
    assert said.startswith("confined") == _bwrap_works(), said
    bare = environment(tmp_path / "b", mock_binary(tmp_path, script, name="codex2"), write_projection(tmp_path / "b"),
                       PATH=str(tmp_path / "nothing"))
    result, events = execute(request(workspace(tmp_path / "b")), bare)
    assert result["status"] == "completed" and "not on PATH" in of_type(events, "backend_status")[0]["commands"]


def test_the_state_report_says_what_confines_the_code_agents(tmp_path):
    codex = tmp_path / "codex"
    codex.write_text("#!/bin/sh\n")
    codex.chmod(0o755)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CALDERA_CODEX_BIN": str(codex),
           "CALDERA_OPENCODE_BIN": str(tmp_path / "missing")}
    assert registry.sandboxes(env) == {}  # no workspace roots: no run can start
    env["CALDERA_WORKSPACE_ROOTS"] = str(tmp_path)
    current = SimpleNamespace(settings=SimpleNamespace(env=env))
    expected = "bubblewrap" if _bwrap_works() else "Codex's own sandbox only"
    assert SandboxHealth(current, Redactor())()["code_agent_sandbox"]["codex"].startswith(expected)
    (tmp_path / "empty").mkdir()
    env["PATH"] = str(tmp_path / "empty")
    assert SandboxHealth(current, Redactor())() == {"code_agent_sandbox": {
        "codex": registry.UNBOXED["codex"] + " (bubblewrap (bwrap) is not on PATH)"}}


def test_a_bug_in_the_sandbox_entry_never_costs_the_report(monkeypatch):
    def broken(env):
        raise RuntimeError("boom")
    monkeypatch.setattr("caldera.daemon.governance.sandboxes", broken)
    current = SimpleNamespace(settings=SimpleNamespace(env={}))
    assert SandboxHealth(current, Redactor())() == {}


def test_where_bubblewrap_cannot_start_the_run_and_the_report_say_so(tmp_path):
    """No user namespaces: a bwrap that fails (as it does there) on the run's PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "bwrap").write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    (bin_dir / "bwrap").chmod(0o755)
    (bin_dir / "true").symlink_to("/bin/true")
    assert confine.unavailable(str(bin_dir)) == "bubblewrap cannot start here (no unprivileged user namespaces?)"
    script = {"on_turn": [{"method": "turn/completed", "params": {"turn": {"id": "$TURN", "status": "completed"}}}]}
    env = environment(tmp_path, mock_binary(tmp_path, script), write_projection(tmp_path), PATH=str(bin_dir))
    result, events = execute(request(workspace(tmp_path)), env)
    said = of_type(events, "backend_status")[0]["commands"]
    assert result["status"] == "completed" and "cannot start here" in said and "own sandbox only" in said
    agent_env = {"PATH": str(bin_dir), "CALDERA_WORKSPACE_ROOTS": str(tmp_path),
                 "CALDERA_CODEX_BIN": mock_binary(tmp_path, script)}
    current = SimpleNamespace(settings=SimpleNamespace(env=agent_env))
    assert "cannot start here" in SandboxHealth(current, Redactor())()["code_agent_sandbox"]["codex"]


def test_the_state_reports_entry_imports_no_backend_where_bubblewrap_is_on_path(tmp_path):
    """The daemon's report asks registry.sandboxes: with bubblewrap on PATH it loads confine.py
    alone, none of Codex's or OpenCode's modules (docs/performance.md, section 2)."""
    if not _bwrap_works():
        pytest.skip("bubblewrap cannot start here")
    codex = tmp_path / "codex"
    codex.write_text("#!/bin/sh\n")
    codex.chmod(0o755)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CALDERA_CODEX_BIN": str(codex),
           "CALDERA_WORKSPACE_ROOTS": str(tmp_path)}
    code = ("import sys; from caldera.backends import registry; "
            f"print(registry.sandboxes({env!r}), "
            "sorted(m for m in sys.modules if m.startswith('caldera.backends.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.getcwd()}).stdout
    loaded = ("['caldera.backends.confine', 'caldera.backends.failures', 'caldera.backends.leftovers', "
              "'caldera.backends.registry']")
    assert out.strip() == "{'codex': 'bubblewrap'} " + loaded, out


def test_an_external_run_has_no_box_of_calderas_and_says_so(tmp_path, monkeypatch):
    """CALDERA_RUN_SANDBOX=external in a container: the app-server runs bare (the container is
    the sandbox, Codex's own is `externalSandbox`); a read-only run keeps the box."""
    from caldera.host import container

    monkeypatch.setattr(container, "evidence", lambda environ=None, root="/": "a test's container")
    script = {"on_turn": [{"method": "turn/completed", "params": {"turn": {"id": "$TURN", "status": "completed"}}}]}
    env = environment(tmp_path, mock_binary(tmp_path, script), write_projection(tmp_path),
                      CALDERA_RUN_SANDBOX="external")
    result, events = execute(request(workspace(tmp_path), sandbox="workspace-write"), env)
    assert result["status"] == "completed", events
    assert of_type(events, "backend_status")[0]["commands"].startswith("external"), events
    result, events = execute(request(workspace(tmp_path), run_id="run-2", sandbox="read-only"), env)
    assert result["status"] == "completed", events
    assert of_type(events, "backend_status")[0]["commands"].startswith("confined") == _bwrap_works()


def test_a_bind_that_is_a_covered_root_or_a_hidden_path_is_refused_not_bound(tmp_path):
    """Only what lies inside a bind is hidden again: a bind that IS the state root (a workspace,
    OpenCode's workspace root, the binary's dir) would show every agent's session.json."""
    state, own = tmp_path / "var", tmp_path / "var" / "a1"
    own.mkdir(parents=True)
    box = confine.Box("bwrap", covered=(str(state),), hidden=(str(own),))
    for bind in (str(state), str(own)):
        with pytest.raises(fk.BackendFailure, match="one of the runtime's roots or private paths"):
            box.argv([bind])
        with pytest.raises(fk.BackendFailure):
            box.argv([], [bind])
    assert "--bind" in box.argv([str(tmp_path)])  # above them: they are hidden again inside
    from caldera.backends.opencode.confine import Confinement
    boxed = Confinement("bwrap", "/bin/bash", roots=(str(tmp_path / "work"), str(state)), covered=(str(state),),
                        hidden=(), network=False)
    with pytest.raises(fk.BackendFailure, match=str(state)):
        boxed.argv(str(tmp_path / "srv"))


def test_a_workspace_root_in_a_runtime_root_is_said_once_at_start(tmp_path):
    env = {"CALDERA_STATE_DIR": str(tmp_path / "var"), "CALDERA_CONFIG_DIR": str(tmp_path / "etc"),
           "CALDERA_WORKSPACE_ROOTS": f"{tmp_path}:{tmp_path / 'var'}:{tmp_path / 'etc' / 'agents'}"}
    said = config.workspace_roots_in_runtime_roots(env)
    assert [s.split()[3] for s in said] == [str(tmp_path / "var"), str(tmp_path / "etc" / "agents")], said


def test_a_failed_probe_is_asked_again_after_a_while_a_success_never(monkeypatch):
    """A probe that failed for a passing cause (a timeout on a busy host) must not unbox every
    later run of the process: only successes are kept for good."""
    answers, asked = [False, True, False], []

    @confine.successes_cached
    def probe(name: str) -> bool:
        asked.append(name)
        return answers[len(asked) - 1]

    now = [1000.0]
    monkeypatch.setattr(confine.time, "monotonic", lambda: now[0])
    assert probe("bwrap") is False and probe("bwrap") is False and asked == ["bwrap"]  # not asked again at once
    now[0] += confine.RETRY_FAILED_PROBE + 1
    assert probe("bwrap") is True and asked == ["bwrap", "bwrap"]
    now[0] += 10 * confine.RETRY_FAILED_PROBE
    assert probe("bwrap") is True and len(asked) == 2  # a success is kept


def test_a_workspace_in_a_root_is_refused_but_not_one_in_the_persistent_dir(tmp_path):
    """ClawManager's default persistent dir is /config, holding /config/workspace (allowed) and
    the state root /config/caldera-agent (refused, as the persistent dir itself)."""
    from caldera.backends import service

    persist = tmp_path / "config"
    for name in ("workspace", "caldera-agent/other", "etc/agents/other"):
        (persist / name).mkdir(parents=True)
    env = base.Environment(redactor=None, logs_dir=str(persist / "caldera-agent" / "a1" / "logs"),  # type: ignore[arg-type]
                           runs_dir=str(persist / "caldera-agent" / "a1" / "runs"),
                           config_root=str(persist / "etc"), state_root=str(persist / "caldera-agent"),
                           persistent_dir=str(persist))
    guarded = service.guarded_paths(env)
    assert service.check_workspace(str(persist / "workspace"), None, guarded) == str(persist / "workspace")
    for refused in (persist, persist / "caldera-agent", persist / "caldera-agent" / "other",
                    persist / "etc" / "agents" / "other"):
        with pytest.raises(registry.Refused, match="one of the runtime's roots"):
            service.check_workspace(str(refused), None, guarded)
