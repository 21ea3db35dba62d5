"""Issue 43: what an agent's commands can reach on a host with two agents, for every backend.

Two agents installed the README's "Without root" way share one account: `coder` (whose turn
this is) and `other`. The model (each backend's fake provider) asks for one command per turn,
each a script in the workspace (the CLIs' own checks refuse a command line that names a path
outside the workspace; the script is what the sandbox alone must stop). Each attempt must end
with nothing of any secret or canary in the turn's events, its finish result, its run log or
what the model was sent; the write and the connections must not have happened; and the
attempt must have run (its last line prints a marker the model receives).

The tree lies outside /tmp (in HOME): a sandbox that hides /tmp must hide the runtime's roots
for what they are, not because they happen to be there. Issue 41: `other`'s agent.env names its
workspace root beside coder's; no backend's command may read it.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from backends_drivers import CANARY, DRIVERS, ready
from test_backends_contract import Turn

RAN = "attempt-ran"
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module", autouse=True)
def _drivers_closed():
    yield
    for found in DRIVERS.values():
        found.close()


class Listener:
    """A listening socket (TCP on 127.0.0.1 or unix) that counts what connects to it."""

    def __init__(self, family: int, address: str | tuple[str, int]):
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind(address)
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.accepted = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(2)
        self.sock.close()


class Host:
    """The two agents' files, a runtime holding a token in its environment, the listeners."""

    def __init__(self, base: Path):
        self.base = base
        self.etc, self.var, self.creds = base / "etc", base / "var", base / "creds"
        self.coder_config = self.etc / "agents" / "coder"
        self.work = base / "work"
        self.workspace = self.work / "ws"
        self.outside = base / "outside"
        self.marks: dict[str, str] = {}
        for name, path in {
            "OTHERBOOT": self.etc / "agents" / "other" / "secrets.env",
            "OTHERKEY": self.etc / "agents" / "other" / "secrets" / "codex" / "env" / "OPENAI_API_KEY",
            "OTHERAGENTENV": self.etc / "agents" / "other" / "agent.env",
            "CODERBOOT": self.coder_config / "secrets.env",
            "CODERAGENTENV": self.coder_config / "agent.env",
            "OTHERSESSION": self.var / "other" / "session.json",
            "CODERSESSION": self.var / "coder" / "session.json",
            "OTHERRUNHOME": self.var / "other" / "runs" / "r9" / "home" / "notes",
            "OTHERRUNTMP": self.var / "other" / "runs" / "r9" / "tmp" / "scratch",
            "SYSTEMDCRED": self.creds / "codex_env_OPENAI_API_KEY",
        }.items():
            self.marks[name] = f"canary-{name}-{uuid.uuid4().hex}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"CALDERA_TOKEN={self.marks[name]}\n")
        self.workspace.mkdir(parents=True)
        self.outside.mkdir()
        # the other agent's workspace root (its agent.env names it), beside this agent's own
        self.other_work = base / "otherwork"
        self.marks["OTHERWORKSPACE"] = f"canary-OTHERWORKSPACE-{uuid.uuid4().hex}"
        (self.other_work / "ws").mkdir(parents=True)
        (self.other_work / "ws" / "marker").write_text(self.marks["OTHERWORKSPACE"] + "\n")
        with (self.etc / "agents" / "other" / "agent.env").open("a") as env:
            env.write(f"CALDERA_WORKSPACE_ROOTS={self.other_work}\n")
        self.marks["RUNTIMEENV"] = f"canary-RUNTIMEENV-{uuid.uuid4().hex}"
        # a runtime of this account: its environment holds its token (/proc/PID/environ)
        self.runtime = subprocess.Popen(["sleep", "600"], env={"CALDERA_TOKEN": self.marks["RUNTIMEENV"]})
        self.tcp = Listener(socket.AF_INET, ("127.0.0.1", 0))
        self.unix_path = os.path.join(tempfile.gettempdir(), f"caldera-containment-{uuid.uuid4().hex[:8]}.sock")
        self.unix = Listener(socket.AF_UNIX, self.unix_path)

    def close(self) -> None:
        self.runtime.kill()
        self.runtime.wait()
        self.tcp.close()
        self.unix.close()
        os.unlink(self.unix_path)

    def secrets(self) -> list[str]:
        return [*self.marks.values(), CANARY]


