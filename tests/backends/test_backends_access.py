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
    os.chown(secrets / "codex" / "env" / "KEY", 0, 0)
    (secrets / "codex" / "env" / "KEY").chmod(0o644)
    said(access.problem(secrets, "codex", reader), secrets / "codex" / "env" / "KEY",
         "belongs to root, not to 4242 (owner root, mode 644)", reader)


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
    """In the run's own process (as root too: others reading the key is wrong for root as well)."""
    me = access.Reader.current()
    secrets = projection(open_dir, me)
    for path in [secrets, *secrets.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    (open_dir / "ws").mkdir()
    result = turn(open_dir, secrets)
    assert result["status"] == "failed" and result["failure_kind"] == fk.SECRET_UNAVAILABLE, result
    said(result["message"], secrets / "codex" / "config.toml", "can be read by other accounts", me)
    [found] = readiness.check({}, str(secrets), None, me)
    assert found == ("codex", result["message"])


def test_a_missing_file_is_said_the_same_before_and_in_the_run(tmp_path):
    me = access.Reader.current()
    secrets = projection(tmp_path, me, files=False)  # secrets/codex/, empty
    (tmp_path / "ws").mkdir()
    result = turn(tmp_path, secrets)
    assert result["failure_kind"] == fk.SECRET_UNAVAILABLE
    assert f"{secrets}/codex/config.toml" in result["message"] and "missing" in result["message"]
    assert readiness.check({}, str(secrets), None, me) == [("codex", result["message"])]


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
