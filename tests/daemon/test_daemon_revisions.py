"""`caldera plane revision` end to end (SPEC section 12): the operator publishes, the plane
hints it in heartbeats, and the runtime fetches and applies it by itself; what became of it
is visible at the plane (the reports' health and the agent's page)."""
import json
import subprocess
import sys

import requests
from core_helpers import install_agent
from daemon_helpers import INSTANCE, Daemon, wait_for

MANIFEST = """name: demo
version: 1.0.0
runtime:
  type: adapter
  command: [python3, adapter.py]
  workdir: .
settings:
  schema:
    - { key: interval, label: Interval, type: integer, min: 1, max: 1440 }
"""

# status says bad while a file named `bad` exists; settings live in values.json.
ADAPTER = r"""
import json, pathlib, sys
verb = sys.argv[1:]
values = pathlib.Path("values.json")
if verb == ["status"]:
    bad = pathlib.Path("bad").exists()
    print(json.dumps({"state": {"level": "bad" if bad else "ok", "label": "Broken" if bad else "Ready"}}))
elif verb[:2] == ["settings", "get"]:
    print(values.read_text() if values.exists() else json.dumps({"values": {"interval": 10}}))
elif verb[:2] == ["settings", "set"]:
    with open("set.log", "a") as fh:
        fh.write(verb[2] + "\n")
    current = json.loads(values.read_text())["values"] if values.exists() else {"interval": 10}
    current.update(json.loads(verb[2]))
    values.write_text(json.dumps({"values": current}))
    print(json.dumps({"message": "Saved."}))
else:
    sys.exit(2)
"""


