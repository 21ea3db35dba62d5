"""Root acting on an installed agent becomes its service user; permission errors exit 2."""
import os
import pwd
import stat

from core_helpers import install_agent

from caldera.cli import main
from caldera.host import privdrop


def _entry(uid):
    return pwd.struct_passwd(("caldera", "x", uid, uid, "", "/var/lib/caldera", "/usr/sbin/nologin"))


def test_nobody_switches_when_not_root(tmp_path, monkeypatch):
    monkeypatch.setattr(privdrop.os, "geteuid", lambda: 1000)
    assert privdrop.service_user_for(tmp_path) is None


def test_root_switches_only_where_the_service_user_owns_the_state_root(tmp_path, monkeypatch):
    owner = os.stat(tmp_path).st_uid or 4242
    monkeypatch.setattr(privdrop.os, "geteuid", lambda: 0)
    monkeypatch.setattr(pwd, "getpwnam", lambda name: _entry(owner))
    monkeypatch.setattr(privdrop.os, "stat", lambda path: os.stat_result((0, 0, 0, 0, owner, owner, 0, 0, 0, 0)))
    assert privdrop.service_user_for(tmp_path).pw_uid == owner
    monkeypatch.setattr(pwd, "getpwnam", lambda name: _entry(owner + 1))
    assert privdrop.service_user_for(tmp_path) is None  # a checkout, a test dir: stays root
    monkeypatch.setattr(pwd, "getpwnam", lambda name: (_ for _ in ()).throw(KeyError(name)))
    assert privdrop.service_user_for(tmp_path) is None  # no such user


def test_root_state_verbs_switch_before_they_run(caldera_env, monkeypatch):
    install_agent(caldera_env)
    seen = []
    monkeypatch.setattr(privdrop, "service_user_for", lambda root, agent=None: _entry(4242))
    monkeypatch.setattr(privdrop, "become", lambda entry: seen.append(entry.pw_uid))
    assert main(["pause", "--agent", "demo"]) == 0
    assert main(["init", "/nonexistent"]) != 0  # init writes /etc as root: no switch
    assert seen == [4242]


def test_inside_an_instance_every_command_stays_the_images_user(caldera_env, monkeypatch, tmp_path):
    """Issue 22: with the state in ClawManager's persistent dir (set, and no CALDERA_STATE_DIR),
    root stays root: the platform's volume is the image user's, not the service user's."""
    install_agent(caldera_env)
    seen = []
    monkeypatch.setattr(privdrop, "service_user_for", lambda root, agent=None: _entry(4242))
    monkeypatch.setattr(privdrop, "become", lambda entry: seen.append(entry.pw_uid))
    monkeypatch.delenv("CALDERA_STATE_DIR")
    monkeypatch.setenv("CLAWMANAGER_AGENT_PERSISTENT_DIR", str(tmp_path / "config"))
    assert main(["pause", "--agent", "demo"]) == 0
    assert (tmp_path / "config" / "caldera-agent").is_dir()  # the state went to the persistent dir
    assert seen == []
    monkeypatch.setenv("CALDERA_STATE_DIR", str(tmp_path / "var"))  # a state dir named: the host's rule again
    assert main(["pause", "--agent", "demo"]) == 0
    assert seen == [4242]


