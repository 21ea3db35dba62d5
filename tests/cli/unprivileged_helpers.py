"""Running `caldera` for real as an account that is not root (issue 36's review: the messages
a non-root newcomer meets are tried as that newcomer, not by calling the sentence's function).

As root (CI runs as root) the account is `nobody`, or one this session creates when there is
none; the interpreter is this one when that account may run it (a virtualenv in root's home
is out of its reach), else Debian's /usr/bin/python3 with the runtime's packages; the checkout
comes first on PYTHONPATH. As anyone else, the account is oneself. None of these at hand: the
tests skip, saying why.
"""
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROBE = "import caldera.cli, yaml, requests, jsonschema"
CREATED = "caldera-unpriv"  # the account made when there is no `nobody` (removed by the fixture)


class Account:
    """Who runs the commands, and with which interpreter."""

    def __init__(self, name, uid, gid, python):
        self.name, self.uid, self.gid, self.python = name, uid, gid, python

    def as_kwargs(self):
        """subprocess's user and group arguments: this account (as root), or none (it is oneself)."""
        if os.geteuid() != 0:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def env(self, home, **extra):
        """A person's environment at a terminal: no caldera variable, no systemd, this checkout."""
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
               "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
        env.update(extra)
        return env

    def caldera(self, args, *, cwd, env, timeout=60):
        """`caldera ARGS` as this account (python -m caldera.cli): the CompletedProcess, text."""
        return subprocess.run([self.python, "-m", "caldera.cli", *args], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL, **self.as_kwargs())

    def popen(self, args, *, cwd, env, sink):
        return subprocess.Popen([self.python, "-m", "caldera.cli", *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=sink, stderr=sink, start_new_session=True, **self.as_kwargs())

    def give(self, root):
        """`root` and everything in it to this account (as root; else it is one's own already)."""
        if os.geteuid() == 0:
            for path in [root, *Path(root).rglob("*")]:
                os.chown(path, self.uid, self.gid, follow_symlinks=False)

    def in_default_roots(self, etc_caldera, args, *, cwd, env):
        """`caldera ARGS` as this account in a mount namespace whose /etc holds `etc_caldera` as
        /etc/caldera (an overlay over the real /etc: nothing outside the namespace changes).
        Root only; None when this host cannot make the namespace."""
        if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("setpriv"):
            return None
        layers = Path(tempfile.mkdtemp(prefix="caldera-etc-"))
        try:
            (layers / "upper").mkdir()
            (layers / "work").mkdir()
            shutil.copytree(etc_caldera, layers / "upper" / "caldera", symlinks=True)
            words = " ".join(f"'{a}'" for a in [self.python, "-m", "caldera.cli", *args])
            script = (f"mount -t overlay overlay -o lowerdir=/etc,upperdir={layers}/upper,workdir={layers}/work /etc "
                      f"|| exit 111; cd '{cwd}' && exec setpriv --reuid={self.uid} --regid={self.gid} --clear-groups "
                      f"-- {words}")
            done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], env=env,
                                  capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        finally:
            shutil.rmtree(layers, ignore_errors=True)
        return None if done.returncode == 111 else done


def _runs_for(name, uid, gid, python):
    try:
        probe = subprocess.run([python, "-c", PROBE], cwd="/", capture_output=True, timeout=60,
                               env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
                               **({"user": uid, "group": gid, "extra_groups": []} if os.geteuid() == 0 else {}))
    except OSError:  # the interpreter itself is out of that account's reach
        return False
    return probe.returncode == 0


def find_account():
    """(Account, "") or (None, why not); as root, (Account, CREATED) when it made the account."""
    if os.geteuid() != 0:
        me = pwd.getpwuid(os.getuid())
        return Account(me.pw_name, me.pw_uid, me.pw_gid, sys.executable), ""
    made = ""
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        if not shutil.which("useradd"):
            return None, "no account `nobody` and no useradd to make one"
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", CREATED],
                       check=True, capture_output=True, timeout=60)
        entry, made = pwd.getpwnam(CREATED), CREATED
    for python in (sys.executable, "/usr/bin/python3"):
        if os.path.exists(python) and _runs_for(entry.pw_name, entry.pw_uid, entry.pw_gid, python):
            return Account(entry.pw_name, entry.pw_uid, entry.pw_gid, python), made
    if made:
        subprocess.run(["userdel", made], capture_output=True, timeout=60)
    return None, (f"{entry.pw_name} can run neither {sys.executable} nor /usr/bin/python3 with the runtime's "
                  f"packages on this checkout ({REPO})")


def scratch(account):
    """A directory of the account's outside pytest's 0700 tree (the caller removes it)."""
    root = Path(tempfile.mkdtemp(prefix="caldera-unpriv-"))
    account.give(root)
    return root
