"""`caldera init`: a directory or .tar.gz, members checked, manifest + bundle + state dir."""
import io
import json
import os
import pwd
import tarfile

import pytest
from adapter_helpers import EXAMPLE, copy_example

from caldera.agents import blueprint
from caldera.agents.manifest import load_manifest
from caldera.cli import main


def _tar(path, members):
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name, data=b"x"):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    return info, data


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_init_from_the_example_directory(tmp_path, caldera_env, capsys):
    source = copy_example(tmp_path).parent
    code = main(["init", str(source), "--name", "ops", "--json"])
    body = json.loads(capsys.readouterr().out)
    assert code == 0 and body["ok"], body
    config = caldera_env / "etc" / "agents" / "ops"
    assert (config / "bundle" / "adapter.py").exists()
    assert "systemd is not running here" in body["message"] or "unit reads" in body["message"]
    manifest = load_manifest(config / "caldera.agent.yaml", validate_schema=True)
    assert manifest.workdir == (config / "bundle").resolve()
    assert (caldera_env / "var" / "ops").stat().st_mode & 0o777 == 0o711  # status.json reachable by name
    # The installed agent answers the local verbs.
    assert main(["pause", "--agent", "ops"]) == 0
    assert "Paused." in capsys.readouterr().out
    # A second init under the same name is refused, nothing changes.
    before = _tree(config)
    assert main(["init", str(source), "--name", "ops"]) == 1
    assert _tree(config) == before


def test_init_from_a_tar_gz_with_one_top_dir(tmp_path, caldera_env):
    manifest = (EXAMPLE / "caldera.agent.yaml").read_bytes()
    adapter = (EXAMPLE / "adapter.py").read_bytes()
    archive = _tar(tmp_path / "bp.tar.gz", [_file("task-agent/caldera.agent.yaml", manifest),
                                             _file("task-agent/adapter.py", adapter)])
    result = blueprint.install(archive)
    assert result["name"] == "task-agent" and result["bundle_files"] == 1


@pytest.mark.parametrize("member,why", [
    (_file("/etc/evil"), "absolute path"),
    (_file("a/../../evil"), "'..'"),
    ((lambda i: (setattr(i, "type", tarfile.SYMTYPE), setattr(i, "linkname", "/etc"), (i, None))[-1])(
        tarfile.TarInfo("a/link")), "links are refused"),
    ((lambda i: (setattr(i, "type", tarfile.LNKTYPE), setattr(i, "linkname", "a/caldera.agent.yaml"), (i, None))[-1])(
        tarfile.TarInfo("a/hard")), "links are refused"),
    ((lambda i: (setattr(i, "type", tarfile.CHRTYPE), (i, None))[-1])(tarfile.TarInfo("a/dev")),
     "only files and directories"),
])
def test_bad_members_are_refused_and_nothing_is_written(tmp_path, caldera_env, member, why):
    manifest = (EXAMPLE / "caldera.agent.yaml").read_bytes()
    archive = _tar(tmp_path / "bad.tar.gz", [_file("a/caldera.agent.yaml", manifest), member])
    with pytest.raises(blueprint.Refused, match=why):
        blueprint.install(archive)
    assert _tree(caldera_env / "etc") == ["agents"]
    assert not (tmp_path / "evil").exists()


def test_symlink_in_a_directory_blueprint_is_refused(tmp_path, caldera_env):
    source = copy_example(tmp_path).parent
    (source / "passwd").symlink_to("/etc/passwd")
    with pytest.raises(blueprint.Refused, match="links are refused"):
        blueprint.install(source)


def test_no_manifest(tmp_path, caldera_env):
    (tmp_path / "empty").mkdir()
    with pytest.raises(blueprint.Refused, match="holds no caldera.agent.yaml"):
        blueprint.install(tmp_path / "empty")


def test_init_leaves_the_unit_disabled_and_says_how_to_start(tmp_path, caldera_env, monkeypatch):
    monkeypatch.setattr(blueprint, "DEFAULT_CONFIG_ROOT", caldera_env / "etc")
    monkeypatch.setattr(blueprint, "DEFAULT_STATE_ROOT", caldera_env / "var")
    (tmp_path / "run-systemd").mkdir()
    result = blueprint.install(copy_example(tmp_path).parent, systemd_dir=tmp_path / "run-systemd")
    assert result["message"].endswith("sudo systemctl enable --now caldera@task-agent")
    config = caldera_env / "etc" / "agents" / "task-agent"
    # Both files exist before the operator edits them, so sudoedit keeps owner and mode.
    assert (config / "agent.env").stat().st_mode & 0o777 == 0o640
    assert (config / "secrets.env").stat().st_mode & 0o777 == 0o600
    assert (caldera_env / "var" / "task-agent").stat().st_mode & 0o777 == 0o711


