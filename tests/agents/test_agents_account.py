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


def _entry(name, uid, homes="/home"):
    home = f"{homes}/{name}" if uid >= 1000 else ("/root" if uid == 0 else f"/var/lib/{name}")
    return pwd.struct_passwd((name, "x", uid, uid, "", home, "/bin/sh"))


@pytest.fixture
def accounts(monkeypatch, tmp_path):
    """A passwd of our own (regular accounts' homes in tmp_path/home); paths in `owners`
    report that uid; chown calls recorded, not made."""
    by_uid = {uid: name for name, uid in USERS.items()}
    homes = str(tmp_path / "home")

    def getpwnam(name):
        if name not in USERS:
            raise KeyError(name)
        return _entry(name, USERS[name], homes)

    def getpwuid(uid):
        if uid not in by_uid:
            raise KeyError(uid)
        return _entry(by_uid[uid], uid, homes)

    monkeypatch.setattr(pwd, "getpwnam", getpwnam)
    monkeypatch.setattr(pwd, "getpwuid", getpwuid)
    monkeypatch.setattr(account, "_group_name", lambda gid: by_uid.get(gid, str(gid)))
    owners = {}
    real_stat, real_lstat, real_fstat = os.stat, os.lstat, os.fstat

    def faked(st, path):
        if isinstance(path, int):
            path = _fd_path(path)
        uid = None
        if path is not None:
            # a file takes the owner set for it or for its nearest directory: a checkout is its
            # account's through and through (as root or not, whoever really owns the temp tree)
            here = os.path.normpath(os.fspath(path))
            while uid is None and here not in ("/", ""):
                uid, here = owners.get(here), os.path.dirname(here)
        if uid is None:
            return st
        return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, uid, uid, st.st_size,
                               int(st.st_atime), int(st.st_mtime), int(st.st_ctime)))

    def fake_stat(path, *args, **kwargs):
        return faked(real_stat(path, *args, **kwargs), None if kwargs.get("dir_fd") is not None else path)

    def fake_lstat(path, *args, **kwargs):
        return faked(real_lstat(path, *args, **kwargs), None if kwargs.get("dir_fd") is not None else path)

    def fake_fstat(fd):
        return faked(real_fstat(fd), _fd_path(fd))

    monkeypatch.setattr(account.os, "stat", fake_stat)
    monkeypatch.setattr(account.os, "lstat", fake_lstat)
    monkeypatch.setattr(account.os, "fstat", fake_fstat)
    chowned = {}

    def chown(path, uid, gid, *, dir_fd=None, follow_symlinks=True):
        where = os.path.join(_fd_path(dir_fd), path) if dir_fd is not None else str(path)
        chowned[where] = (uid, gid)

    monkeypatch.setattr(account.os, "chown", chown)
    monkeypatch.setattr(account.os, "lchown", lambda path, uid, gid: chowned.__setitem__(str(path), (uid, gid)))
    monkeypatch.setattr(account.os, "fchown", lambda fd, uid, gid: chowned.__setitem__(_fd_path(fd), (uid, gid)))
    return owners, chowned


def _fd_path(fd):
    """The path an open fd names (Linux: /proc/self/fd)."""
    return os.readlink(f"/proc/self/fd/{fd}")


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
             "other": f"{checkout} belongs to agent, not other",
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
    owners[str(source)] = USERS["agent"]
    (tmp_path / "home" / "agent").mkdir(parents=True)
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
    assert lines == ["[Service]", "User=agent", "Group=agent", "ProtectHome=tmpfs", f"BindPaths={tmp_path}/home/agent"]
    assert drop_in.stat().st_mode & 0o777 == 0o644
    assert _config_owner(chowned, "agent.env") == (0, 4242)
    assert _config_owner(chowned, "secrets.env") == (4242, 4242)
    assert (config / "secrets.env").stat().st_mode & 0o777 == 0o600
    assert (config / "agent.env").stat().st_mode & 0o777 == 0o640
    assert chowned[str(state)] == (4242, 4242) and chowned[str(state / "logs")] == (4242, 4242)
    assert "runs as agent" in result["message"]


def test_the_account_is_never_derived_from_the_manifests_workdir(tmp_path, caldera_env, accounts):
    """Review of issue 23, HIGH 2: user X's manifest says `workdir: /home/bob`; without --user
    that is a bundle agent (run as caldera), never a drop-in with User=bob."""
    owners, _ = accounts
    checkout = _checkout(tmp_path, owners)  # agent's checkout, agent's home: still not derived
    assert account.choose(str(checkout), None) is None or not account.choose(str(checkout), None).is_home
    units = tmp_path / "units"
    units.mkdir()
    source = tmp_path / "x-agent"
    source.mkdir()
    (source / "caldera.agent.yaml").write_text(
        "name: x-agent\nversion: 1.0.0\nruntime:\n  type: adapter\n"
        f"  command: [python3, adapter.py]\n  workdir: {checkout}\n")
    result = blueprint.install(source, name="x-agent", unit_dir=units)
    assert result["kind"] == "bundle" and result["user"] in (None, "caldera"), result
    assert not account.drop_in_path("x-agent", units).exists()


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
    assert "caldera could have kept a copy of secrets.env: rotate the token" in moved["message"]
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


