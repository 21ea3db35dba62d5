"""Issue 23: which account runs an agent (SPEC section 11). `caldera init` chooses it
(refusing bad set-ups with a sentence), writes the per-instance drop-in, gives the
agent's files to it, and moves an agent between the two kinds keeping state and session."""
import json
import os
import pwd
import shutil

import pytest
from adapter_helpers import EXAMPLE, copy_example

from caldera.agents import account, blueprint
from caldera.agents.blueprint import Refused
from caldera.cli import main

USERS = {"agent": 4242, "other": 4343, "daemon": 1, "caldera": 998, "root": 0}


def _entry(name, uid):
    home = f"/home/{name}" if uid >= 1000 else ("/root" if uid == 0 else f"/var/lib/{name}")
    return pwd.struct_passwd((name, "x", uid, uid, "", home, "/bin/sh"))


@pytest.fixture
def accounts(monkeypatch):
    """A passwd of our own; paths in `owners` report that uid; chown calls recorded, not made."""
    by_uid = {uid: name for name, uid in USERS.items()}

    def getpwnam(name):
        if name not in USERS:
            raise KeyError(name)
        return _entry(name, USERS[name])

    def getpwuid(uid):
        if uid not in by_uid:
            raise KeyError(uid)
        return _entry(by_uid[uid], uid)

    monkeypatch.setattr(pwd, "getpwnam", getpwnam)
    monkeypatch.setattr(pwd, "getpwuid", getpwuid)
    monkeypatch.setattr(account, "_group_name", lambda gid: by_uid.get(gid, str(gid)))
    owners = {}
    real_stat = os.stat

    def fake_stat(path, *args, **kwargs):
        st = real_stat(path, *args, **kwargs)
        uid = owners.get(os.path.normpath(os.fspath(path)))
        if uid is None:
            return st
        return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, uid, uid, st.st_size,
                               int(st.st_atime), int(st.st_mtime), int(st.st_ctime)))

    monkeypatch.setattr(account.os, "stat", fake_stat)
    chowned = {}
    monkeypatch.setattr(account.os, "chown", lambda path, uid, gid: chowned.__setitem__(str(path), (uid, gid)))
    monkeypatch.setattr(account.os, "lchown", lambda path, uid, gid: chowned.__setitem__(str(path), (uid, gid)))
    return owners, chowned


def _config_owner(chowned, name):
    """The last owner given to a config file (chowned in the staging dir, then renamed in)."""
    return [owner for path, owner in chowned.items() if path.endswith(f"/{name}") and "/agents/" in path][-1]


def _checkout(tmp_path, owners, uid=USERS["agent"]):
    """Seed 000's checkout: its manifest (workdir made this checkout) and minimal adapter, a .venv link."""
    checkout = tmp_path / "home" / "agent" / "task-agent"
    (checkout / "caldera").mkdir(parents=True)
    (checkout / ".venv" / "bin").mkdir(parents=True)
    os.symlink("/usr/bin/python3", checkout / ".venv" / "bin" / "python")  # refused in a bundle, fine here
    home_example = EXAMPLE.parent / "home-agent"
    text = (home_example / "caldera.agent.yaml").read_text().replace("/home/agent/task-agent", str(checkout))
    (checkout / "caldera.agent.yaml").write_text(text)
    shutil.copy(home_example / "caldera" / "adapter.py", checkout / "caldera" / "adapter.py")
    owners[str(checkout)] = uid
    return checkout


def test_init_refuses_a_missing_account_a_foreign_workdir_and_a_system_account(tmp_path, caldera_env, accounts):
    owners, _ = accounts
    checkout = _checkout(tmp_path, owners)
    cases = {"nobody-here": "--user nobody-here: no such account on this host",
             "other": f"runtime.workdir {checkout} belongs to agent, not other",
             "daemon": "daemon (uid 1) is a system account",
             "root": "root (uid 0) is a system account"}
    for user, sentence in cases.items():
        with pytest.raises(Refused) as caught:
            blueprint.install(checkout, name="task-agent", user=user, unit_dir=tmp_path / "units")
        assert sentence in str(caught.value), caught.value
    assert not (caldera_env / "etc" / "agents" / "task-agent").exists()
    assert not (tmp_path / "units").exists()


