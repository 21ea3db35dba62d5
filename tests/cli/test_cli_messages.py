"""Off the happy path (issue 36): each message a newcomer meets says what is true where they
stand and names the next step that works there.

The line that matters in each case (a message's first line, or the one line of a report that
is about the problem) is kept in one place, tests/cli/messages.txt, one case a line: a change
to a message is a change to that file, seen in review. Each test below makes its case happen
for real (a manifest whose adapter file is missing, a port held by another socket, a
daemon started from a checkout, …) and compares what the CLI printed. In the file, the
test's own directory reads {tmp}, a home {home}, the user's name {user}, a process id {pid},
a port {port}, a measured duration {secs}.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
from daemon_helpers import wait_for
from unprivileged_helpers import scratch

from caldera import cli
from caldera.agents import blueprint
from caldera.cli import init as init_cli

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "task-agent"
INBOX = REPO / "examples" / "inbox-watcher"
GOLDEN = Path(__file__).with_name("messages.txt")
CASE = re.compile(r"^\[([a-z0-9-]+)\] (.*)$")

HANGING_ADAPTER = r"""
import json, sys, time
verb = sys.argv[1:]
if verb == ["status"]:
    print(json.dumps({"state": {"level": "ok", "label": "Ready"}}))
elif verb == ["pause"]:
    print("pausing, token=sk-canary0123456789abcdef", file=sys.stderr, flush=True)
    time.sleep(60)
elif verb == ["resume"]:
    print("Traceback (most recent call last):\n  File \"adapter.py\"\nRuntimeError: locked, password=hunter2canary",
          file=sys.stderr)
    sys.exit(3)
else:
    sys.exit(2)
"""


def golden() -> dict[str, str]:
    cases = {}
    for line in GOLDEN.read_text().splitlines():
        found = CASE.match(line)
        if found:
            assert found[1] not in cases, f"{found[1]} twice in {GOLDEN.name}"
            cases[found[1]] = found[2]
    return cases


def said(case: str, line: str, **values: object) -> None:
    """`line`, its values written as placeholders (longest first), is messages.txt's line for `case`."""
    for name, value in sorted(values.items(), key=lambda item: -len(str(item[1]))):
        line = line.replace(str(value), "{" + name + "}")
    assert line == golden().get(case), f"[{case}] {line}"


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a process started by hand: no caldera variable, no systemd."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CALDERA_", "CLAWMANAGER_")) and k not in ("NOTIFY_SOCKET", "INVOCATION_ID")}
    env.update(extra)
    return env


def copy_example(tmp_path: Path) -> Path:
    target = tmp_path / "task-agent"
    shutil.copytree(EXAMPLE, target, ignore=shutil.ignore_patterns("data", "__pycache__", ".caldera-state"))
    return target


def write_agent(directory: Path, manifest: str, adapter: str = "") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "caldera.agent.yaml").write_text(manifest)
    if adapter:
        (directory / "adapter.py").write_text(adapter)
    return directory