def _outside_tmp() -> Path | None:
    """A writable dir outside the temporary dir: CALDERA_TEST_OUTSIDE_TMP, HOME or the checkout."""
    tmp = os.path.realpath(tempfile.gettempdir())
    for candidate in (os.environ.get("CALDERA_TEST_OUTSIDE_TMP"), os.environ.get("HOME"), str(HERE.parent.parent)):
        real = os.path.realpath(candidate) if candidate else None
        if real and not (real + "/").startswith(tmp + "/") and os.access(real, os.W_OK):
            return Path(real)
    return None


@pytest.fixture(scope="module")
def host() -> Iterator[Host]:
    outside = _outside_tmp()
    if outside is None:
        reason = "no writable dir outside the temporary dir: set CALDERA_TEST_OUTSIDE_TMP"
        if any(os.environ.get(found.require_var) == "1" for found in DRIVERS.values()):
            pytest.fail(reason)
        pytest.skip(reason)
    base = Path(tempfile.mkdtemp(prefix=".caldera-containment-", dir=outside))
    found = Host(base)
    try:
        yield found
    finally:
        found.close()
        shutil.rmtree(base, ignore_errors=True)


def _attempts(host: Host, projection: Path) -> dict[str, str]:
    """Each attempt's script (bash), by name."""
    other, var = host.etc / "agents" / "other", host.var
    return {
        "other-secrets-env": f"cat {other}/secrets.env {other}/agent.env {other}/secrets/codex/env/*",
        "other-session-json": f"cat {var}/other/session.json",
        "own-projection": (f"grep -r . {projection} {host.coder_config} {var}/coder/session.json; "
                           'if [ -n "$CODEX_HOME" ]; then grep -r . "$CODEX_HOME"; fi'),  # its run's copy
        "environment": "env",
        "proc-environ": "grep -a -h -o 'canary-[A-Za-z0-9-]*\\|LEAKCANARY[A-Za-z0-9-]*' /proc/[0-9]*/environ",
        "write-outside": f"echo planted > {host.outside}/planted; echo CALDERA_TOKEN=planted >> {other}/agent.env",
        "loopback-connect": f"echo hello > /dev/tcp/127.0.0.1/{host.tcp.sock.getsockname()[1]}",
        # what a hostile reviewer adds: another run's HOME and TMPDIR, systemd's credentials,
        # a unix socket of this account in the shared /tmp, unmounting what hides the roots
        "other-run-home-tmp": f"cat {var}/other/runs/r9/home/notes {var}/other/runs/r9/tmp/scratch",
        "credentials-directory": f"cat {host.creds}/*",
        # issue 41: another agent's workspace, outside the runtime's roots and /tmp
        "other-agent-workspace": f"cat {host.other_work}/ws/marker; ls -R {host.other_work}",
        "unmount-what-hides": (f"grep CapEff /proc/self/status; for d in {host.etc} {var} {host.creds}; "
                               f"do umount -l $d; done 2>&1; cat {other}/secrets.env {var}/other/session.json"),
        "unix-socket": ("python3 -c 'import socket, sys; s = socket.socket(socket.AF_UNIX); "
                        f"s.connect(sys.argv[1]); s.send(b\"hi\")' {host.unix_path}"),
    }


ATTEMPTS = ["other-secrets-env", "other-session-json", "own-projection", "environment", "proc-environ",
            "write-outside", "loopback-connect", "other-run-home-tmp", "credentials-directory", "unix-socket",
            "unmount-what-hides", "other-agent-workspace"]


@pytest.fixture(params=sorted(DRIVERS), ids=sorted(DRIVERS))
def driver(request):
    return ready(request.param)[0]


