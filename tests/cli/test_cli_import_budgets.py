"""What each entry point must not import (issue 21, item 4).

Each entry runs in a fresh interpreter the way the console script runs it
(`caldera.cli.main(argv)`), against the embedded plane where it needs one, and writes
the modules it ended with; the budgets below name what it must not have imported. They
are what held when they were written (measured with `sys.modules` after each path ran),
and each is a figure of docs/performance.md: `caldera pause` (section 1) and the idle
`caldera run` (section 2) above all. A failure names the modules; `python -X importtime`
on the same command shows who imported them.
"""
import json
import os
import signal
import subprocess
import sys

import pytest
from core_helpers import BOOT, install_agent
from daemon_helpers import wait_for
from plane_helpers import heartbeats

PlaneServer = pytest.importorskip("caldera.plane.server").PlaneServer

INSTANCE = 7
# The runtime's dependencies: none is needed to answer a person at the terminal.
DEPENDENCIES = ("requests", "jsonschema", "yaml")
# requests and what it pulls in: 7 MiB of PSS per daemon (section 10); the client is http.client's.
WITHOUT_REQUESTS = ("requests", "urllib3", "charset_normalizer", "idna", "certifi", "http.cookiejar",
                    # what only they imported (and, for encodings.idna, a str host given to getaddrinfo)
                    "urllib.request", "importlib.metadata", "http.cookies", "mimetypes", "encodings.idna")
# Layers and modules the daemon runs without (an adapter agent, commands whose payload
# schemas assert only an object): docs/performance.md, section 2.
NOT_IN_THE_DAEMON = ("argparse", "gettext", "jsonschema", "yaml", "caldera.backends.base", "caldera.backends.service",
                     "caldera.backends.codex", "caldera.backends.claude_code", "caldera.backends.opencode",
                     "caldera.plane", "caldera.agents.process", "caldera.cli.report",
                     "caldera.daemon.report_once", "tomllib", "sqlite3", "http.server", "netrc",
                     "uuid", "platform", "difflib",  # 0.24, 0.14, 0.21 MiB of RSS each (section 9)
                     # shutil with bz2, lzma, zlib and tempfile: 0.4 MiB of an idle daemon's PSS (section 10);
                     # importlib.resources (with them and zipfile) 0.9 MiB more after its first command
                     "shutil", "tempfile", "bz2", "lzma", "zlib", "zipfile", "importlib.resources",
                     # dataclasses with inspect, ast, dis: 1.3 MiB (NamedTuples and classes with __slots__)
                     "dataclasses", "inspect", "ast", "dis",
                     *WITHOUT_REQUESTS)
BUDGETS = {
    # --help is argparse's own (its speed target is retired), but it loads no command.
    "--help": DEPENDENCIES + ("caldera.daemon", "caldera.agents", "caldera.protocol", "caldera.backends",
                              "caldera.plane", "caldera.skills", "caldera.cli.run", "caldera.cli.verbs",
                              "caldera.cli.status", "caldera.cli.report"),
    # A quick verb: typing, dataclasses (with inspect) and logging each cost it a measurable
    # share of its start (docs/performance.md, section 1); type-only imports go under
    # `TYPE_CHECKING = False` / `if TYPE_CHECKING:` (caldera/cli/fastpath.py).
    "pause": DEPENDENCIES + ("typing", "dataclasses", "inspect", "logging", "shutil", "tempfile",
                             "caldera.daemon", "caldera.protocol", "caldera.backends", "caldera.plane",
                             "caldera.skills", "caldera.agents.process"),
    "status": DEPENDENCIES + ("typing", "shutil", "tempfile", "caldera.daemon", "caldera.backends", "caldera.plane",
                              "caldera.skills", "caldera.agents.process"),
    # Process mode, the daemon down: the verb finds no control socket and says so (exit 1).
    # Only the socket's client side is loaded (agents/process/control.py defers `logging`
    # to the daemon's side); the driver and the supervisor never are.
    "pause (process)": DEPENDENCIES + ("typing", "dataclasses", "inspect", "logging", "shutil", "tempfile",
                                       "caldera.daemon", "caldera.protocol", "caldera.backends", "caldera.plane",
                                       "caldera.skills", "caldera.agents.process.driver",
                                       "caldera.agents.process.supervisor"),
    # Process mode: status reads state.json and /proc through a driver that only reports.
    "status (process)": DEPENDENCIES + ("typing", "shutil", "tempfile", "caldera.daemon", "caldera.backends",
                                        "caldera.plane", "caldera.skills"),
    "report --once": ("jsonschema", "yaml", "ctypes", "caldera.backends.base", "caldera.backends.service",
                      "caldera.backends.codex", "caldera.backends.opencode", "caldera.plane", "caldera.agents.process",
                      "caldera.daemon.run", "caldera.skills.watcher", "tomllib", "sqlite3", "netrc",
                      *WITHOUT_REQUESTS),
    "run": NOT_IN_THE_DAEMON,
}
# The 100 commands of bench/bench_runtime.py, in kind: their payload schemas assert only an object.
DAEMON_COMMANDS = ("pause", "resume", "settings_get", "collect_system_info", "health_check")
# A process-mode agent the tests never start: its verbs run with the daemon down.
PROCESS_MANIFEST = "name: worker\nruntime:\n  type: process\n  command: [python3, agent.py]\nstatus: status.json\n"
# Only what caldera imported counts: a module already there when the probe starts came with the
# interpreter's own start (site and its .pth files: a host's may import certifi into every
# python3, as the .deb's build machine's does).
PROBE = ("import json, sys\nstarted = set(sys.modules)\nfrom caldera.cli import main\ncode = main(sys.argv[2:])\n"
         "with open(sys.argv[1], 'w') as fh:\n"
         "    json.dump({'code': code, 'modules': sorted(set(sys.modules) - started)}, fh)\n")


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """An installed adapter agent, the embedded plane, and the environment to run `caldera` in."""
    root = tmp_path_factory.mktemp("budgets")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CALDERA_", "CLAWMANAGER_"))}
    env.update(CALDERA_CONFIG_DIR=str(root / "etc"), CALDERA_STATE_DIR=str(root / "var"))
    (root / "etc" / "agents").mkdir(parents=True)
    (root / "var").mkdir()
    plane = PlaneServer(str(root / "p.db"), tokens={BOOT: INSTANCE}, heartbeat_interval=1, poll_interval=1).start()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CALDERA_CONFIG_DIR", env["CALDERA_CONFIG_DIR"])
        install_agent(root, base_url=plane.url, instance_id=INSTANCE)
        install_agent(root, name="worker", base_url=plane.url, instance_id=INSTANCE, manifest=PROCESS_MANIFEST)
    # The manifest caches warm, as any call after the first finds them (the first parses the YAML),
    # in the state dirs caldera init makes (status makes none).
    for agent in ("demo", "worker"):
        (root / "var" / agent).mkdir()
        subprocess.run([sys.executable, "-m", "caldera.cli", "status", "--agent", agent], env=env,
                       capture_output=True, timeout=60, check=True)
    try:
        yield root, env, plane
    finally:
        plane.stop()