# ------------------------------------------------------------ review of issue 23

def _planted(tmp_path):
    """A directory standing for /etc: what a link planted by the service user points to."""
    target = tmp_path / "etc-standin"
    (target / "sub").mkdir(parents=True)
    (target / "passwd").write_text("root:x:0:0\n")
    os.chmod(target, 0o755)
    return target


def _untouched(target, chowned):
    assert target.stat().st_mode & 0o777 == 0o755
    assert not [p for p in chowned if p.startswith(str(target))], chowned


def test_a_state_dir_planted_as_a_link_is_refused_and_nothing_changes(tmp_path, caldera_env, accounts, monkeypatch):
    """HIGH 1: /var/lib/caldera/NAME -> /etc before `sudo caldera init --name NAME`."""
    owners, chowned = accounts
    monkeypatch.setattr(account.os, "geteuid", lambda: 0)
    target = _planted(tmp_path)
    state = caldera_env / "var" / "task-agent"
    state.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, state)
    with pytest.raises(Refused, match="not a directory of its own.*changed nothing there"):
        blueprint.install(copy_example(tmp_path).parent, name="task-agent", unit_dir=tmp_path / "units")
    _untouched(target, chowned)
    assert not (caldera_env / "etc" / "agents" / "task-agent").exists()
    assert sorted(p.name for p in target.iterdir()) == ["passwd", "sub"]


def test_a_kind_switch_follows_no_link_planted_in_the_state_dir(tmp_path, caldera_env, accounts, monkeypatch):
    """MEDIUM 3: logs -> /etc planted before a kind switch: refused; a link deeper in the
    state dir is handed over as a link (never what it points to)."""
    owners, chowned = accounts
    monkeypatch.setattr(account.os, "geteuid", lambda: 0)
    units = tmp_path / "units"
    units.mkdir()
    blueprint.install(copy_example(tmp_path).parent, name="task-agent", unit_dir=units)
    state = caldera_env / "var" / "task-agent"
    target = _planted(tmp_path)
    shutil.rmtree(state / "logs")
    os.symlink(target, state / "logs")
    checkout = _checkout(tmp_path, owners)
    chowned.clear()
    with pytest.raises(Refused, match="logs is not a directory of its own"):
        blueprint.install(checkout, name="task-agent", user="agent", unit_dir=units)
    _untouched(target, chowned)
    assert not account.drop_in_path("task-agent", units).exists()

    os.unlink(state / "logs")
    (state / "outbox").mkdir()
    os.symlink(target, state / "outbox" / "etc")
    os.symlink(target / "passwd", state / "session.json")
    blueprint.install(checkout, name="task-agent", user="agent", unit_dir=units)
    assert chowned[str(state / "outbox" / "etc")] == (4242, 4242)  # the link itself
    _untouched(target, chowned)
    assert (state / "logs").is_dir() and not (state / "logs").is_symlink()


def test_a_tree_to_give_is_opened_refusing_a_linked_top(tmp_path, accounts):
    owners, chowned = accounts
    target = _planted(tmp_path)
    os.symlink(target, tmp_path / "state")
    with pytest.raises(account.AccountRefused, match="not a directory of its own"):
        account.open_dir(tmp_path / "state")  # what give_tree_fd is then given: nothing
    _untouched(target, chowned)


def test_a_linked_secret_projection_is_refused(tmp_path, caldera_env, accounts, monkeypatch):
    owners, chowned = accounts
    monkeypatch.setattr(account.os, "geteuid", lambda: 0)
    units = tmp_path / "units"
    units.mkdir()
    blueprint.install(copy_example(tmp_path).parent, name="task-agent", unit_dir=units)
    target = _planted(tmp_path)
    os.symlink(target, caldera_env / "etc" / "agents" / "task-agent" / "secrets")
    chowned.clear()
    with pytest.raises(Refused, match="secrets is not a directory of its own"):
        blueprint.install(_checkout(tmp_path, owners), name="task-agent", user="agent", unit_dir=units)
    _untouched(target, chowned)


def _home(tmp_path, name="agent"):
    home = tmp_path / "home" / name
    home.mkdir(parents=True, exist_ok=True)
    return home