def bare_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in list(os.environ):
        if key.startswith(("CALDERA_", "CLAWMANAGER_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))


def test_every_case_in_the_file_is_tried_here():
    source = Path(__file__).read_text()
    untried = [case for case in golden() if f'"{case}"' not in source]
    assert golden() and not untried, untried


# ---------------------------------------------------------------- init, without root

@pytest.mark.skipif(not EXAMPLE.is_dir(), reason="examples/task-agent is not in this checkout")
@pytest.mark.parametrize("systemd", [False, True])
def test_init_outside_the_default_roots_names_both_variables(tmp_path, monkeypatch, capsys, systemd):
    """Following the printed command to the letter reads the state where init put it."""
    bare_env(monkeypatch, tmp_path)
    monkeypatch.setenv("CALDERA_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.setenv("CALDERA_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "systemd").mkdir()
    systemd_dir = tmp_path / ("systemd" if systemd else "no-systemd")
    monkeypatch.setattr(init_cli, "install", partial(blueprint.install, systemd_dir=systemd_dir, unit_dir=None))
    assert cli.main(["init", str(EXAMPLE), "--name", "ta"]) == 0
    out = capsys.readouterr().out.strip()
    said("init-systemd-other-roots" if systemd else "init-no-systemd", out, tmp=tmp_path)
    command = re.search(r"start it with `([^`]*)`", out, re.I)[1]
    words = command.split()
    env = clean_env(**dict(word.split("=", 1) for word in words if "=" in word))
    assert words[words.index("caldera"):] == ["caldera", "run", "--agent", "ta"]
    # The command as printed finds the agent and its one state dir: `status` through the same words.
    done = subprocess.run([sys.executable, "-m", "caldera.cli", "status", "--agent", "ta", "--json"], env=env,
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["ta"]
    assert "state_dir_missing" not in json.loads(done.stdout)


@pytest.mark.skipif(not EXAMPLE.is_dir(), reason="examples/task-agent is not in this checkout")
def test_init_prints_what_works_from_where_it_was_typed(tmp_path):
    """Relative roots are printed absolute; the console script of a virtualenv that is not
    activated (no `caldera` on PATH) is printed by its path, the one that works."""
    script = Path(sys.executable).parent / "caldera"
    if not script.is_file():
        pytest.skip(f"no console script beside {sys.executable} (caldera is not installed in this environment)")
    env = clean_env(CALDERA_CONFIG_DIR="cfg", CALDERA_STATE_DIR="state", PATH="/usr/bin:/bin")
    done = subprocess.run([str(script), "init", str(EXAMPLE), "--name", "ta"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    command = re.search(r"start it with `([^`]*)`", done.stdout, re.I)[1]
    said("init-program-not-on-path", command, tmp=tmp_path, program=script)
    words = command.split()
    roots = clean_env(**dict(word.split("=", 1) for word in words[:2]))
    status = subprocess.run([words[2], "status", "--agent", "ta"], env=roots, cwd="/", capture_output=True,
                            text=True, timeout=60)  # as printed, from anywhere
    assert status.returncode == 0 and "daemon: not running" in status.stdout, status.stdout + status.stderr


def test_a_manifest_agents_state_beside_a_manifest_it_may_not_write(account):
    """The default state dir is beside the manifest: where this user may not write there, the
    sentence says so and names --state-dir."""
    root = scratch(account)
    try:
        agent = write_agent(root / "ro", "name: ro\nruntime:\n  type: adapter\n  command: [python3, adapter.py]\n",
                            "import sys\nsys.exit(2)\n")
        account.give(root)
        agent.chmod(0o555)
        if os.access(agent, os.W_OK) and os.geteuid() != 0:
            pytest.skip("this user may write a directory of mode 0555 (CAP_DAC_OVERRIDE)")
        done = account.caldera(["run", "--manifest", str(agent)], cwd=root, env=account.env(root))
        assert done.returncode == 2, done.stderr
        said("run-manifest-state-not-writable", done.stderr.strip(), tmp=root, user=account.name)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.skipif(not EXAMPLE.is_dir(), reason="examples/task-agent is not in this checkout")
def test_an_agent_id_the_server_would_trim_stops_the_start(tmp_path, monkeypatch, capsys):
    """Issue 34: an image's CLAWMANAGER_AGENT_ID with a space (the server trims it at register
    and then refuses every command's start) is refused at start, exit 2, with the variable."""
    bare_env(monkeypatch, tmp_path)
    monkeypatch.setenv("CALDERA_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.setenv("CALDERA_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(blueprint.account, "_bundle_account", lambda: None)
    assert cli.main(["init", str(EXAMPLE), "--name", "ta"]) == 0
    done = subprocess.run([sys.executable, "-m", "caldera.cli", "report", "--once", "--agent", "ta"],
                          env=clean_env(CALDERA_CONFIG_DIR=str(tmp_path / "cfg"),
                                        CALDERA_STATE_DIR=str(tmp_path / "state"),
                                        CLAWMANAGER_AGENT_ID="hermes 12 main"),
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2
    said("agent-id-bad", done.stderr.strip(), tmp=tmp_path)


@pytest.mark.skipif(not EXAMPLE.is_dir(), reason="examples/task-agent is not in this checkout")
def test_init_again_and_report_in_a_checkout(tmp_path, monkeypatch, capsys):
    """No `caldera` account here: nothing "runs as caldera"; report --once says what enables it."""
    bare_env(monkeypatch, tmp_path)
    monkeypatch.setenv("CALDERA_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.setenv("CALDERA_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(blueprint.account, "_bundle_account", lambda: None)  # a checkout: no caldera account
    assert cli.main(["init", str(EXAMPLE), "--name", "ta"]) == 0
    capsys.readouterr()
    assert cli.main(["init", str(EXAMPLE), "--name", "ta"]) == 1
    said("init-twice", capsys.readouterr().err.strip(), tmp=tmp_path)
    done = subprocess.run([sys.executable, "-m", "caldera.cli", "report", "--once", "--agent", "ta"],
                          env=clean_env(CALDERA_CONFIG_DIR=str(tmp_path / "cfg"),
                                        CALDERA_STATE_DIR=str(tmp_path / "state")),
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 1
    said("report-local", done.stderr.strip(), tmp=tmp_path)


@pytest.fixture
def home(account):
    """The account's own directory: a checkout's examples/task-agent (as README's reader has
    it) under co/, and room for a config and a state dir."""
    root = scratch(account)
    try:
        shutil.copytree(EXAMPLE, root / "co" / "examples" / "task-agent",
                        ignore=shutil.ignore_patterns("data", "__pycache__", ".caldera-state"))
        account.give(root)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _in_root(line: str) -> str:
    """The refused path in "caldera CMD: PATH: …" as the default root it is in: mkdir names the
    first directory it may not make, which is the root itself on a host without caldera
    installed, one inside it on a host with (the sentence after it is the same)."""
    found = re.match(r"^(caldera [a-z]+: )(/etc/caldera|/var/lib/caldera)(/[^:]*)?(: .*)$", line)
    assert found, line
    return found[1] + found[2] + found[4]


@pytest.mark.skipif(not EXAMPLE.is_dir(), reason="examples/task-agent is not in this checkout")
def test_without_root_init_run_and_report_name_the_way_out(account, home):
    """As an account that is not root: init without the variables (sudo, or both), init with the
    config dir's only (all or nothing: nothing written), then an agent installed with both and
    run or reported with the config dir's only (the state dir's, as it was for init)."""
    if os.access("/etc", os.W_OK, effective_ids=True) and os.geteuid() != 0:
        pytest.skip("this user may write /etc: the case needs one who may not")
    user, co = account.name, home / "co"
    blueprint_dir = "examples/task-agent"
    done = account.caldera(["init", blueprint_dir, "--name", "ta"], cwd=co, env=account.env(home))
    assert done.returncode == 2, done.stderr
    said("init-no-rights", _in_root(done.stderr.strip()), user=user)
    config_only = account.env(home, CALDERA_CONFIG_DIR=str(home / "cfg"))
    done = account.caldera(["init", blueprint_dir, "--name", "ta"], cwd=co, env=config_only)
    assert done.returncode == 2, done.stderr
    said("init-no-state-variable", _in_root(done.stderr.strip()), user=user)
    assert not (home / "cfg").exists()  # checked before anything was written
    both = account.env(home, CALDERA_CONFIG_DIR=str(home / "cfg"), CALDERA_STATE_DIR=str(home / "state"))
    done = account.caldera(["init", blueprint_dir, "--name", "ta"], cwd=co, env=both)
    assert done.returncode == 0, done.stderr
    for args, case in ((["run"], "run-no-state-variable"), (["report", "--once"], "report-no-state-variable")):
        done = account.caldera([*args, "--agent", "ta"], cwd=co, env=config_only)
        assert done.returncode == 2, done.stderr
        said(case, _in_root(done.stderr.strip()), user=user)


@pytest.mark.skipif(not EXAMPLE.is_dir(), reason="examples/task-agent is not in this checkout")
def test_an_install_an_older_init_left_without_its_state_dir_is_completed(account, home):
    """An init before the all-or-nothing check wrote the config dir, then met the state root's
    refusal: re-running it with the state dir's variable completes it (it said "already
    installed" before, and status sent the reader back to init: a circle)."""
    both = account.env(home, CALDERA_CONFIG_DIR=str(home / "cfg"), CALDERA_STATE_DIR=str(home / "state"))
    assert account.caldera(["init", "examples/task-agent", "--name", "ta"], cwd=home / "co", env=both).returncode == 0
    shutil.rmtree(home / "state" / "ta")  # what that older init left: the config dir alone
    (home / "cfg" / "agents" / "ta" / "agent.env").write_text("# kept\n")
    done = account.caldera(["init", "examples/task-agent", "--name", "ta"], cwd=home / "co", env=both)
    assert done.returncode == 0, done.stderr
    said("init-completes", re.split(r" (?=systemd is not running|Start it with)", done.stdout.strip())[0], home=home)
    assert (home / "state" / "ta").is_dir() and (home / "cfg" / "agents" / "ta" / "agent.env").read_text() == "# kept\n"
    status = account.caldera(["status", "--agent", "ta"], cwd=home, env=both)
    assert status.returncode == 0 and "not there" not in status.stdout, status.stdout


@pytest.mark.skipif(not EXAMPLE.is_dir(), reason="examples/task-agent is not in this checkout")
def test_without_root_an_agent_root_installed_names_sudo(account, home, tmp_path):
    """root installed the agent in /etc/caldera; its run and report by an account that is not
    root (in a mount namespace whose /etc holds that install: nothing outside it changes)."""
    staged = tmp_path / "etc-caldera"
    blueprint.install(EXAMPLE, name="ta", environ={"CALDERA_CONFIG_DIR": str(staged),
                                                  "CALDERA_STATE_DIR": str(tmp_path / "unused")},
                      systemd_dir=tmp_path / "no-systemd", unit_dir=None)
    for args, case in ((["run"], "run-no-rights"), (["report", "--once"], "report-no-rights")):
        done = account.in_default_roots(staged, [*args, "--agent", "ta"], cwd=home, env=account.env(home))
        if done is None:
            pytest.skip("needs root and a mount namespace with an overlay over /etc (unshare, setpriv)")
        assert done.returncode == 2, done.stderr
        said(case, done.stderr.strip(), user=account.name)


def test_an_agent_not_installed_here_says_where_it_looked(caldera_env, capsys, monkeypatch):
    (caldera_env / "etc" / "agents" / "demo").mkdir()
    (caldera_env / "etc" / "agents" / "demo" / "caldera.agent.yaml").write_text("name: demo\n")
    assert cli.main(["status", "--agent", "ta"]) == 2
    said("status-not-installed", capsys.readouterr().err.strip(), tmp=caldera_env)


# ---------------------------------------------------------------- check

def test_check_an_adapter_file_that_does_not_exist(tmp_path, capsys):
    agent = write_agent(tmp_path / "bad", "name: bad\nruntime:\n  type: adapter\n"
                                          "  command: [python3, no_such_adapter.py]\n  workdir: .\n")
    assert cli.main(["check", "--manifest", str(agent / "caldera.agent.yaml")]) == 1
    lines = capsys.readouterr().out.splitlines()
    said("check-missing-adapter", next(line for line in lines if "FAIL" in line), tmp=tmp_path)
    status = lines.index(next(line for line in lines if "status:" in line))
    said("check-missing-adapter-status", lines[status], tmp=tmp_path)
    assert "stderr:" in lines[status + 1] and "can't open file" in lines[status + 1]  # python's own words
    assert not any("not implemented" in line for line in lines)  # nothing ran: nothing "not implemented"
    assert cli.main(["check", str(agent), "--json"]) == 1
    checks = json.loads(capsys.readouterr().out)["checks"]
    assert any("can't open file" in line for item in checks for line in item.get("stderr", ()))


def test_an_adapter_that_cannot_start_is_not_a_verb_it_does_not_know(tmp_path, capsys):
    """python exits 2 for a script it cannot open, which the contract reads as "verb not known":
    status, the verbs and --json say the adapter cannot start, with python's own words."""
    agent = write_agent(tmp_path / "bad", "name: bad\nruntime:\n  type: adapter\n"
                                          "  command: [python3, no_such_adapter.py]\n  workdir: .\n")
    argv = ["--manifest", str(agent), "--state-dir", str(tmp_path / "st")]
    assert cli.main(["status", *argv]) == 0
    lines = capsys.readouterr().out.splitlines()
    said("status-adapter-cannot-start", lines[1], tmp=tmp_path)
    said("status-adapter-stderr", lines[2], tmp=tmp_path)
    assert cli.main(["status", *argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "cannot start" in doc["agent_status"]["detail"] and "can't open file" in doc["adapter_stderr"][0]
    for verb in (["pause"], ["run-now"], ["log"], ["settings", "get"]):
        assert cli.main([*verb, *argv]) == 1, verb
        err = capsys.readouterr().err.splitlines()
        assert "the adapter cannot start" in err[0] and "not supported" not in err[0], err
        assert err[1].startswith("  adapter stderr:") and "can't open file" in err[1], err
    assert cli.main(["pause", *argv]) == 1
    said("pause-adapter-cannot-start", capsys.readouterr().err.splitlines()[0], tmp=tmp_path)


def test_a_secret_from_secrets_env_never_shows_in_an_adapters_stderr(tmp_path, capsys):
    """A secrets.env value that has no credential's shape is masked all the same (the Redactor
    knows the agent's secrets): in the verbs' stderr lines, check's, status's and --json."""
    agent = write_agent(tmp_path / "leak", "name: leak\nruntime:\n  type: adapter\n  command: [python3, adapter.py]\n"
                                           "  workdir: .\n", "import sys\nprint('near plainvalue4242 it failed', "
                                           "file=sys.stderr)\nsys.exit(3)\n")
    (agent / "secrets.env").write_text("MY_PLAIN=plainvalue4242\n")
    (agent / "secrets.env").chmod(0o600)
    argv = ["--manifest", str(agent), "--state-dir", str(tmp_path / "st")]
    shown = []
    for args in (["pause", *argv], ["pause", *argv, "--json"], ["status", *argv], ["status", *argv, "--json"],
                 ["check", str(agent)], ["check", str(agent), "--json"]):
        cli.main(args)
        out = capsys.readouterr()
        shown.append(out.out + out.err)
    assert all("near [REDACTED] it failed" in text for text in shown), shown
    assert not any("plainvalue4242" in text for text in shown)


def test_check_shows_an_adapters_stderr_redacted_and_cut(tmp_path, capsys):
    agent = write_agent(tmp_path / "hang", "name: hang\nruntime:\n  type: adapter\n  command: [python3, adapter.py]\n"
                                           "  workdir: .\n  timeout_seconds: 1\n", HANGING_ADAPTER)
    assert cli.main(["check", str(agent), "--controls"]) == 1
    out = capsys.readouterr().out
    assert "sk-canary" not in out and "hunter2canary" not in out
    resume = out.split("  resume: exited with status 3\n")[1].splitlines()  # the verb said once
    said("check-adapter-stderr", resume[2], tmp=tmp_path)
    assert "stderr:" in resume[0] and len([line for line in resume if line.startswith(" " * 20)]) == 3


@pytest.mark.parametrize("case,text", [("manifest-list", "- just\n- a list\n"), ("manifest-empty", "")])
def test_a_manifest_that_is_no_mapping_is_one_sentence(tmp_path, capsys, case, text):
    agent = tmp_path / "agent"
    agent.mkdir()
    (agent / "caldera.agent.yaml").write_text(text)
    assert cli.main(["check", str(agent)]) == 1
    lines = [line for line in capsys.readouterr().out.splitlines() if "FAIL" in line]
    assert len(lines) == 1, lines  # no raw jsonschema text after it
    said(case, lines[0], tmp=tmp_path)
    assert cli.main(["pause", "--manifest", str(agent), "--state-dir", str(tmp_path / "st")]) == 2
    assert capsys.readouterr().err.strip() == f"caldera pause: {lines[0].split('manifest: ', 1)[1]}"


def test_a_schema_rule_is_said_in_words(tmp_path, capsys):
    agent = write_agent(tmp_path / "a", "name: a\nruntime: {type: adapter, command: [python3, a.py]}\n"
                                        "env: {A: b}\nstatus: s.json\n")
    assert cli.main(["check", str(agent)]) == 1
    lines = [line for line in capsys.readouterr().out.splitlines() if "FAIL" in line]
    assert "should not be valid" not in "\n".join(lines)
    said("manifest-adapter-keys", lines[1], tmp=tmp_path)


@pytest.mark.skipif(not EXAMPLE.is_dir(), reason="examples/task-agent is not in this checkout")
def test_check_takes_a_directory_as_argument_or_flag(tmp_path, capsys):
    agent = copy_example(tmp_path)
    for argv in (["check", str(agent)], ["check", "--manifest", str(agent)],
                 ["check", str(agent / "caldera.agent.yaml")]):
        assert cli.main(argv) == 0, capsys.readouterr()
        said("check-directory", capsys.readouterr().out.splitlines()[0], tmp=tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli.main(["check", str(empty)]) == 2
    said("check-directory-without-manifest", capsys.readouterr().err.strip(), tmp=tmp_path)
    assert cli.main(["check", "--manifest", str(empty)]) == 2
    said("check-manifest-directory-without-manifest", capsys.readouterr().err.strip(), tmp=tmp_path)
    assert cli.main(["check", str(tmp_path / "nothing")]) == 2
    said("check-no-such-path", capsys.readouterr().err.strip(), tmp=tmp_path)


def test_check_names_what_a_person_got_wrong(tmp_path, capsys, monkeypatch):
    """Nothing named in a manifest's directory; a misspelled top-level key; an adapter's broken
    status said once (not "status: status: …"); a path that is not there, asked as --json."""
    agent = write_agent(tmp_path / "a", "name: a\nruntime:\n  type: adapter\n  command: [python3, adapter.py]\n"
                                        "  workdir: .\n", "import json\nprint(json.dumps({}), json.dumps({}))\n")
    bare_env(monkeypatch, tmp_path)
    monkeypatch.setenv("CALDERA_CONFIG_DIR", str(tmp_path / "none"))
    monkeypatch.chdir(agent)
    assert cli.main(["check"]) == 2
    said("check-here", capsys.readouterr().err.strip(), tmp=tmp_path)
    assert cli.main(["check", "."]) == 1
    said("check-status-said-once", next(line for line in capsys.readouterr().out.splitlines() if "FAIL" in line))
    assert cli.main(["check", str(tmp_path / "nothing"), "--json"]) == 2
    out = capsys.readouterr()
    said("check-json-usage", out.out.strip(), tmp=tmp_path)
    assert not out.err
    misspelled = write_agent(tmp_path / "m", "name: m\nruntim:\n  type: adapter\n  command: [python3, a.py]\n")
    assert cli.main(["check", str(misspelled)]) == 1
    lines = [line for line in capsys.readouterr().out.splitlines() if "FAIL" in line]
    assert len(lines) == 1, lines  # not jsonschema's "'runtime' is a required property" after it
    said("manifest-misspelled-key", lines[0], tmp=tmp_path)


# ---------------------------------------------------------------- the verbs

def test_an_error_without_a_file_name_has_one_colon(tmp_path, capsys):
    """The current directory deleted under the shell: once "caldera pause:: No such file or directory"."""
    here = os.getcwd()
    gone = tmp_path / "gone"
    gone.mkdir()
    write_agent(tmp_path / "a", "name: a\nruntime: {type: adapter, command: [python3, adapter.py]}\n", HANGING_ADAPTER)
    os.chdir(gone)
    try:
        gone.rmdir()
        assert cli.main(["pause", "--manifest", "../a"]) == 1  # a relative path needs the current directory
    finally:
        os.chdir(here)
    said("cwd-gone", capsys.readouterr().err.strip())


def test_a_hanging_adapter_says_what_is_known(tmp_path, capsys):
    agent = write_agent(tmp_path / "hang", "name: hang\nruntime:\n  type: adapter\n  command: [python3, adapter.py]\n"
                                           "  workdir: .\n  timeout_seconds: 1\n", HANGING_ADAPTER)
    argv = ["--manifest", str(agent), "--state-dir", str(tmp_path / "st")]
    assert cli.main(["pause", *argv]) == 1
    lines = capsys.readouterr().err.splitlines()
    said("pause-hangs", re.sub(r"after \d+\.\d s", "after {secs} s", lines[0]))
    said("pause-hangs-next", lines[1], tmp=tmp_path)
    said("pause-hangs-stderr", lines[2])  # redacted
    assert cli.main(["resume", *argv]) == 1
    lines = capsys.readouterr().err.splitlines()
    said("resume-fails-stderr", lines[-1])
    assert cli.main(["resume", *argv, "--json"]) == 1
    stderr = json.loads(capsys.readouterr().out)["adapter_stderr"]
    assert stderr[-1] == lines[-1].strip() and "hunter2canary" not in json.dumps(stderr)


@pytest.mark.skipif(not EXAMPLE.is_dir(), reason="examples/task-agent is not in this checkout")
def test_settings_and_log_name_the_next_step(tmp_path, capsys):
    agent = copy_example(tmp_path)
    argv = ["--manifest", str(agent), "--state-dir", str(tmp_path / "st")]
    assert cli.main(["settings", "set", *argv, "max_7d=abc"]) == 2
    said("settings-not-a-number", capsys.readouterr().err.strip(), tmp=tmp_path)
    assert cli.main(["settings", "set", *argv]) == 2
    said("settings-set-nothing", capsys.readouterr().err.strip(), tmp=tmp_path)
    assert cli.main(["log", *argv, "nosuch.log"]) == 1
    said("log-no-such-name", capsys.readouterr().err.strip(), tmp=tmp_path)


def test_a_process_agent_without_its_runtime_says_how_to_start_it(tmp_path, capsys):
    agent = write_agent(tmp_path / "w", "name: w\nruntime:\n  type: process\n  command: [python3, agent.py]\n"
                                        "status: status.json\n")
    argv = ["--manifest", str(agent), "--state-dir", str(tmp_path / "st")]
    assert cli.main(["pause", *argv]) == 1
    said("process-no-runtime", capsys.readouterr().err.strip(), tmp=tmp_path)
    assert cli.main(["settings", "set", *argv, "x=1"]) == 2
    assert "caldera settings: x: not a setting" in capsys.readouterr().err  # said once, not "settings set: x"


# ---------------------------------------------------------------- run and status from a checkout

def _local_daemon(tmp_path: Path, **extra_env: str) -> tuple[subprocess.Popen, Path]:
    agent = copy_example(tmp_path)
    log = tmp_path / "run.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "caldera.cli", "run", "--manifest", str(agent),
                                 "--state-dir", str(tmp_path / "st")], env=clean_env(**extra_env), cwd=tmp_path,
                                stdin=subprocess.DEVNULL, stdout=sink, stderr=sink, start_new_session=True)
    wait_for(lambda: (tmp_path / "st" / "status.json").is_file() and "staying local" in log.read_text(),
             timeout=60, what="the local daemon's first line and status.json")
    return proc, agent


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0


@pytest.mark.skipif(not EXAMPLE.is_dir(), reason="examples/task-agent is not in this checkout")
def test_run_from_a_checkout_and_status_beside_it(tmp_path, capsys, monkeypatch):
    bare_env(monkeypatch, tmp_path)
    proc, agent = _local_daemon(tmp_path)
    try:
        first = (tmp_path / "run.log").read_text().splitlines()[0]
        said("run-local-by-hand", first, tmp=tmp_path, pid=proc.pid)
        assert not (agent / "agent.env").exists()  # the line says so: "not there yet"
        assert cli.main(["status", "--manifest", str(agent), "--state-dir", str(tmp_path / "st")]) == 0
        lines = capsys.readouterr().out.splitlines()
        said("status-local", next(line for line in lines if line.startswith("connection:")))
        said("status-daemon", next(line for line in lines if line.startswith("daemon:")), pid=proc.pid)
    finally:
        _stop(proc)
    assert cli.main(["status", "--manifest", str(agent), "--state-dir", str(tmp_path / "st")]) == 0
    lines = capsys.readouterr().out.splitlines()
    said("status-not-enabled", next(line for line in lines if line.startswith("connection:")), tmp=tmp_path)
    assert cli.main(["status", "--manifest", str(agent), "--state-dir", str(tmp_path / "elsewhere")]) == 0
    lines = capsys.readouterr().out.splitlines()
    said("status-manifest-state-dir-missing", next(line for line in lines if line.startswith("state dir")),
         tmp=tmp_path)
    said("status-state-dir-missing-daemon", next(line for line in lines if line.startswith("daemon:")),
         name="agent task-agent")
    assert not (tmp_path / "elsewhere").exists()  # status made none
    # Enabled, never connected: then "no heartbeat has succeeded yet" is what is true.
    (agent / "agent.env").write_text("CALDERA_AGENT_ENABLED=true\nCALDERA_BASE_URL=http://127.0.0.1:9\n"
                                     "CALDERA_INSTANCE_ID=7\n")
    assert cli.main(["status", "--manifest", str(agent), "--state-dir", str(tmp_path / "st")]) == 0
    lines = capsys.readouterr().out.splitlines()
    said("status-no-heartbeat", next(line for line in lines if line.startswith("connection:")))


@pytest.mark.skipif(not EXAMPLE.is_dir(), reason="examples/task-agent is not in this checkout")
def test_a_manifest_agents_state_an_older_caldera_kept_here_is_named(tmp_path, capsys, monkeypatch):
    """Before, a --manifest agent's state was ./.caldera-state/NAME under the directory the command
    was typed in: status and run name it there (never moved: a daemon may run on it)."""
    bare_env(monkeypatch, tmp_path)
    agent = copy_example(tmp_path)
    older = tmp_path / "co" / ".caldera-state" / "task-agent"
    older.mkdir(parents=True)
    (older / "state.json").write_text("{}")
    monkeypatch.chdir(tmp_path / "co")
    assert cli.main(["status", "--manifest", str(agent)]) == 0
    said("status-older-state", next(line for line in capsys.readouterr().out.splitlines()
                                    if line.startswith(f"state dir {older}")), tmp=tmp_path)
    assert cli.main(["status", "--manifest", str(agent), "--state-dir", str(older)]) == 0
    assert "older caldera" not in capsys.readouterr().out  # named: nothing to say


@pytest.mark.skipif(not INBOX.is_dir(), reason="examples/inbox-watcher is not in this checkout")
def test_a_manifest_agents_state_is_the_same_wherever_the_command_is_typed(tmp_path, capsys, monkeypatch):
    """`caldera run --manifest iw` typed in the checkout, the other commands typed elsewhere:
    they find its runtime (its state is beside the manifest, not in the current directory),
    a second `run` is refused naming the first, and a verb named with another state dir names
    the running one instead of advising a start (a second copy of the process agent)."""
    bare_env(monkeypatch, tmp_path)
    agent = tmp_path / "co" / "iw"
    shutil.copytree(INBOX, agent, ignore=shutil.ignore_patterns(".caldera-state", "__pycache__"))
    log = tmp_path / "run.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "caldera.cli", "run", "--manifest", "iw"], cwd=agent.parent,
                                env=clean_env(), stdin=subprocess.DEVNULL, stdout=sink, stderr=sink,
                                start_new_session=True)
    try:
        state = agent / ".caldera-state" / "inbox-watcher"
        wait_for(lambda: (state / "status.json").is_file() and "agent started" in log.read_text(), timeout=60,
                 what="the runtime and its agent")
        (tmp_path / "elsewhere").mkdir()
        monkeypatch.chdir(tmp_path / "elsewhere")
        assert cli.main(["status", "--manifest", str(agent)]) == 0
        said("status-daemon", next(line for line in capsys.readouterr().out.splitlines()
                                   if line.startswith("daemon:")), pid=proc.pid)
        again = subprocess.run([sys.executable, "-m", "caldera.cli", "run", "--manifest", str(agent)],
                               cwd=tmp_path / "elsewhere", env=clean_env(), capture_output=True, text=True, timeout=60)
        assert again.returncode == 1
        said("run-twice", again.stderr.strip(), tmp=tmp_path, pid=proc.pid)
        assert cli.main(["pause", "--manifest", str(agent), "--state-dir", str(tmp_path / "other")]) == 1
        said("process-elsewhere", capsys.readouterr().err.strip(), tmp=tmp_path, pid=proc.pid)
        assert cli.main(["pause", "--manifest", str(agent)]) == 0  # through the running runtime
        assert "Paused" in capsys.readouterr().out
    finally:
        _stop(proc)
    assert log.read_text().count("agent started") == 1  # one runtime, one copy of the agent


@pytest.mark.skipif(not EXAMPLE.is_dir(), reason="examples/task-agent is not in this checkout")
def test_status_of_an_installed_agent_without_its_state_variable(tmp_path, monkeypatch, capsys):
    """Installed with both variables, asked for with CALDERA_CONFIG_DIR only: the state is elsewhere."""
    bare_env(monkeypatch, tmp_path)
    monkeypatch.setenv("CALDERA_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.setenv("CALDERA_STATE_DIR", str(tmp_path / "state"))
    assert cli.main(["init", str(EXAMPLE), "--name", "ta"]) == 0
    monkeypatch.setenv("CALDERA_STATE_DIR", str(tmp_path / "forgotten"))  # stands for the default root
    capsys.readouterr()
    assert cli.main(["status", "--agent", "ta"]) == 0
    lines = capsys.readouterr().out.splitlines()
    said("status-state-dir-missing", next(line for line in lines if line.startswith("state dir")), tmp=tmp_path)
    said("status-state-dir-missing-daemon", next(line for line in lines if line.startswith("daemon:")), name="agent ta")
    assert not (tmp_path / "forgotten").exists()
    # Its daemon runs, with the state dir init made: status with the forgotten one says so.
    env = clean_env(CALDERA_CONFIG_DIR=str(tmp_path / "cfg"), CALDERA_STATE_DIR=str(tmp_path / "state"))
    proc = subprocess.Popen([sys.executable, "-m", "caldera.cli", "run", "--agent", "ta"], env=env, cwd=tmp_path,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        wait_for(lambda: (tmp_path / "state" / "ta" / "status.json").is_file(), timeout=60, what="the daemon")
        assert cli.main(["status", "--agent", "ta"]) == 0
        lines = capsys.readouterr().out.splitlines()
        said("status-daemon-elsewhere", next(line for line in lines if line.startswith("daemon:")), tmp=tmp_path,
             pid=proc.pid)
        assert cli.main(["status", "--agent", "ta", "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["connection"]["daemon"] is None and doc["daemon_elsewhere"]["pid"] == proc.pid
    finally:
        _stop(proc)


def _daemon_log(tmp_path: Path, agent: Path, until: str) -> tuple[subprocess.Popen, Path]:
    """`caldera run --manifest AGENT` started by hand, once `until` is in its log."""
    log = tmp_path / f"{agent.name}.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "caldera.cli", "run", "--manifest", str(agent)], cwd=tmp_path,
                                env=clean_env(), stdin=subprocess.DEVNULL, stdout=sink, stderr=sink,
                                start_new_session=True)
    wait_for(lambda: until in log.read_text() or proc.poll() is not None, timeout=60, what=until)
    return proc, log


def test_run_warns_once_of_what_would_go_unsaid(tmp_path):
    """An adapter that cannot start, a misspelled name in agent.env, an older caldera's state
    where the command is typed: each one warning at start, after the line that says how to connect."""
    agent = write_agent(tmp_path / "bad", "name: bad\nruntime:\n  type: adapter\n"
                                          "  command: [python3, no_such_adapter.py]\n  workdir: .\n")
    (agent / "agent.env").write_text("CALDERA_HEARTBEAT_INTERVALL=5\n")
    (tmp_path / ".caldera-state" / "bad").mkdir(parents=True)  # an older caldera's, where run is typed
    (tmp_path / ".caldera-state" / "bad" / "state.json").write_text("{}")
    proc, log = _daemon_log(tmp_path, agent, "cannot start")
    try:
        lines = log.read_text().splitlines()
        assert "staying local" in lines[0], lines
        said("run-unknown-variable", lines[1], tmp=tmp_path)
        said("run-older-state", lines[2], tmp=tmp_path)
        said("run-adapter-cannot-start", lines[3], tmp=tmp_path)
    finally:
        _stop(proc)
    assert log.read_text().count("cannot start") == 1


def test_a_process_agent_that_cannot_start_says_why(tmp_path, capsys):
    """`caldera check` probes the script as it does an adapter's; `caldera run` warns at start and,
    at each exit, logs the agent's last output and where the rest is (agent.log)."""
    agent = write_agent(tmp_path / "miss", "name: miss\nruntime:\n  type: process\n  command: [python3, missing.py]\n")
    assert cli.main(["check", str(agent)]) == 1
    said("check-process-missing-script", next(line for line in capsys.readouterr().out.splitlines() if "FAIL" in line),
         tmp=tmp_path)
    proc, log = _daemon_log(tmp_path, agent, "exited with status 2")
    try:
        lines = log.read_text().splitlines()
        said("run-agent-cannot-start", lines[1], tmp=tmp_path)
        exited = next(line for line in lines if "exited with status 2" in line)
        exited = re.sub(r"after \d+ s", "after {secs} s", re.sub(r"pid \d+", "pid {pid}", exited))
        said("process-exit-last-words", exited, tmp=tmp_path)
    finally:
        _stop(proc)
    assert "can't open file" in (agent / ".caldera-state" / "miss" / "logs" / "agent.log").read_text()


@pytest.mark.skipif(not EXAMPLE.is_dir(), reason="examples/task-agent is not in this checkout")
def test_run_under_systemd_names_the_reload(tmp_path):
    proc, agent = _local_daemon(tmp_path, NOTIFY_SOCKET=str(tmp_path / "no-listener"))
    try:
        said("run-local-systemd", (tmp_path / "run.log").read_text().splitlines()[0], tmp=tmp_path)
    finally:
        _stop(proc)


def test_a_refused_registration_names_the_reload_that_works_here(tmp_path, monkeypatch):
    from caldera.cli import status as status_cli

    doc = {"agent_status": None, "outbox": {"items": 0}, "commands": [],
           "connection": {"last_successful": "never", "auth_blocked": "401 bad token", "daemon": "4242 daemon"}}
    monkeypatch.setattr(status_cli, "SYSTEMD_BOOTED", str(tmp_path / "no-systemd"))
    line = next(line for line in status_cli.render("ta", doc).splitlines() if "registration refused" in line)
    said("status-auth-blocked", line)
    monkeypatch.setattr(status_cli, "SYSTEMD_BOOTED", str(tmp_path))
    line = next(line for line in status_cli.render("ta", doc).splitlines() if "registration refused" in line)
    said("status-auth-blocked-systemd", line)


# ---------------------------------------------------------------- demo, plane, help

def test_a_gauge_name_is_never_cut():
    from caldera.plane import report_view

    class Store:  # what render reads of the plane's store, for one instance
        def clock(self):
            return 100.0

        def agents(self):
            return [{"instance_id": 2, "agent_id": "caldera-2-main", "presence": "online", "last_seen": 99.0,
                     "agent_version": "caldera-0.1.0", "openclaw_status": "running"}]

        def reports(self, instance_id, last=False):
            return {"body": {"agent_status": {"state": {"level": "ok", "label": "Watching"}, "gauges": [
                {"name": "inbox", "used": 0.0, "label": "0 KiB"},
                {"name": "files waiting", "used": 0.0, "label": "0 of 100"}]}}}

        def commands(self, instance_id):
            return []

    lines = report_view.render(Store(), 2).splitlines()
    said("demo-gauge", next(line for line in lines if "files" in line))


def test_help_names_the_demos_two_agents(capsys):
    assert cli.main(["--help"]) == 0
    said("help-demo", next(line for line in capsys.readouterr().out.splitlines() if line.startswith("  demo ")))


@pytest.fixture
def busy_port():
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    try:
        yield holder.getsockname()[1]
    finally:
        holder.close()


def test_plane_on_a_busy_port(tmp_path, capsys, busy_port):
    assert cli.main(["plane", "serve", "--port", str(busy_port), "--db", str(tmp_path / "p.db")]) == 1
    said("plane-busy-port", capsys.readouterr().err.strip(), port=busy_port)


def test_demo_on_a_busy_port(tmp_path, busy_port):
    done = subprocess.run([sys.executable, "-m", "caldera.cli", "demo", "--once", "--port", str(busy_port)],
                          env=clean_env(), capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 1
    said("demo-busy-port", done.stderr.strip(), port=busy_port)


# ---------------------------------------------------------------- turn

def test_turn_without_a_workspace(tmp_path, capsys, monkeypatch):
    bare_env(monkeypatch, tmp_path)
    assert cli.main(["turn", "--workspace", str(tmp_path / "nope"), "hello"]) == 2
    said("turn-no-workspace", capsys.readouterr().err.strip(), tmp=tmp_path)
    assert not (tmp_path / "xdg").exists()  # refused before anything was written


def test_turn_without_secrets_says_where_they_go(tmp_path, capsys, monkeypatch):
    bare_env(monkeypatch, tmp_path)
    monkeypatch.setenv("CALDERA_CONFIG_DIR", str(tmp_path / "none"))
    monkeypatch.setenv("CALDERA_CODEX_BIN", str(tmp_path / "no-codex"))
    assert cli.main(["turn", "--workspace", str(tmp_path), "hello"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("failed (secret-unavailable); log: ")
    said("turn-no-secrets", err[1])


def test_backends_not_found_says_how_to_get_one(tmp_path, capsys, monkeypatch):
    bare_env(monkeypatch, tmp_path)
    monkeypatch.setenv("CALDERA_CONFIG_DIR", str(tmp_path / "none"))
    monkeypatch.setenv("CALDERA_CODEX_BIN", str(tmp_path / "no-codex"))
    monkeypatch.setenv("CALDERA_OPENCODE_BIN", str(tmp_path / "no-opencode"))
    monkeypatch.setenv("CALDERA_CLAUDE_CODE_BIN", str(tmp_path / "no-claude"))
    assert cli.main(["backends"]) == 0
    lines = capsys.readouterr().out.splitlines()
    said("backends-not-found", lines[0], tmp=tmp_path)
    said("backends-claude-code-not-found", lines[1], tmp=tmp_path)
    said("backends-opencode-not-found", lines[2], tmp=tmp_path)


# ---------------------------------------------------------------- README, "Without root", verbatim

def readme_block() -> str:
    section = (REPO / "README.md").read_text().split("### Without root", 1)[1]
    return re.search(r"```sh\n(.*?)```", section, re.S)[1]


@pytest.fixture
def checkout(account):
    """A checkout as README's reader has it after `make test`: examples/ and .venv/bin/activate
    (here a `caldera` that runs the account's interpreter on this checkout), and an empty home;
    the account's, not root's (the section is "Without root")."""
    root = scratch(account)
    try:
        shutil.copytree(EXAMPLE, root / "co" / "examples" / "task-agent",
                        ignore=shutil.ignore_patterns("data", "__pycache__", ".caldera-state"))
        venv = root / "co" / ".venv" / "bin"
        venv.mkdir(parents=True)
        (venv / "activate").write_text(f'PATH="{venv}:$PATH"; export PATH\n')
        (venv / "caldera").write_text(f'#!/bin/sh\nPYTHONPATH="{REPO}" exec "{account.python}" -m caldera.cli "$@"\n')
        (venv / "caldera").chmod(0o755)
        (root / "home").mkdir()
        account.give(root)
        yield root, account
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.skipif(not EXAMPLE.is_dir(), reason="examples/task-agent is not in this checkout")
def test_readme_without_root_verbatim(checkout):
    """README's block as written, in bash, in the checkout; its last line (`caldera run`) runs
    until Ctrl-C; meanwhile "another terminal" (the same two first lines) asks for status."""
    root, account = checkout
    block = readme_block()
    # Without both, `caldera init` would write /etc/caldera and /var/lib/caldera (as root: for real).
    assert "CALDERA_CONFIG_DIR=$HOME/" in block and "CALDERA_STATE_DIR=$HOME/" in block, block
    env = clean_env(HOME=str(root / "home"), PATH="/usr/local/bin:/usr/bin:/bin")
    out = root / "block.out"
    with open(out, "wb") as sink:
        shell = subprocess.Popen(["bash", "-c", block], cwd=root / "co", env=env, stdin=subprocess.DEVNULL,
                                 stdout=sink, stderr=subprocess.STDOUT, start_new_session=True, **account.as_kwargs())
    try:
        state = root / "home" / ".local" / "state" / "caldera" / "task-agent"
        wait_for(lambda: shell.poll() is not None or "staying local" in out.read_text(), timeout=120,
                 what="the block's caldera run")
        assert shell.poll() is None, out.read_text()
        wait_for(lambda: (state / "status.json").is_file(), timeout=60, what="the daemon's status.json")
        lines = out.read_text().splitlines()
        systemd = Path(blueprint.SYSTEMD_DIR).is_dir()  # a developer's machine: init says so
        said("readme-init-systemd" if systemd else "readme-init", lines[0], home=root / "home")
        said("readme-status-before-run", next(line for line in lines if line.startswith("daemon:")))
        other = "\n".join(block.splitlines()[:2] + ["caldera status --agent task-agent"])
        done = subprocess.run(["bash", "-c", other], cwd=root / "co", env=env, capture_output=True, text=True,
                              timeout=60, **account.as_kwargs())
        assert done.returncode == 0, done.stderr
        said("readme-status-while-running",
             next(line for line in done.stdout.splitlines() if line.startswith("daemon:")), pid=_daemon_pid(state))
    finally:
        os.killpg(shell.pid, signal.SIGINT)  # Ctrl-C, to the shell's foreground group
        code = shell.wait(timeout=60)
    assert code == 0, out.read_text()
    config = root / "home" / ".config" / "caldera" / "agents"
    assert sorted(p.name for p in config.iterdir()) == ["task-agent"]
    assert sorted(p.name for p in state.parent.iterdir()) == ["task-agent"]  # one state dir, where init made it
    assert state.stat().st_uid == account.uid  # not root's: "Without root" was tried without it


def _daemon_pid(state: Path) -> int:
    return int(json.loads((state / "status.json").read_text())["daemon_pid"])