def test_the_cli_says_the_refusal_in_one_sentence(tmp_path, caldera_env, accounts, capsys):
    owners, _ = accounts
    checkout = _checkout(tmp_path, owners)
    assert main(["init", str(checkout), "--name", "task-agent", "--user", "other"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "belongs to agent, not other" in err


def test_a_home_agent_with_a_relative_workdir_is_refused(tmp_path, caldera_env, accounts):
    owners, _ = accounts
    source = copy_example(tmp_path).parent  # workdir relative: a bundle agent
    with pytest.raises(Refused, match="absolute path"):
        blueprint.install(source, name="ops", user="agent", unit_dir=tmp_path / "units")


def test_a_home_agent_installs_only_its_manifest_with_its_drop_in_and_owners(tmp_path, caldera_env, accounts):
    owners, chowned = accounts
    checkout = _checkout(tmp_path, owners)
    units = tmp_path / "units"
    units.mkdir()
    result = blueprint.install(checkout, name="task-agent", user="agent", unit_dir=units)
    config = caldera_env / "etc" / "agents" / "task-agent"
    state = caldera_env / "var" / "task-agent"
    assert result["kind"] == "home" and result["user"] == "agent" and result["bundle_files"] == 0
    assert not (config / "bundle").exists()  # the agent lives where it is: nothing copied, links and all
    assert sorted(p.name for p in config.iterdir()) == ["agent.env", "caldera.agent.yaml", "secrets.env"]
    drop_in = units / "caldera@task-agent.service.d" / "caldera-account.conf"
    assert result["drop_in"] == str(drop_in)
    lines = [line for line in drop_in.read_text().splitlines() if line and not line.startswith("#")]
    assert lines == ["[Service]", "User=agent", "Group=agent", "ProtectHome=tmpfs", "BindPaths=/home/agent"]
    assert drop_in.stat().st_mode & 0o777 == 0o644
    assert _config_owner(chowned, "agent.env") == (0, 4242)
    assert _config_owner(chowned, "secrets.env") == (4242, 4242)
    assert (config / "secrets.env").stat().st_mode & 0o777 == 0o600
    assert (config / "agent.env").stat().st_mode & 0o777 == 0o640
    assert chowned[str(state)] == (4242, 4242) and chowned[str(state / "logs")] == (4242, 4242)
    assert "runs as agent" in result["message"]


def test_the_account_is_derived_from_a_workdir_in_its_owners_home(tmp_path, caldera_env, accounts, monkeypatch):
    owners, _ = accounts
    checkout = _checkout(tmp_path, owners)
    real = pwd.getpwuid
    home = str(checkout.parent)  # agent's home, in this test

    def getpwuid(uid):
        if uid == USERS["agent"]:
            return pwd.struct_passwd(("agent", "x", uid, uid, "", home, "/bin/sh"))
        return real(uid)

    monkeypatch.setattr(pwd, "getpwuid", getpwuid)
    chosen = account.choose(str(checkout), None)
    assert chosen is not None and chosen.name == "agent" and chosen.is_home
    # Outside its owner's home: not derived (a bundle agent, as before).
    elsewhere = tmp_path / "srv"
    elsewhere.mkdir()
    owners[str(elsewhere)] = USERS["agent"]
    chosen = account.choose(str(elsewhere), None)
    assert chosen is None or not chosen.is_home
    assert account.choose("relative/dir", None) is None or not account.choose("relative/dir", None).is_home


def test_moving_between_the_kinds_keeps_state_and_session_and_fixes_owners(tmp_path, caldera_env, accounts,
                                                                         monkeypatch):
    owners, chowned = accounts
    monkeypatch.setattr(account.os, "geteuid", lambda: 0)  # root installs: caldera's files are caldera's
    units = tmp_path / "units"
    units.mkdir()
    bundle_source = copy_example(tmp_path).parent
    assert blueprint.install(bundle_source, name="task-agent", unit_dir=units)["user"] == "caldera"
    config = caldera_env / "etc" / "agents" / "task-agent"
    state = caldera_env / "var" / "task-agent"
    (config / "secrets.env").write_text("CALDERA_TOKEN=kept\n")
    (state / "session.json").write_text('{"token": "session-kept"}')
    (state / "outbox").mkdir()
    (state / "outbox" / "001-state.json").write_text("{}")
    drop_in = account.drop_in_path("task-agent", units)
    assert not drop_in.exists()

    chowned.clear()
    checkout = _checkout(tmp_path, owners)
    moved = blueprint.install(checkout, name="task-agent", user="agent", unit_dir=units)
    assert "Moved from caldera to agent" in moved["message"]
    assert drop_in.exists() and not (config / "bundle").exists()
    assert (config / "secrets.env").read_text() == "CALDERA_TOKEN=kept\n"
    assert (state / "session.json").read_text() == '{"token": "session-kept"}'
    for path in (state, state / "session.json", state / "outbox", state / "outbox" / "001-state.json"):
        assert chowned[str(path)] == (4242, 4242), path
    assert _config_owner(chowned, "secrets.env") == (4242, 4242)

    chowned.clear()
    back = blueprint.install(bundle_source, name="task-agent", unit_dir=units)
    assert "Moved from agent to caldera" in back["message"]
    assert not drop_in.exists() and not drop_in.parent.exists()
    assert (config / "bundle" / "adapter.py").exists()
    assert (state / "session.json").read_text() == '{"token": "session-kept"}'
    assert chowned[str(state / "session.json")] == (998, 998)
    assert _config_owner(chowned, "secrets.env") == (998, 998) and _config_owner(chowned, "agent.env") == (0, 998)

    # Same kind again: refused as ever, nothing changed.
    with pytest.raises(Refused, match="already installed"):
        blueprint.install(bundle_source, name="task-agent", unit_dir=units)


def test_a_manifest_only_blueprint_installs(tmp_path, caldera_env):
    source = tmp_path / "bp"
    source.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(EXAMPLE.parent / "home-agent" / "caldera" / "adapter.py", work / "adapter.py")
    (source / "caldera.agent.yaml").write_text(
        "name: only-manifest\nversion: 1.0.0\nruntime:\n  type: adapter\n"
        f"  command: [python3, adapter.py]\n  workdir: {work}\n")
    result = blueprint.install(source)
    assert result["bundle_files"] == 0, result
    assert not (caldera_env / "etc" / "agents" / "only-manifest" / "bundle").exists()


def test_installed_user_reads_the_drop_in(tmp_path):
    assert account.installed_user("x", tmp_path) == "caldera"
    agent = account.Account("agent", 4242, 4242, "agent", "/home/agent", "home")
    assert account.write_drop_in("x", agent, tmp_path) is not None
    assert account.installed_user("x", tmp_path) == "agent"
    assert account.write_drop_in("x", None, tmp_path) is None
    assert not (tmp_path / "caldera@x.service.d").exists()


def test_uid_min_comes_from_login_defs(tmp_path):
    defs = tmp_path / "login.defs"
    defs.write_text("# comment\nUID_MIN\t\t\t 2000\nUID_MAX 60000\n")
    assert account.uid_min(defs) == 2000
    assert account.uid_min(tmp_path / "missing") == 1000
    assert account.is_system_account(_entry("agent", 1500), defs)
    assert not account.is_system_account(_entry("agent", 2500), defs)
    assert account.is_system_account(_entry("nobody", 65534), defs)


def test_init_json_names_the_account(tmp_path, caldera_env, accounts, capsys):
    owners, _ = accounts
    checkout = _checkout(tmp_path, owners)
    assert main(["init", str(checkout), "--name", "task-agent", "--user", "agent", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["user"] == "agent" and body["kind"] == "home"
