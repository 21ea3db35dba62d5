"""A projection problem is a sentence (issue 39, item 5): a secret projection the agent's account
cannot read, that is missing a file, that belongs to another account or that other accounts can
read ends the run `secret-unavailable` with one sentence naming the path, what is wrong and the
chown/chmod that fixes it (never `internal error: PermissionError`), and `caldera check` and
`caldera backends --agent NAME` say the same sentence before any run.

The rules are read from the modes, so root can tell what the agent's account will meet: as root
these tests read as a made-up account (uid 4242) that owns the tree; as anyone else, as oneself.
The real non-root run is at the end (tests/cli/unprivileged_helpers.py)."""
import json
import os
import re
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
from unprivileged_helpers import scratch

from caldera.backends import access, base, readiness, service
from caldera.backends import failures as fk
from caldera.redact import Redactor

ROOT = os.geteuid() == 0
FIX = re.compile(r": the secret projection must be (\S+)'s alone; as root: (chown -R \S+ (\S+) && )?"
                 r"chmod -R u=rwX,go= (\S+)$")


@pytest.fixture
def reader():
    if not ROOT:
        return access.Reader.current()
    return access.Reader("4242", 4242, 4242, "4242", frozenset({4242}))  # as ls shows one without a name


def projection(root: Path, reader, *, files: bool = True) -> Path:
    """<root>/secrets/codex (0700 dirs, 0600 files) with a config.toml and a key (files), the reader's."""
    codex = root / "secrets" / "codex"
    codex.mkdir(parents=True)
    if files:
        (codex / "env").mkdir()
        (codex / "env" / "KEY").write_text("sk-fake-access-canary\n")
        (codex / "config.toml").write_text('model_provider = "fake"\n[model_providers.fake]\nname = "Fake"\n'
                                           'base_url = "http://127.0.0.1:9/v1"\nenv_key = "KEY"\n')
    for path in [root / "secrets", *(root / "secrets").rglob("*")]:
        path.chmod(0o700 if path.is_dir() else 0o600)
        if ROOT:
            os.chown(path, reader.uid, reader.gid)
    return root / "secrets"


def said(sentence: str | None, path: Path, wrong: str, reader) -> None:
    """One sentence: the path, what is wrong, the fix for the whole projection."""
    assert sentence is not None and sentence.startswith(f"{path} {wrong}"), sentence
    fix = FIX.search(sentence)
    assert fix and fix[1] == reader.name and fix[4] == str(path).split("/secrets")[0] + "/secrets", sentence
    assert (fix[2] is not None) == (reader.uid != 0) and "\n" not in sentence


def test_a_usable_projection_has_no_problem(tmp_path, reader):
    secrets = projection(tmp_path, reader)
    assert access.problem(secrets, "codex", reader) is None
    assert access.problem(tmp_path / "none", "codex", reader) is None  # no projection: the backend says what lacks


def test_an_unreadable_file_is_named_with_its_owner_and_mode(tmp_path, reader):
    secrets = projection(tmp_path, reader)
    (secrets / "codex" / "config.toml").chmod(0o200)
    said(access.problem(secrets, "codex", reader), secrets / "codex" / "config.toml",
         f"cannot be read by {reader.name} (owner {reader.name}, mode 200)", reader)


def test_a_directory_that_refuses_the_account_is_named(tmp_path, reader):
    secrets = projection(tmp_path, reader)
    (secrets / "codex" / "env").chmod(0o300)
    said(access.problem(secrets, "codex", reader), secrets / "codex" / "env",
         f"cannot be opened by {reader.name}", reader)


@pytest.mark.skipif(not ROOT, reason="giving a file to another account takes root")
def test_a_file_of_another_account_is_named_even_when_readable(tmp_path, reader):
    secrets = projection(tmp_path, reader)
    os.chown(secrets / "codex" / "env" / "KEY", 4343, 4343)
    (secrets / "codex" / "env" / "KEY").chmod(0o644)
    said(access.problem(secrets, "codex", reader), secrets / "codex" / "env" / "KEY",
         "belongs to 4343, not to 4242 or root (owner 4343, mode 644)", reader)


@pytest.mark.skipif(not ROOT, reason="giving a file to root takes root")
def test_roots_files_the_account_can_read_through_its_group_are_accepted(open_dir, reader):
    """0640 root:GROUP files in 0750 root:GROUP directories: root's, so the agent cannot change
    them, and readable by the account through its group (issue 39 review, item 9)."""
    secrets = projection(open_dir, reader)
    for path in [secrets, *secrets.rglob("*")]:
        os.chown(path, 0, reader.gid)
        path.chmod(0o750 if path.is_dir() else 0o640)
    assert access.findings(secrets, "codex", reader) == (None, None)