def publish(tmp_path, *args):
    """`caldera plane revision` as the operator types it; returns the printed id."""
    done = subprocess.run([sys.executable, "-m", "caldera.cli", "plane", "revision", "--db",
                           str(tmp_path / "plane.db"), "--instance", str(INSTANCE), *args],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


def last_report(plane):
    report = plane.store.reports(INSTANCE, last=True)
    return report["body"] if report else {}


def revision_health(plane):
    return (last_report(plane).get("health") or {}).get("config_revisions") or {}


def page(plane):
    return requests.get(f"{plane.url}/agents/{INSTANCE}", timeout=10).text


def start(caldera_env, plane, extra_env=""):
    config = install_agent(caldera_env, base_url=plane.url, manifest=MANIFEST, extra_env=extra_env)
    (config / "adapter.py").write_text(ADAPTER)
    daemon = Daemon()
    wait_for(lambda: last_report(plane), what="a first report")
    return config, daemon


def test_a_narrowing_update_and_new_settings_are_applied_from_the_heartbeat_hint(caldera_env, plane, tmp_path):
    config, daemon = start(caldera_env, plane)
    try:
        narrowed = tmp_path / "narrowed.yaml"
        narrowed.write_text(MANIFEST.replace("1.0.0", "1.1.0").replace("max: 1440", "max: 60"))
        rev = publish(tmp_path, "--manifest", str(narrowed))
        [agent] = [a for a in plane.store.agents() if a["instance_id"] == INSTANCE]
        assert agent["desired_config_revision_id"] == rev  # what the heartbeats now hint

        def narrowed_reported():
            body = last_report(plane)
            items = (body.get("settings") or {}).get("schema") or []
            return body.get("runtime", {}).get("current_config_revision_id") == rev and \
                [i.get("max") for i in items if i.get("key") == "interval"] == [60]

        wait_for(narrowed_reported, timeout=20, what="the narrowed schema reported with the revision id")
        assert revision_health(plane)["last"]["outcome"] == "applied"
        assert revision_health(plane)["last"]["via"] == "heartbeat"
        assert plane.store.commands(INSTANCE) == []  # no command: the runtime acted on the hint
        wait_for(lambda: f'data-revision="{rev}" data-outcome="applied"' in page(plane), what="the page")

        second = publish(tmp_path, "--settings", '{"interval": 30}')
        wait_for(lambda: (last_report(plane).get("settings") or {}).get("values", {}).get("interval") == 30
                 and last_report(plane)["runtime"]["current_config_revision_id"] == second,
                 timeout=20, what="the new value reported")
        assert json.loads((config / "set.log").read_text().splitlines()[-1]) == {"interval": 30}
        text = page(plane)
        assert f'data-revision="{second}" data-outcome="applied"' in text
        assert f'data-revision="{rev}"' in text  # the page lists both, with their outcomes
    finally:
        assert daemon.stop() == 0


def test_an_update_after_which_the_agent_turns_bad_is_rolled_back_and_the_plane_sees_both(
        caldera_env, plane, tmp_path):
    config, daemon = start(caldera_env, plane, extra_env="CALDERA_REPORT_INTERVAL_SECONDS=2\n")
    try:
        update = tmp_path / "update.yaml"
        update.write_text(MANIFEST.replace("1.0.0", "1.2.0"))
        rev = publish(tmp_path, "--manifest", str(update))
        wait_for(lambda: last_report(plane).get("runtime", {}).get("current_config_revision_id") == rev,
                 timeout=20, what="the update reported as current")
        (config / "bad").write_text("")  # the agent turns bad after the update
        wait_for(lambda: revision_health(plane).get("last", {}).get("outcome") == "rolled_back",
                 timeout=30, what="the rollback reported")
        body = last_report(plane)
        assert body["runtime"]["current_config_revision_id"] is None  # the revision before it
        entries = body["health"]["entries"]
        assert any(e["name"] == "Blueprint update" and e["level"] == "bad" and "rolled back" in e["reason"]
                   for e in entries)
        assert revision_health(plane)["level"] == "bad"
        seen = [r["body"]["runtime"]["current_config_revision_id"] for r in plane.store.reports(INSTANCE)]
        assert rev in seen and seen[-1] is None  # the plane saw the update, then the rollback
        wait_for(lambda: f'data-revision="{rev}" data-outcome="rolled_back"' in page(plane), what="the page")
    finally:
        (config / "bad").unlink(missing_ok=True)
        assert daemon.stop() == 0


def test_a_revision_touching_what_the_host_runs_is_refused_visibly_from_a_hint_and_a_command(
        caldera_env, plane, tmp_path):
    config, daemon = start(caldera_env, plane)
    marker = tmp_path / "PWNED"
    installed = (config / "caldera.agent.yaml").read_bytes()
    try:
        hostile = tmp_path / "hostile.yaml"
        hostile.write_text(MANIFEST.replace("command: [python3, adapter.py]", f'command: [sh, -c, "touch {marker}"]'))
        rev = publish(tmp_path, "--manifest", str(hostile))
        wait_for(lambda: revision_health(plane).get("last", {}).get("revision_id") == rev,
                 timeout=20, what="the refusal reported")
        told = revision_health(plane)
        assert told["level"] == "bad" and told["last"]["outcome"] == "refused"
        assert told["last"]["via"] == "heartbeat" and "runtime.command" in told["last"]["reason"]
        assert last_report(plane)["runtime"]["current_config_revision_id"] is None
        text = page(plane)
        assert f'data-revision="{rev}" data-outcome="refused"' in text and "runtime.command" in text

        other = publish(tmp_path, "--manifest", str(hostile), "--no-hint")
        cid = plane.store.enqueue(INSTANCE, "apply_config_revision", {"revision_id": other})
        done = wait_for(lambda: next((c for c in plane.store.commands(INSTANCE)
                                      if c["id"] == cid and c["status"] in ("succeeded", "failed")), None),
                        what="the command finished")
        assert done["status"] == "failed" and "runtime.command" in done["error_message"]
        # One report read once: a later report may already name another outcome as the last.
        # Enqueueing the command also makes `other` the plane's desired revision (as ClawManager
        # does), so a heartbeat may carry it before the poll fetches the command: the refusal is
        # then reported via the heartbeat, once, and the command fails with the same reason.
        def reported_refused() -> bool:
            last = revision_health(plane).get("last", {})
            return (last.get("revision_id") == other and last.get("outcome") == "refused"
                    and last.get("via") in ("command", "heartbeat"))

        wait_for(reported_refused, what="the refusal of the commanded revision reported")
    finally:
        assert daemon.stop() == 0
    assert not marker.exists() and (config / "caldera.agent.yaml").read_bytes() == installed


def test_the_revision_verb_refuses_what_it_cannot_publish(caldera_env, plane, tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "caldera.cli", "plane", "revision", "--db",
                               str(tmp_path / "plane.db"), *args], capture_output=True, text=True, timeout=60)

    assert run("--instance", str(INSTANCE)).returncode != 0  # nothing to publish
    bad = run("--instance", str(INSTANCE), "--settings", "[1]")
    assert bad.returncode != 0 and "object" in bad.stderr
    missing = run("--instance", "99", "--settings", '{"a": 1}')
    assert missing.returncode != 0 and "no instance 99" in missing.stderr
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (300 * 1024))
    assert "KiB" in run("--instance", str(INSTANCE), "--manifest", str(big)).stderr
    for text in ('{"a": NaN}', '{"a": -Infinity}'):  # json.loads takes them; they are not JSON
        nan = run("--instance", str(INSTANCE), "--settings", text)
        assert nan.returncode == 2 and "not a JSON number" in nan.stderr, nan.stderr
    deep = run("--instance", str(INSTANCE), "--settings", '{"a": ' + "[" * 5_000 + "]" * 5_000 + "}")
    assert deep.returncode == 2 and "nested deeper than" in deep.stderr and "Traceback" not in deep.stderr
    assert plane.store.config_revisions(INSTANCE) == []


def test_the_store_refuses_a_revision_that_is_not_json(plane):
    import pytest

    with pytest.raises(ValueError):
        plane.store.publish_revision(INSTANCE, {"settings": {"a": float("nan")}})
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(ValueError, match="nested too deeply"):
        plane.store.publish_revision(INSTANCE, {"settings": {"a": deep}})
    assert plane.store.config_revisions(INSTANCE) == []
