"""The trust boundary and hostile input end to end: `caldera run` against the embedded plane.

A revision that would make the host run something else is refused as a whole (its finish
names the key, the command never runs); one that only tells the agent something is applied
from the state dir and reported as current; text that is not Unicode gets a sentence, never
"internal error"."""
import json
import os
from pathlib import Path

from core_helpers import install_agent
from daemon_helpers import INSTANCE, Daemon, wait_for
from plane_helpers import add_config_revision

MANIFEST = """name: demo
version: 1.0.0
runtime:
  type: adapter
  command: [python3, adapter.py]
  workdir: .
settings:
  schema:
    - { key: note, label: Note, type: string }
"""

ADAPTER = r"""
import json, sys
verb = sys.argv[1:]
if verb == ["status"]:
    print(json.dumps({"state": {"level": "ok", "label": "Ready"}}))
elif verb[:2] == ["settings", "get"]:
    print(json.dumps({"values": {"note": None}}))
elif verb[:2] == ["settings", "set"]:
    with open("set.log", "ab") as fh:
        fh.write(verb[2].encode("utf-8", "surrogateescape") + b"\n")
    print(json.dumps({"message": "Saved."}))
else:
    sys.exit(2)
"""


def _finished(plane, cid):
    return wait_for(lambda: next((c for c in plane.store.commands(INSTANCE)
                                  if c["id"] == cid and c["status"] in ("succeeded", "failed")), None),
                    what=f"command {cid} finished")


def _reported_revision(plane):
    report = plane.store.reports(INSTANCE, last=True)
    report = report[-1] if isinstance(report, list) else report
    return report.get("body", report)["runtime"]["current_config_revision_id"]


def test_revisions_across_the_trust_boundary(caldera_env, plane, tmp_path):
    config = install_agent(caldera_env, base_url=plane.url, instance_id=INSTANCE, manifest=MANIFEST)
    (config / "adapter.py").write_text(ADAPTER)
    installed = (config / "caldera.agent.yaml").read_bytes()
    marker = tmp_path / "PWNED"
    hostile = MANIFEST.replace("command: [python3, adapter.py]", f'command: [sh, -c, "touch {marker}"]')
    bad_rev = add_config_revision(plane.store, INSTANCE, {"manifest": hostile, "settings": {"note": "x"}})
    good_rev = add_config_revision(plane.store, INSTANCE, {"manifest": MANIFEST.replace("1.0.0", "1.1.0")})
    daemon = Daemon()
    try:
        bad = _finished(plane, plane.store.enqueue(INSTANCE, "apply_config_revision", {"revision_id": bad_rev}))
        assert bad["status"] == "failed"
        assert "refused as a whole" in bad["error_message"] and "runtime.command" in bad["error_message"]
        good = _finished(plane, plane.store.enqueue(INSTANCE, "apply_config_revision", {"revision_id": good_rev}))
        assert good["status"] == "succeeded", good
        wait_for(lambda: _reported_revision(plane) == good_rev, what="the good revision reported as current")
        # Hostile text in commands: a sentence each, never "internal error".
        name = _finished(plane, plane.store.enqueue(INSTANCE, "log_get", {"name": "x\ud800.log"}))
        assert name["status"] == "failed" and "valid text" in name["error_message"]
        note = _finished(plane, plane.store.enqueue(INSTANCE, "settings_set", {"values": {"note": "a\ud800"}}))
        assert note["status"] == "succeeded", note
    finally:
        assert daemon.stop() == 0
    assert not marker.exists()  # the hostile command never ran
    assert (config / "caldera.agent.yaml").read_bytes() == installed  # /etc never written
    state = Path(os.environ["CALDERA_STATE_DIR"]) / "demo"
    assert json.loads((state / "manifest-update.json").read_text())["revision_id"] == good_rev
    assert (config / "set.log").read_bytes().splitlines()[-1] == b'{"note":"a\\ud800"}'
    assert "internal error" not in daemon.log() and "Traceback" not in daemon.log()