def test_a_home_agent_needs_its_checkout_and_manifest_to_be_the_accounts(tmp_path, caldera_env, accounts):
    """HIGH 2 and LOW 6: the checkout directory and its manifest belong to the account; the
    manifest is read without following a link (its target never shows in the sentence)."""
    owners, _ = accounts
    checkout = _checkout(tmp_path, owners)
    manifest = checkout / "caldera.agent.yaml"
    owners[str(manifest)] = USERS["other"]
    with pytest.raises(Refused, match="caldera.agent.yaml belongs to other, not agent"):
        blueprint.install(checkout, name="task-agent", user="agent", unit_dir=tmp_path / "units")
    owners[str(manifest)] = 0  # root's: allowed
    blueprint.install(checkout, name="task-agent", user="agent", unit_dir=tmp_path / "units")

    secret = tmp_path / "shadow"
    secret.write_text("root:$6$secret-hash:19000::::::\n")
    linked = tmp_path / "home" / "agent" / "linked"
    linked.mkdir()
    owners[str(linked)] = USERS["agent"]
    os.symlink(secret, linked / "caldera.agent.yaml")
    with pytest.raises(Refused) as caught:
        blueprint.install(linked, name="linked", user="agent", unit_dir=tmp_path / "units")
    assert "a link" in str(caught.value) and "secret-hash" not in str(caught.value)


def test_a_home_agent_workdir_outside_the_home_is_refused(tmp_path, caldera_env, accounts):
    """MEDIUM 4 (and HIGH 2): the workdir lies inside the account's home, which the drop-in binds."""
    owners, _ = accounts
    checkout = _checkout(tmp_path, owners)
    _home(tmp_path, "bob")
    elsewhere = tmp_path / "home" / "bob" / "work"
    elsewhere.mkdir()
    owners[str(elsewhere)] = USERS["agent"]  # even owned by agent: outside agent's home
    text = (checkout / "caldera.agent.yaml").read_text().replace(f"workdir: {checkout}", f"workdir: {elsewhere}")
    (checkout / "caldera.agent.yaml").write_text(text)
    with pytest.raises(Refused, match=f"is not inside agent's home {tmp_path}/home/agent"):
        blueprint.install(checkout, name="task-agent", user="agent", unit_dir=tmp_path / "units")


@pytest.mark.parametrize("home", ["/", "", "/nonexistent/agent", "/home/a\nb"])
def test_a_home_that_is_missing_or_root_is_refused(tmp_path, home):
    entry = pwd.struct_passwd(("agent", "x", 4242, 4242, "", home, "/bin/sh"))
    with pytest.raises(account.AccountRefused, match="agent.s home"):
        account._home_account(entry, f"{home}/task-agent", account.LOGIN_DEFS)


def test_the_drop_in_escapes_the_home_for_systemd():
    """MEDIUM 4: specifiers doubled, BindPaths' `:` and backslash escaped, spaces quoted."""
    assert account.unit_path("/home/agent") == "/home/agent"
    assert account.unit_path("/home/a b") == '"/home/a b"'
    assert account.unit_path("/home/50%:x") == "/home/50%%\\:x"
    assert account.unit_path('/home/q"\\') == '/home/q\\"\\\\'
    with pytest.raises(ValueError):
        account.unit_path("/home/a\nb")
    agent = account.Account("agent", 4242, 4242, "agent", "/home/my agent%i", "home")
    assert 'BindPaths="/home/my agent%%i"' in account.drop_in_text(agent).splitlines()


def test_a_kind_switch_under_a_running_instance_is_refused(tmp_path, caldera_env, accounts, monkeypatch):
    """MEDIUM 5: stop it first; nothing changed."""
    owners, _ = accounts
    monkeypatch.setattr(account.os, "geteuid", lambda: 0)
    units, systemd = tmp_path / "units", tmp_path / "run-systemd"
    units.mkdir()
    systemd.mkdir()
    monkeypatch.setattr(blueprint, "_daemon_reload", lambda: None)
    blueprint.install(copy_example(tmp_path).parent, name="task-agent", unit_dir=units, systemd_dir=systemd)
    asked = []
    monkeypatch.setattr(blueprint, "_instance_active", lambda name: asked.append(name) or True)
    config = caldera_env / "etc" / "agents" / "task-agent"
    before = (config / "caldera.agent.yaml").read_bytes()
    checkout = _checkout(tmp_path, owners)
    with pytest.raises(Refused, match=r"caldera@task-agent is running: stop it first \(sudo systemctl stop"):
        blueprint.install(checkout, name="task-agent", user="agent", unit_dir=units, systemd_dir=systemd)
    assert asked == ["task-agent"]
    assert (config / "caldera.agent.yaml").read_bytes() == before and (config / "bundle").is_dir()
    assert not account.drop_in_path("task-agent", units).exists()
    monkeypatch.setattr(blueprint, "_instance_active", lambda name: False)
    moved = blueprint.install(checkout, name="task-agent", user="agent", unit_dir=units, systemd_dir=systemd)
    assert "Moved from caldera to agent" in moved["message"]
    assert "sudo systemctl start caldera@task-agent runs it as agent" in moved["message"] or \
        "the caldera@task-agent unit reads" in moved["message"]