def test_a_permission_error_exits_2_naming_the_file(caldera_env, monkeypatch, capsys):
    config = install_agent(caldera_env)
    real_open = open

    def refusing_open(path, *args, **kwargs):
        if str(path) == str(config / "agent.env"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", refusing_open)
    assert main(["report", "--once", "--agent", "demo", "--deadline", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{config / 'agent.env'}: permission denied for user" in err
    assert len(err.strip().splitlines()) == 1


def test_root_becomes_the_account_that_owns_the_agents_state_dir(tmp_path, monkeypatch):
    """Issue 23: a home agent's state dir is its account's; root's verbs become that account,
    a bundle agent's (the state dir caldera's, or root's) stay caldera's."""
    (tmp_path / "home-agent").mkdir()
    (tmp_path / "bundle-agent").mkdir()
    uids = {str(tmp_path): 998, str(tmp_path / "home-agent"): 4242, str(tmp_path / "bundle-agent"): 998,
            str(tmp_path / "rooted"): 0}
    monkeypatch.setattr(privdrop.os, "geteuid", lambda: 0)
    monkeypatch.setattr(pwd, "getpwnam", lambda name: _entry(998))

    def getpwuid(uid):
        if uid == 4242:
            return pwd.struct_passwd(("agent", "x", 4242, 4242, "", "/home/agent", "/bin/bash"))
        if uid == 998:
            return _entry(998)
        raise KeyError(uid)

    monkeypatch.setattr(pwd, "getpwuid", getpwuid)
    def fake_stat(path):
        if str(path) not in uids:
            raise FileNotFoundError(2, "No such file", str(path))
        return os.stat_result((stat.S_IFDIR | 0o711, 0, 0, 0, uids[str(path)], 0, 0, 0, 0, 0))

    monkeypatch.setattr(privdrop.os, "stat", fake_stat)
    monkeypatch.setattr(privdrop.os, "lstat", fake_stat)
    assert privdrop.service_user_for(tmp_path, agent="home-agent").pw_name == "agent"
    assert privdrop.service_user_for(tmp_path, agent="bundle-agent").pw_name == "caldera"
    assert privdrop.service_user_for(tmp_path, agent="rooted").pw_name == "caldera"  # never root
    assert privdrop.service_user_for(tmp_path, agent="missing").pw_name == "caldera"
    assert privdrop.service_user_for(tmp_path, agent="../etc").pw_name == "caldera"
    # Without --agent: the only agent installed decides; with two, the service user.
    assert privdrop.service_user_for(tmp_path).pw_name == "caldera"
    (tmp_path / "bundle-agent").rmdir()
    assert privdrop.service_user_for(tmp_path).pw_name == "agent"


def test_root_verbs_name_the_agent_to_privdrop(caldera_env, monkeypatch):
    install_agent(caldera_env)
    asked = []
    monkeypatch.setattr(privdrop, "service_user_for", lambda root, agent=None: asked.append(agent))
    assert main(["pause", "--agent", "demo"]) == 0
    assert asked == ["demo"]


def test_a_state_dir_that_is_a_link_is_not_whom_root_becomes(tmp_path, monkeypatch, capsys):
    """Review of issue 23, LOW 7: the state root is the service user's; a link it plants as
    NAME (-> a home of another account) must not make root become that account."""
    victim = tmp_path / "victim-home"
    victim.mkdir()
    state_root = tmp_path / "state"
    state_root.mkdir()
    os.symlink(victim, state_root / "planted")
    real_stat, real_lstat = os.stat, os.lstat
    uids = {str(state_root): 998, str(victim): 4242}

    def owned(real):
        def fake(path, *args, **kwargs):
            st = real(path, *args, **kwargs)
            uid = uids.get(os.path.realpath(path) if real is real_stat else str(path))
            return st if uid is None else os.stat_result((st.st_mode, 0, 0, 0, uid, uid, 0, 0, 0, 0))
        return fake

    monkeypatch.setattr(privdrop.os, "stat", owned(real_stat))
    monkeypatch.setattr(privdrop.os, "lstat", owned(real_lstat))
    monkeypatch.setattr(privdrop.os, "geteuid", lambda: 0)
    monkeypatch.setattr(pwd, "getpwnam", lambda name: _entry(998))
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: pwd.struct_passwd(
        ("agent" if uid == 4242 else "caldera", "x", uid, uid, "", "/home/x", "/bin/sh")))
    assert privdrop.service_user_for(state_root, agent="planted").pw_name == "caldera"
    assert "is not a directory of its own" in capsys.readouterr().err