def test_a_root_reader_is_warned_not_refused_of_a_file_others_can_read(open_dir):
    """A runtime running as root in a container reads a Kubernetes Secret's 0644 files."""
    root = access.Reader("root", 0, 0, "root", frozenset({0}))
    secrets = projection(open_dir, root)
    for path in [secrets, *secrets.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    problem, warning = access.findings(secrets, "codex", root)
    assert problem is None and warning is not None
    assert warning.startswith(f"{secrets}/codex/config.toml can be read by other accounts (owner ")
    [found] = readiness.check({}, str(secrets), None, root)
    assert found.warning == warning


@pytest.fixture
def open_dir(reader):
    """A directory every account can walk into from / (pytest's own tree is 0700)."""
    root = Path(tempfile.mkdtemp(prefix="caldera-access-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_a_file_other_accounts_can_read_is_named_unless_a_directory_fences_it(open_dir, reader):
    secrets = projection(open_dir, reader)
    key = secrets / "codex" / "env" / "KEY"
    key.chmod(0o644)
    assert access.problem(secrets, "codex", reader) is None  # secrets/ 0700: no other account gets in
    for path in (secrets, secrets / "codex", secrets / "codex" / "env"):
        path.chmod(0o755)
    said(access.problem(secrets, "codex", reader), key,
         f"can be read by other accounts (owner {reader.name}, mode 644, in directories they can enter)", reader)
    key.chmod(0o600)
    assert access.problem(secrets, "codex", reader) is None


def test_the_run_ends_secret_unavailable_with_the_sentence_and_check_says_it_first(open_dir):
    """In the run's own process: as any account but root, others reading the key refuses the
    run; as root it is `caldera check`'s warning and the run goes on to its backend."""
    me = access.Reader.current()
    secrets = projection(open_dir, me)
    for path in [secrets, *secrets.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    (open_dir / "ws").mkdir()
    result = turn(open_dir, secrets)
    [found] = readiness.check({}, str(secrets), None, me)
    if me.uid == 0:
        assert result["failure_kind"] != fk.SECRET_UNAVAILABLE, result
        assert found.problem is None and "can be read by other accounts" in found.warning
        return
    assert result["status"] == "failed" and result["failure_kind"] == fk.SECRET_UNAVAILABLE, result
    said(result["message"], secrets / "codex" / "config.toml", "can be read by other accounts", me)
    assert found == ("codex", result["message"], None)


def test_a_missing_file_is_said_the_same_before_and_in_the_run(tmp_path):
    me = access.Reader.current()
    secrets = projection(tmp_path, me, files=False)  # secrets/codex/, empty
    (tmp_path / "ws").mkdir()
    result = turn(tmp_path, secrets)
    assert result["failure_kind"] == fk.SECRET_UNAVAILABLE
    assert f"{secrets}/codex/config.toml" in result["message"] and "missing" in result["message"]
    assert readiness.check({}, str(secrets), None, me) == [("codex", result["message"], None)]


def test_a_link_out_of_the_projection_is_checked_where_it_leads(open_dir, reader):
    """secrets/ 0700 fences its own tree, not the world-readable tree a link in it points to."""
    secrets = projection(open_dir, reader)
    public = open_dir / "public"
    shutil.move(secrets / "codex", public)
    for path in [public, *public.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    (secrets / "codex").symlink_to(public)
    found = access.problem(secrets, "codex", reader)
    assert found is not None and found.startswith(f"{secrets}/codex/config.toml can be read by other accounts")
    if not ROOT:
        return
    found = access.problem(secrets, "codex", access.Reader("root", 0, 0, "root", frozenset({0})))
    assert found is None  # root: a warning, said by findings (above)


def test_an_acl_that_opens_a_file_to_another_account_is_named(open_dir, reader):
    """A u:1234:r entry shows as the group's bits (the mask): counted, even for the account's own group."""
    secrets = projection(open_dir, reader)
    for path in (secrets, secrets / "codex", secrets / "codex" / "env"):
        path.chmod(0o711)
    key = secrets / "codex" / "env" / "KEY"
    entries = [(0x01, 6, 0xFFFFFFFF), (0x02, 4, 1234), (0x04, 0, 0xFFFFFFFF), (0x10, 4, 0xFFFFFFFF),
               (0x20, 0, 0xFFFFFFFF)]  # user::rw- user:1234:r-- group::--- mask::r-- other::---
    try:
        os.setxattr(key, "system.posix_acl_access",
                    struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *entry) for entry in entries))
    except OSError as exc:
        pytest.skip(f"no ACLs here: {exc.strerror}")
    assert access.problem(secrets, "codex", reader).startswith(
        f"{key} can be read by other accounts (owner {reader.name}, mode 640, an ACL, ")


def test_the_sentence_shows_a_names_escapes_and_quotes_the_path_in_its_fix(open_dir, reader):
    secrets = projection(open_dir / "a b", reader)
    (open_dir / "a b").chmod(0o755)
    for path in (secrets, secrets / "codex", secrets / "codex" / "env"):
        path.chmod(0o755)
    name = "A\x1b]0;PWNED\x07\x1b[2K\rFAKE"
    (secrets / "codex" / "env" / name).write_text("v")
    (secrets / "codex" / "env" / name).chmod(0o644)
    if ROOT:
        os.chown(secrets / "codex" / "env" / name, reader.uid, reader.gid)
    found = access.problem(secrets, "codex", reader)
    assert found is not None and "\x1b" not in found and "\r" not in found and "\\x1b]0;PWNED\\x07" in found
    assert found.endswith(f"chmod -R u=rwX,go= '{secrets}'")


def test_a_projection_past_the_entries_looked_at_is_said(tmp_path, reader, monkeypatch):
    monkeypatch.setattr(access, "MAX_ENTRIES", 20)
    secrets = projection(tmp_path, reader)
    for n in range(30):
        (secrets / "codex" / "env" / f"K{n:02d}").write_text("v")
    assert access.problem(secrets, "codex", reader) == (
        f"{secrets}/codex has more than 20 entries; not all checked "
        "(a projection holds a few files: remove what its backend does not read)")


def turn(root: Path, secrets: Path) -> dict:
    environment = base.Environment(redactor=Redactor(), logs_dir=str(root / "logs"), runs_dir=str(root / "runs"),
                                   secrets_dir=str(secrets), env={"PATH": os.defpath})
    request = {"run_id": "r-1", "prompt": "hi", "workspace": str(root / "ws"), "backend_profile": "codex"}
    return service.execute(request, environment, roots=None)


# ---------------------------------------------------------------- as the agent's account, for real

@pytest.mark.skipif(not ROOT, reason="a projection of root's needs root to make")
def test_a_projection_of_roots_is_one_sentence_in_check_backends_and_the_run(account):
    """`sudo mkdir secrets/codex` as an admin does: root's, 0700. As the agent's account the run
    met `internal error: PermissionError` (issue 39); now all three say one sentence."""
    home = scratch(account)
    try:
        config = home / "etc" / "agents" / "demo"
        config.mkdir(parents=True)
        (config / "caldera.agent.yaml").write_text("name: demo\nversion: 1.0.0\nruntime:\n  type: adapter\n"
                                                   "  command: [python3, adapter.py]\n  workdir: .\n")
        (config / "adapter.py").write_text("import sys\nsys.exit(2)\n")
        (config / "agent.env").write_text(f"CALDERA_AGENT_ENABLED=false\nCALDERA_WORKSPACE_ROOTS={home}\n")
        (home / "ws").mkdir()
        (home / "var").mkdir()
        account.give(home)
        secrets = projection(config, access.Reader("root", 0, 0, "root", frozenset({0})))
        env = account.env(home, CALDERA_CONFIG_DIR=str(home / "etc"), CALDERA_STATE_DIR=str(home / "var"))
        runs = [account.caldera([*args, "--agent", "demo"], cwd=home, env=env)
                for args in (["check"], ["backends", "--json"], ["turn", "--workspace", str(home / "ws"), "hi"])]
    finally:
        shutil.rmtree(home, ignore_errors=True)
    check, backends, run = runs
    [line] = [li for li in check.stdout.splitlines() if "projection" in li]
    sentence = line.split("projection codex: ", 1)[1]
    said(sentence, secrets, f"cannot be opened by {account.name} (owner root, mode 700)", account)
    assert check.returncode == 1
    [codex] = [b for b in json.loads(backends.stdout)["backends"] if b["name"] == "codex"]
    assert codex["projection"] == {"ok": False, "problem": sentence}
    assert f"[failed] secret-unavailable {sentence}" in run.stdout, run.stdout + run.stderr
    assert "internal error" not in run.stdout + run.stderr and run.returncode == 1


def test_check_prints_a_warning_line_and_no_terminal_escape(capsys):
    """`caldera check`'s items (an adapter's words, a file's name) reach the terminal escaped."""
    import argparse
    from types import SimpleNamespace

    from caldera.agents.check import Report
    from caldera.cli import check

    report = Report()
    report.note("projection codex", "warning: /s/codex/\x1b]0;PWNED\x07\x1b[2K\rKEY can be read by other accounts")
    report.breach("manifest", "adapter said \x1b[31mred")
    code = check._emit(argparse.Namespace(json=False), SimpleNamespace(name="demo", manifest_path="/m"), report)
    out = capsys.readouterr()
    assert code == 1 and "\x1b" not in out.out + out.err and "\r" not in out.out
    assert "warning: /s/codex/\\x1b]0;PWNED\\x07\\x1b[2K\\x0dKEY" in out.out and "\\x1b[31mred" in out.out