def _probe(root, env, argv, **popen):
    out = root / f"modules-{'-'.join(a.strip('-') for a in argv)}.json"
    return out, subprocess.Popen([sys.executable, "-c", PROBE, str(out), *argv], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **popen)


def _imported(out, proc, timeout=60):
    _, err = proc.communicate(timeout=timeout)
    assert out.exists(), f"the probe ended ({proc.returncode}) without writing its modules:\n{err[-3000:]}"
    done = json.loads(out.read_text())
    return done["code"], set(done["modules"])


def _over_budget(entry, modules):
    return sorted(m for m in modules if any(m == name or m.startswith(name + ".") for name in BUDGETS[entry]))


@pytest.mark.parametrize("entry, argv, code", [
    ("--help", ["--help"], 0),
    ("pause", ["pause", "--agent", "demo"], 0),
    ("status", ["status", "--agent", "demo"], 0),
    ("pause (process)", ["pause", "--agent", "worker"], 1),  # no daemon: said, exit 1
    ("status (process)", ["status", "--agent", "worker"], 0),
])
def test_local_entry_points_stay_within_their_import_budget(host, entry, argv, code):
    root, env, _ = host
    got, modules = _imported(*_probe(root, env, argv))
    assert got == code
    assert _over_budget(entry, modules) == [], f"caldera {entry} imported what it must not"


def test_report_once_stays_within_its_import_budget(host):
    root, env, _ = host
    got, modules = _imported(*_probe(root, env, ["report", "--once", "--agent", "demo", "--deadline", "20"]))
    assert got == 0
    assert _over_budget("report --once", modules) == [], "caldera report --once imported what it must not"


def test_the_daemon_stays_within_its_import_budget(host):
    """`caldera run` started, registered, ran the bench's kinds of command and stopped:
    what it imported on the way must leave out NOT_IN_THE_DAEMON."""
    root, env, plane = host
    before = len(heartbeats(plane.store, INSTANCE))
    out, proc = _probe(root, env, ["run", "--agent", "demo"], start_new_session=True)
    try:
        wait_for(lambda: len(heartbeats(plane.store, INSTANCE)) > before, timeout=30, what="the daemon's heartbeat")
        ids = [plane.store.enqueue(INSTANCE, kind, {}) for kind in DAEMON_COMMANDS]
        wait_for(lambda: all(plane.store.command(INSTANCE, i)["status"] in ("succeeded", "failed") for i in ids),
                 timeout=30, what="the commands' finishes")
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        print(proc.communicate()[1][-3000:])
        raise
    proc.send_signal(signal.SIGTERM)
    got, modules = _imported(out, proc, timeout=30)
    assert got == 0
    assert _over_budget("run", modules) == [], "caldera run imported what it must not"
