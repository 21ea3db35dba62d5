"""A change the agent makes through its own channel reaches the plane within two report
intervals (10 s at the default 5 s), not after the adapter status cache's 30 s."""
import json

from core_helpers import install_agent
from daemon_helpers import INSTANCE, Daemon, wait_for

# `status` reads the agent's label (what its own chat command would change) before it logs
# the call: once the call is in calls.log, that answer is decided.
LABEL_ADAPTER = r"""
import json, pathlib, sys
verb = sys.argv[1:]
label = pathlib.Path("label").read_text().strip() if pathlib.Path("label").exists() else "Ready"
with open("calls.log", "a") as fh:
    fh.write(" ".join(verb) + "\n")
if verb == ["status"]:
    print(json.dumps({"state": {"level": "ok", "label": label}}))
elif verb[:2] == ["settings", "get"]:
    print(json.dumps({"values": {}}))
else:
    sys.exit(2)
"""


def _last_report(plane):
    report = plane.store.reports(INSTANCE, last=True)
    return json.dumps(report) if report else ""


def _status_calls(config):
    path = config / "calls.log"
    return path.read_text().splitlines().count("status") if path.exists() else 0


def test_a_pause_through_the_agents_own_channel_reaches_the_plane_within_two_report_intervals(
        caldera_env, plane):
    config = install_agent(caldera_env, base_url=plane.url)  # default report interval: 5 s
    (config / "adapter.py").write_text(LABEL_ADAPTER)
    daemon = Daemon()
    try:
        wait_for(lambda: "Ready" in _last_report(plane), timeout=20, what="a report saying Ready")
        asked = _status_calls(config)
        wait_for(lambda: _status_calls(config) > asked, timeout=15, what="a report asking status")
        (config / "label").write_text("Paused by chat\n")  # the answer just given still says Ready
        # Two report intervals, and 2 s for the adapter call and a busy machine.
        wait_for(lambda: "Paused by chat" in _last_report(plane), timeout=12, what="the pause at the plane")
    finally:
        daemon.stop()