@pytest.mark.skipif(os.geteuid() != 0, reason="giving files to another user needs root")
def test_init_owner_gives_the_files_to_the_images_user(tmp_path, caldera_env, capsys):
    """A container image's user runs `caldera run` itself: `--owner USER` makes secrets.env
    USER's (0600) and agent.env readable by USER (root:USER's group, 0640), the state dir USER's."""
    entry = pwd.getpwnam("nobody")
    source = copy_example(tmp_path).parent
    assert main(["init", str(source), "--name", "ops", "--owner", "nobody"]) == 0
    assert "belong to nobody" in capsys.readouterr().out
    config = caldera_env / "etc" / "agents" / "ops"
    secrets = (config / "secrets.env").stat()
    assert (secrets.st_uid, secrets.st_gid, secrets.st_mode & 0o777) == (entry.pw_uid, entry.pw_gid, 0o600)
    agent_env = (config / "agent.env").stat()
    assert (agent_env.st_uid, agent_env.st_gid, agent_env.st_mode & 0o777) == (0, entry.pw_gid, 0o640)
    assert "Owner nobody:" in (config / "secrets.env").read_text()
    state = (caldera_env / "var" / "ops").stat()
    assert (state.st_uid, state.st_mode & 0o777) == (entry.pw_uid, 0o711)
    # a uid works as well as a name; root keeps them root's
    assert main(["init", str(source), "--name", "ops2", "--owner", "0"]) == 0
    assert (caldera_env / "etc" / "agents" / "ops2" / "secrets.env").stat().st_uid == 0


def test_init_owner_refuses_an_unknown_user_and_a_foreign_one(tmp_path, caldera_env, capsys, monkeypatch):
    source = copy_example(tmp_path).parent
    assert main(["init", str(source), "--name", "ops", "--owner", "no-such-user-here"]) == 1
    assert "--owner no-such-user-here: no such user" in capsys.readouterr().err
    assert not (caldera_env / "etc" / "agents" / "ops").exists()
    monkeypatch.setattr(blueprint.os, "geteuid", lambda: 4242)  # not root, not nobody
    assert main(["init", str(source), "--name", "ops", "--owner", "nobody"]) == 1
    assert "only root can give" in capsys.readouterr().err
    assert not (caldera_env / "etc" / "agents" / "ops").exists()


def test_init_refuses_user_and_owner_together(tmp_path, caldera_env, capsys):
    source = copy_example(tmp_path).parent
    assert main(["init", str(source), "--name", "ops", "--user", "nobody", "--owner", "nobody"]) == 1
    assert "--user and --owner: pick one" in capsys.readouterr().err
    assert not (caldera_env / "etc" / "agents" / "ops").exists()


def test_what_the_agent_wrote_beside_its_blueprint_is_not_installed(tmp_path, caldera_env, capsys):
    """A --manifest run of the example leaves its data/ (the pause) and .caldera-state/ (its
    state, a session among it, a socket) beside the blueprint: init installs neither, so the
    new agent does not start paused and no runtime's files travel into a bundle."""
    source = copy_example(tmp_path).parent
    assert main(["pause", "--manifest", str(source)]) == 0
    assert (source / "data" / "paused").is_file() and (source / ".caldera-state").is_dir()
    import socket

    with socket.socket(socket.AF_UNIX) as sock:  # process mode's control socket is one of these
        sock.bind(str(source / ".caldera-state" / "task-agent" / "s"))
        result = blueprint.install(source, name="fresh")
    bundle = caldera_env / "etc" / "agents" / "fresh" / "bundle"
    assert result["bundle_files"] == 4 and sorted(p.name for p in bundle.iterdir()) == [
        "adapter.py", "agent.py", "taskagent.py", "tasks.json"]
    capsys.readouterr()
    assert main(["status", "--agent", "fresh", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["agent_status"]["state"]["label"] == "Ready"  # not "Paused"


def test_calderaignore_patterns(tmp_path, caldera_env):
    """One pattern a line: with a '/' inside, a path from the top; without, a name at any depth;
    a trailing '/' for directories only. The file itself is not installed."""
    root = tmp_path / "bp"
    (root / "run" / "sub").mkdir(parents=True)
    (root / "lib" / "cache").mkdir(parents=True)
    (root / "caldera.agent.yaml").write_text("name: bp\nruntime:\n  type: adapter\n  command: [python3, a.py]\n")
    for name in ("a.py", "run/x", "run/sub/y", "lib/keep.py", "lib/cache/z", "lib/tmp.log", "cache"):
        (root / name).write_text("x\n")
    (root / ".calderaignore").write_text("# runtime files\nrun/\ncache/\n*.log\n")
    blueprint.install(root)
    bundle = caldera_env / "etc" / "agents" / "bp" / "bundle"
    assert _tree(bundle) == ["a.py", "cache", "lib", "lib/keep.py"]  # `cache` the file stays: cache/ is a directory's
