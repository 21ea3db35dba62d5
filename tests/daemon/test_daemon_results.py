"""Big results reach the plane cut, never replaced (SPEC section 8), through the real daemon."""
from core_helpers import install_agent
from daemon_helpers import INSTANCE, Daemon, wait_for
from plane_helpers import heartbeats

# `log agent` prints about 1 MiB of numbered lines, emoji in each: more than the adapter's
# 512 KiB tail, and that tail is over 1 MiB once JSON escapes it (12 bytes an emoji).
BIG_LOG_ADAPTER = r"""
import json, sys
verb = sys.argv[1:]
if verb == ["status"]:
    print(json.dumps({"state": {"level": "ok", "label": "Ready"}}))
elif verb[:2] == ["settings", "get"]:
    print(json.dumps({"values": {}}))
elif verb == ["log", "agent"]:
    out = sys.stdout
    for i in range(20000):  # 20,000 lines of 63 bytes
        out.write(f"line {i:06d} " + "\U0001F600" * 10 + " status ok\n")
    out.write("the very last line\n")
else:
    sys.exit(2)
"""


def test_a_log_longer_than_the_tail_arrives_as_its_end_with_the_last_line_whole(caldera_env, plane):
    config = install_agent(caldera_env, base_url=plane.url)
    (config / "adapter.py").write_text(BIG_LOG_ADAPTER)
    daemon = Daemon()
    try:
        wait_for(lambda: heartbeats(plane.store, INSTANCE), what="heartbeat")
        cid = plane.store.enqueue(INSTANCE, "log_get", {"name": "agent"}, timeout_seconds=60)
        done = wait_for(lambda: next((c for c in plane.store.commands(INSTANCE)
                                      if c["id"] == cid and c["status"] in ("succeeded", "failed")), None),
                        timeout=30, what="log_get finished")
    finally:
        daemon.stop()
    assert done["status"] == "succeeded", done
    result = done["result"]
    assert result["name"] == "agent" and result["truncated"] is True
    assert result["result_bytes"] > 1024 * 1024 and result["cut_fields"] == ["text"]
    text = result["text"]
    assert text.endswith("status ok\nthe very last line\n")
    first = text.split("\n", 1)[0]
    assert first.startswith("line ") and first.endswith(" status ok")  # it begins with a whole line
    assert len(text.encode()) > 256 * 1024  # a tail, not a summary