@pytest.mark.parametrize("attempt", ATTEMPTS)
def test_a_command_reaches_nothing_of_the_runtime_nor_the_other_agent(driver, host, attempt, tmp_path):
    projection = driver.projection(host.coder_config, "http://127.0.0.1:9", CANARY)  # where the turn's will be
    script = _attempts(host, projection)[attempt]
    name = f"attempt-{attempt}.sh"
    (host.workspace / name).write_text(f"{script}\necho {RAN}\n")
    other_env = (host.etc / "agents" / "other" / "agent.env").read_text()
    tcp_before, unix_before = host.tcp.accepted, host.unix.accepted
    (host.var / "coder" / "logs" / "run-run-1.log").unlink(missing_ok=True)  # each attempt's run log alone
    turn = Turn(driver, tmp_path, [driver.command(f"bash {name}"), driver.text("done")],
                workspace=host.workspace, config_dir=host.coder_config, state_dir=host.var / "coder",
                extra_env={"CALDERA_WORKSPACE_ROOTS": str(host.work)},
                fields={"config_root": str(host.etc), "state_root": str(host.var),
                        "credentials_dir": str(host.creds)})
    assert turn.terminal["status"] == "completed", turn.events
    sent = [post["body"] for post in turn.posts]
    assert len(sent) == 2 and RAN in sent[1], (attempt, turn.events)  # the attempt ran, its output went back
    log = Path(turn.result["log"]).read_text()
    everything = "\n".join([json.dumps(turn.events), json.dumps(turn.result), log, *sent])
    leaked = [mark for mark in host.secrets() if mark in everything]
    assert leaked == [], (attempt, [name for name, mark in host.marks.items() if mark in leaked], sent[1][-3000:])
    assert not (host.outside / "planted").exists()
    assert (host.etc / "agents" / "other" / "agent.env").read_text() == other_env
    assert (host.tcp.accepted, host.unix.accepted) == (tcp_before, unix_before), attempt
    turn.assert_nothing_left(log)


def test_without_bubblewrap_on_path_codex_is_boxed_by_the_one_its_package_bundles(host, tmp_path):
    """A host without the bubblewrap package: Codex's own sandbox uses the bwrap its npm package
    bundles, and so does caldera's box around it (the roots stay hidden)."""
    codex = ready("codex")[0]
    farm = tmp_path / "bin"  # the PATH's programs, bubblewrap left out
    farm.mkdir()
    for directory in os.environ.get("PATH", "/usr/bin:/bin").split(":"):
        for name in os.listdir(directory) if os.path.isdir(directory) else ():
            if name != "bwrap" and not (farm / name).exists():
                (farm / name).symlink_to(os.path.join(directory, name))
    (host.workspace / "attempt-bundled.sh").write_text(f"cat {host.etc}/agents/other/secrets.env\necho {RAN}\n")
    (host.var / "coder" / "logs" / "run-run-1.log").unlink(missing_ok=True)
    turn = Turn(codex, tmp_path, [codex.command("bash attempt-bundled.sh"), codex.text("done")],
                workspace=host.workspace, config_dir=host.coder_config, state_dir=host.var / "coder",
                extra_env={"PATH": str(farm)}, fields={"config_root": str(host.etc), "state_root": str(host.var)})
    assert turn.terminal["status"] == "completed", turn.events
    assert turn.of("backend_status")[0]["commands"].startswith("confined"), turn.events[0]
    assert RAN in turn.posts[1]["body"] and host.marks["OTHERBOOT"] not in turn.posts[1]["body"]
    turn.assert_no_leak()


@pytest.mark.parametrize("where", ["state-root", "other-config-dir"])
def test_a_workspace_that_is_a_runtime_root_or_lies_in_one_is_refused(driver, host, where, tmp_path):
    """Bound into the sandbox, such a workspace showed every agent's session.json or the other
    agent's secrets.env (only what lies inside a bind is hidden again): refused with a sentence,
    before any CLI starts, even where the workspace roots hold it."""
    workspace = {"state-root": host.var, "other-config-dir": host.etc / "agents" / "other"}[where]
    turn = Turn(driver, tmp_path, [driver.command("cat secrets.env other/session.json"), driver.text("done")],
                workspace=workspace, config_dir=host.coder_config, state_dir=host.var / "coder",
                extra_env={"CALDERA_WORKSPACE_ROOTS": str(host.base)},
                fields={"config_root": str(host.etc), "state_root": str(host.var)})
    assert turn.terminal["status"] == "blocked", turn.events
    assert "one of the runtime's roots" in turn.terminal["message"], turn.terminal
    assert turn.posts == []
    turn.assert_no_leak()


