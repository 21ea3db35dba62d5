"""OpenCode over days (issue 41, point 4): many turns through one agent's `opencode serve`,
as the daemon drives it (`service.execute` with one `ServerOwner`), the real CLI against the
local fake chat provider, every turn one Bash command (`echo`) and then a text answer.

Prints, every `--every` turns: the `opencode serve` process's RSS and peak RSS (VmHWM), the
servers started so far and the median wall of the last turns; then the recycles by cause,
the turns that did not complete (must be 0) and the idle stop: with `--idle-stop S` the
seconds from the last turn's end until the server is gone (the owner's idle timer; the
daemon's default is 300 s, CALDERA_OPENCODE_IDLE_SECONDS).

`--recycle-turns 0` turns the recycle off (the server's growth alone); by default the
owner's own limits hold (owner.RECYCLE_TURNS, owner.RECYCLE_RSS).
Needs CALDERA_OPENCODE_BIN (.ci/install-opencode.sh).

Usage: python bench/bench_opencode_days.py [--turns 500] [--every 50] [--recycle-turns N] [--idle-stop 5]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "backends"))
sys.path.insert(0, str(ROOT / "tests" / "backends" / "opencode"))

from backends_fake_chat import FakeChat as FakeChatProvider  # noqa: E402
from opencode_helpers import environment, request, write_projection  # noqa: E402

from caldera.backends import service  # noqa: E402
from caldera.backends.opencode import owner as own  # noqa: E402

KEY = "sk-bench-0123456789abcdef"
TURN = [{"call": "bash", "args": {"command": "echo turn", "description": "echo"}}, {"text": "done"}]


def _status_kib(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith(key))
    except (OSError, StopIteration):
        return 0


def keep_log(tmp: Path, n: int) -> None:
    """A failed turn's run log, kept out of the bench's temporary dir (which goes at its end)."""
    log = tmp / "state" / "logs" / f"run-days-{n}.log"
    kept = Path(tempfile.gettempdir()) / f"bench-opencode-days-turn-{n}.log"
    try:
        kept.write_bytes(log.read_bytes())
    except OSError as exc:
        print(f"  (its run log could not be kept: {exc})")
        return
    print(f"  its run log: {kept}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--recycle-turns", type=int, default=own.RECYCLE_TURNS, help="0: no recycle")
    parser.add_argument("--idle-stop", type=float, default=5.0)
    args = parser.parse_args()
    binary = os.environ.get("CALDERA_OPENCODE_BIN")
    if not binary:
        print("bench_opencode_days: CALDERA_OPENCODE_BIN is not set (.ci/install-opencode.sh); skipped")
        return 0
    off = args.recycle_turns <= 0
    rows, failed, walls = [], 0, []
    rss = hwm = 0
    with tempfile.TemporaryDirectory(prefix="bench-opencode-days-") as name, \
            FakeChatProvider(TURN * args.turns + [{"text": "done"}]) as fake:
        tmp = Path(name)
        ws = tmp / "ws"
        ws.mkdir()
        secrets = write_projection(tmp, fake.url, key=KEY)
        owner = own.ServerOwner(tmp / "state" / "runs", idle_seconds=args.idle_stop,
                                recycle_turns=10 ** 9 if off else args.recycle_turns,
                                recycle_rss=1 << 50 if off else own.RECYCLE_RSS)
        env = environment(tmp, secrets, owner=owner, binary=binary)
        try:
            for n in range(1, args.turns + 1):
                started = time.perf_counter()
                result = service.execute(request(ws, run_id=f"days-{n}", prompt="Run echo"), env, roots=None)
                walls.append(time.perf_counter() - started)
                if result["status"] != "completed":
                    failed += 1
                    print(f"  turn {n}: {result['status']} {result.get('failure_kind')}: {result.get('message')} "
                          f"(after {walls[-1]:.1f} s, server {owner.starts}, load average "
                          f"{os.getloadavg()[0]:.1f})", flush=True)
                    keep_log(tmp, n)
                server = owner.server
                if server is not None:  # else recycled as the turn ended: its last figures stand
                    pid = server.serving_pid() or 0
                    rss, hwm = _status_kib(pid, "VmRSS:"), _status_kib(pid, "VmHWM:")
                if n % args.every == 0:
                    row = {"turn": n, "rss_mib": round(rss / 1024, 1), "hwm_mib": round(hwm / 1024, 1),
                           "recycled_after": server is None, "servers": owner.starts,
                           "wall_s": round(statistics.median(walls[-args.every:]), 3)}
                    rows.append(row)
                    print(f"  after {n:4d} turns: server RSS {row['rss_mib']:7.1f} MiB (peak {row['hwm_mib']:7.1f}), "
                          f"servers started {owner.starts}{' (recycled as it ended)' if server is None else ''}, "
                          f"turn wall median {row['wall_s']:.3f} s", flush=True)
            if owner.server is None:  # the last turn recycled its server: one more (a text answer) leaves one idle
                service.execute(request(ws, run_id="days-idle", prompt="Say done"), env, roots=None)
            # the idle stop: from the last turn's end until the server is gone
            server, ended = owner.server, time.monotonic()
            stop = threading.Event()
            while server is not None and (owner.server is not None or server.alive()):
                stop.wait(0.05)
                if time.monotonic() - ended > args.idle_stop + 60:
                    break
            idle_after = time.monotonic() - ended if server is not None else float("nan")
        finally:
            owner.close()
    print(f"bench_opencode_days: {args.turns} turns, recycle {'off' if off else f'after {args.recycle_turns} turns'}"
          f": {failed} not completed, servers started {owner.starts}, recycled {owner.recycled}; "
          f"idle stop set to {args.idle_stop:g} s, the server was gone {idle_after:.2f} s after the last turn")
    print(json.dumps({"bench": "opencode-days", "turns": args.turns, "failed": failed, "recycled": owner.recycled,
                      "starts": owner.starts, "rows": rows, "idle_stop_s": args.idle_stop,
                      "idle_stop_measured_s": round(idle_after, 2), "ok": failed == 0}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