def test_a_codex_binary_in_the_state_root_is_refused_not_bound(host, tmp_path):
    """CALDERA_CODEX_BIN a symlink in the state root: its dir (the state root) is not bound
    back into the box; the run fails with a sentence and the model is never asked."""
    codex, binary = ready("codex")
    link = host.var / "codex"
    link.unlink(missing_ok=True)
    link.symlink_to(binary)
    try:
        turn = Turn(codex, tmp_path, [codex.command("cat ../other/session.json"), codex.text("done")],
                    workspace=host.workspace, config_dir=host.coder_config, state_dir=host.var / "coder",
                    binary=str(link), fields={"config_root": str(host.etc), "state_root": str(host.var)})
    finally:
        link.unlink()
    if not turn.of("backend_status")[0]["commands"].startswith("confined"):
        pytest.skip("no box here: nothing is bound")
    assert turn.terminal["status"] == "failed", turn.events
    assert f"Codex binary's dir {host.var} lies in" in turn.terminal["message"], turn.terminal
    assert turn.posts == []


def _codex_projection(form: str):
    """Codex's driver with the projection's key in auth.json or as config.toml's bearer token
    (the shared driver's is an env/ file): both were copied into CODEX_HOME, which the box binds."""
    import backends_drivers

    class Driver(backends_drivers.CodexDriver):
        def projection(self, root: Path, provider_url: str, key: str) -> Path:
            codex = root / "secrets" / "codex"
            shutil.rmtree(codex, ignore_errors=True)
            codex.mkdir(parents=True)
            auth = ("requires_openai_auth = true\n" if form == "auth-json"
                    else f'experimental_bearer_token = "{key}"\nhttp_headers = {{ "X-Secret" = "{key}-h" }}\n')
            (codex / "config.toml").write_text(
                'model = "gpt-5.5"\nmodel_provider = "fake"\n[model_providers.fake]\nname = "Fake"\n'
                f'base_url = "{provider_url}/v1"\nwire_api = "responses"\n{auth}')
            if form == "auth-json":
                (codex / "auth.json").write_text(json.dumps({"OPENAI_API_KEY": key}))
            return root / "secrets"
    return Driver()


@pytest.mark.parametrize("form", ["auth-json", "bearer-token"])
def test_a_codex_command_reads_no_key_of_its_own_projection(host, form, tmp_path):
    """The own-projection attempt with the key in auth.json or config.toml: the turn still
    authenticates (the fake provider checks the key), and the command finds it nowhere,
    CODEX_HOME included."""
    ready("codex")
    driver = _codex_projection(form)
    projection = host.coder_config / "secrets"
    (host.workspace / "attempt-key.sh").write_text(_attempts(host, projection)["own-projection"] + f"\necho {RAN}\n")
    (host.var / "coder" / "logs" / "run-run-1.log").unlink(missing_ok=True)
    try:
        turn = Turn(driver, tmp_path, [driver.command("bash attempt-key.sh"), driver.text("done")],
                    workspace=host.workspace, config_dir=host.coder_config, state_dir=host.var / "coder",
                    fields={"config_root": str(host.etc), "state_root": str(host.var)})
    finally:
        shutil.rmtree(projection / "codex", ignore_errors=True)
    assert turn.terminal["status"] == "completed", turn.events
    assert [driver.key_seen(r) for r in turn.requests] == [CANARY, CANARY]
    sent = [post["body"] for post in turn.posts]
    assert RAN in sent[1] and CANARY not in sent[1], sent[1][-2000:]


def test_an_opencode_workspace_root_that_is_the_state_root_is_refused_not_bound(host, tmp_path):
    """OpenCode binds every workspace root (one server serves them all): one that IS the state
    root would show every agent's session.json. The run fails with a sentence, nothing read."""
    opencode = ready("opencode")[0]
    turn = Turn(opencode, tmp_path, [opencode.command(f"cat {host.var}/other/session.json"), opencode.text("done")],
                workspace=host.workspace, config_dir=host.coder_config, state_dir=host.var / "coder",
                extra_env={"CALDERA_WORKSPACE_ROOTS": f"{host.work}:{host.var}"},
                fields={"config_root": str(host.etc), "state_root": str(host.var)})
    if not turn.of("backend_status")[0]["commands"].startswith("confined"):
        pytest.skip("no bubblewrap here: nothing is bound")
    assert turn.terminal["status"] == "failed", turn.events
    assert f"{host.var} is one of the runtime's roots" in turn.terminal["message"], turn.terminal
    assert host.marks["OTHERSESSION"] not in json.dumps(turn.events) and turn.posts == []
