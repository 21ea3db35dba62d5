#!/usr/bin/env python3
"""Runtime core benchmark (issues 2 and 16), measured in one run on this machine:

1. `caldera run` at default intervals against the embedded plane runs 100 commands, then idles:
   RSS (VmRSS) at the end against the RSS of the floor `python -c "import requests, jsonschema,
   yaml"` left sleeping (target <= 1.05 x; since issue 41 also against the runtime's dependencies
   as they are now, jsonschema, yaml and the client's stdlib), and CPU time over the idle window, its own and with
   the adapter calls it made (utime+stime and cutime+cstime from /proc/PID/stat: CPU time, not
   wall, so other loads on the machine do not count), as a percentage of one core, split into
   caldera's own (target <= 0.5 %) and the adapter's calls (a process per 5 s report: the
   price of a status never older than two report intervals, issue 24; for information).
   Then, for information, the RSS after one `log_get`: its payload schema is the first that
   needs jsonschema (the 100 commands' schemas only assert an object).
2. `caldera report --once` CPU time (user+sys, median of N) against the floor of its own
   dependencies, `python -c "import requests, jsonschema, yaml"`. Target: <= 1.3x.

3. With --flat N (issue 41): the same daemon then runs commands until N have ended; its RSS,
   and what grew by kind of mapping (/proc/PID/smaps: heap, anonymous, files), after every
   --flat-every commands. --watch-modules FILE [--trace-malloc] starts the daemon through a
   wrapper of the bench's that writes what a step coincides with (modules, threads, gc
   objects; with tracemalloc, the allocations that grew, by where): docs/performance.md,
   section 10.

Usage: bench/bench_runtime.py [--seconds 60] [--runs 5] [--flat 10000 [--flat-every 500]
       [--watch-modules FILE [--trace-malloc]]]
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from caldera.plane.server import PlaneServer  # noqa: E402

TOKEN = "bench-bootstrap-token-1234"
# The runtime's dependencies and the stdlib its HTTP client needs (issue 41: no requests).
DEPENDENCIES = "jsonschema, yaml, http.client, ssl, email.utils"


def child_cpu(argv, env) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{argv} failed ({done.returncode}): {done.stderr[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def proc_cpu(pid: int, children: bool = False) -> float:
    """utime+stime of pid; with children, plus cutime+cstime (its waited-for children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    used = int(fields[11]) + int(fields[12])
    if children:
        used += int(fields[13]) + int(fields[14])
    return used / ticks


def proc_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def install(tmp: Path, url: str, tree: Path = ROOT, instance: int = 1, token: str = TOKEN) -> dict:
    """The example adapter agent "bench" under tmp (etc/, var/), caldera from `tree`: its environment."""
    config = tmp / "etc" / "agents" / "bench"
    config.mkdir(parents=True)
    example = tree / "examples" / "task-agent"
    manifest = (example / "caldera.agent.yaml").read_text()
    (config / "caldera.agent.yaml").write_text(manifest.replace("workdir: .", f"workdir: {example}"))
    (config / "agent.env").write_text(f"CALDERA_AGENT_ENABLED=true\nCALDERA_BASE_URL={url}\n"
                                      f"CALDERA_INSTANCE_ID={instance}\n")
    (config / "secrets.env").write_text(f"CALDERA_TOKEN={token}\n")
    (config / "secrets.env").chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CALDERA_", "CLAWMANAGER_"))}
    env.update(CALDERA_CONFIG_DIR=str(tmp / "etc"), CALDERA_STATE_DIR=str(tmp / "var"), PYTHONPATH=str(tree))
    # Measure as installed: a package has its bytecode compiled (dh_python3 does it). A shell
    # with PYTHONDONTWRITEBYTECODE would make every run compile caldera from source.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--flat", type=int, default=0,
                        help="then run commands until this many: RSS at the 1,000th and the last (issue 41)")
    parser.add_argument("--watch-modules", metavar="FILE",
                        help="start the daemon through a wrapper that writes to FILE, every 5 s, the modules "
                             "imported since, its threads and gc's object count")
    parser.add_argument("--trace-malloc", action="store_true",
                        help="with --watch-modules: tracemalloc in the daemon, and what grew by more than "
                             "128 KiB in 5 s, by where (its RSS is then not the daemon's own)")
    parser.add_argument("--flat-every", type=int, default=1000,
                        help="with --flat: RSS, and what grew by kind of mapping, after every this many commands")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        plane = PlaneServer(str(tmp / "plane.db"), tokens={TOKEN: 1}).start()
        try:
            env = install(tmp, plane.url)
            idle(env, args.seconds, plane.store, flat=args.flat, every=args.flat_every,
                 watch_file=args.watch_modules, trace=args.trace_malloc)
            report_once(env, args.runs)
        finally:
            plane.stop()
    return 0


COMMANDS = ("pause", "resume", "settings_get", "collect_system_info", "health_check")


# --watch-modules: the daemon started through this wrapper (the bench's, not caldera's), which
# writes every 5 s the modules imported since its last line, its threads and gc's object count:
# what a one-time step of RSS coincides with, without tracemalloc's own weight.
WATCHED = """\
import gc, sys, threading, time
def watch(path, trace):
    seen, before = set(sys.modules), None
    if trace:
        import tracemalloc
        tracemalloc.start(6)
    while True:
        time.sleep(5)
        new = sorted(set(sys.modules) - seen)
        seen |= set(new)
        line = f'{time.time():.0f} modules {len(sys.modules)} threads {threading.active_count()} '
        line += f'objects {len(gc.get_objects())} new {" ".join(new)}'
        if trace:  # what grew by more than 128 KiB in 5 s, by where it was allocated
            now = tracemalloc.take_snapshot()
            if before is not None:
                grown = [d for d in now.compare_to(before, 'traceback')[:5] if d.size_diff > 128 * 1024]
                for d in grown:
                    line += f'\\n  {d.size_diff / 1024:+.0f} KiB {d.count_diff:+d} blocks at ' + ' <- '.join(
                        f'{f.filename.rsplit("/", 2)[-1]}:{f.lineno}' for f in reversed(d.traceback))
            before = now
        with open(path, 'a') as fh:
            fh.write(line + '\\n')
threading.Thread(target=watch, args=(sys.argv[1], sys.argv[2] == 'trace'), daemon=True).start()
from caldera.cli import main
sys.exit(main(['run', '--agent', 'bench']))
"""



def idle(env, seconds: float, store, commands: int = 100, flat: int = 0, every: int = 1000,
         watch_file: str | None = None, trace: bool = False) -> None:
    # Bytecode first, as a package install leaves it: compiling at start-up would inflate RSS.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "caldera")], env=env, check=True)
    floor = subprocess.Popen([sys.executable, "-c", "import requests, jsonschema, yaml, time; time.sleep(3600)"],
                             env=env)
    # since issue 41 the runtime's dependencies are jsonschema and yaml (its HTTP is http.client's)
    deps = subprocess.Popen([sys.executable, "-c", f"import {DEPENDENCIES}, time; time.sleep(3600)"], env=env)
    argv = [sys.executable, "-c", WATCHED, watch_file, "trace" if trace else ""] if watch_file else \
        [sys.executable, "-m", "caldera.cli", "run", "--agent", "bench"]
    daemon = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait = threading.Event()
    try:
        wait.wait(5)  # start-up, register, first reports
        for n in range(commands):
            store.enqueue(1, COMMANDS[n % len(COMMANDS)], {}, 60)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and any(c["status"] not in ("succeeded", "failed")
                                                  for c in store.commands(1)):
            wait.wait(1)
        done = [c for c in store.commands(1) if c["status"] in ("succeeded", "failed")]
        wait.wait(5)  # the reports after the last command: not idle yet
        own0, all0 = proc_cpu(daemon.pid), proc_cpu(daemon.pid, children=True)
        wait.wait(seconds)
        own, total = proc_cpu(daemon.pid) - own0, proc_cpu(daemon.pid, children=True) - all0
        rss, floor_rss, deps_rss = proc_rss_mb(daemon.pid), proc_rss_mb(floor.pid), proc_rss_mb(deps.pid)
        # For information, after the window: the bench's commands have payload schemas that
        # only assert an object (checked without jsonschema); one whose schema asserts more
        # imports jsonschema into the daemon for good (docs/performance.md, section 2).
        store.enqueue(1, "log_get", {"name": "bench"}, 60)
        while time.monotonic() < deadline and any(c["status"] not in ("succeeded", "failed")
                                                  for c in store.commands(1)):
            wait.wait(1)
        wait.wait(5)
        rss_schema = proc_rss_mb(daemon.pid)
        flat_rss = long_run(store, daemon.pid, flat, deadline + flat / 5, every) if flat else {}
    finally:
        for proc in (daemon, floor, deps):
            proc.terminate()
            proc.wait(60)
    if flat_rss:
        growth = flat_rss[max(flat_rss)] - flat_rss[min(flat_rss)]
        print(f"  RSS over {max(flat_rss)} commands: " + ", ".join(f"{n}: {v:.1f} MiB" for n, v in flat_rss.items())
              + f"; {growth:+.2f} MiB from the {min(flat_rss)}th to the last (target <= 1 MiB: "
              + ("ok" if growth <= 1 else "MISSED") + ")")
        print(json.dumps({"bench": "runtime-flat", "rss_mib": flat_rss, "growth_mib": round(growth, 2),
                          "ok": growth <= 1}))
    ratio = rss / floor_rss
    own_pct, total_pct = own / seconds * 100, total / seconds * 100
    adapter_pct = total_pct - own_pct
    print(f"caldera run after {len(done)} of {commands} commands, idle {seconds:g} s at default intervals:")
    print(f"  RSS {rss:.1f} MiB vs floor {floor_rss:.1f} MiB (import requests, jsonschema, yaml): "
          f"{ratio:.3f} x (target <= 1.05: {'ok' if ratio <= 1.05 else 'MISSED'})")
    print(f"  against the runtime's dependencies now ({DEPENDENCIES}) {deps_rss:.1f} MiB: "
          f"{rss / deps_rss:.3f} x (target <= 1.05: {'ok' if rss / deps_rss <= 1.05 else 'MISSED'})")
    print(f"  then one log_get (its payload schema needs jsonschema): RSS {rss_schema:.1f} MiB, "
          f"{rss_schema / floor_rss:.3f} x the floor (for information)")
    print(f"  CPU {own_pct:.2f} % of a core caldera's own (target <= 0.5: {'ok' if own_pct <= 0.5 else 'MISSED'}), "
          f"{adapter_pct:.2f} % the adapter's calls, {total_pct:.2f} % together")
    print(json.dumps({"bench": "runtime-idle", "commands": len(done), "seconds": seconds, "rss_mib": round(rss, 1),
                      "floor_rss_mib": round(floor_rss, 1), "rss_ratio": round(ratio, 3),
                      "deps_rss_mib": round(deps_rss, 1), "rss_ratio_deps": round(rss / deps_rss, 3),
                      "rss_after_jsonschema_mib": round(rss_schema, 1),
                      "cpu_own_pct": round(own_pct, 3), "cpu_adapter_pct": round(adapter_pct, 3),
                      "cpu_with_adapter_pct": round(total_pct, 3), "ok": ratio <= 1.05 and own_pct <= 0.5}))


# A command that spawns nothing (no adapter, no health command): the long run measures the daemon,
# not 10,000 adapter calls.
FLAT_COMMAND = "collect_system_info"


def smaps(pid: int) -> dict[str, int]:
    """The daemon's resident KiB by kind of mapping (/proc/PID/smaps), read from outside: the
    main heap (brk), anonymous mappings (malloc's thread arenas, Python's 1 MiB obmalloc
    arenas, thread stacks: glibc's stacks are anonymous too), files; and the thread count."""
    kinds: dict[str, int] = {"heap": 0, "anon": 0, "anon-maps": 0, "stack": 0, "file": 0}
    name = ""
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            path = head[5] if len(head) > 5 else ""
            name = ("heap" if path == "[heap]" else "stack" if path.startswith("[stack") else
                    "anon" if not path else "file" if path.startswith("/") else "other")
            if name == "anon":
                kinds["anon-maps"] += 1
        elif head[0] == "Rss:":
            kinds[name] = kinds.get(name, 0) + int(head[1])
    status = Path(f"/proc/{pid}/status").read_text()
    kinds["threads"] = int(status.split("Threads:")[1].split()[0])
    return kinds


def long_run(store, pid: int, total: int, deadline: float, every: int = 1000) -> dict[int, float]:
    """Enqueue commands in batches until `total` have ended (the first 101 counted); the
    daemon's RSS after each `every` commands (and what grew, by kind of mapping), printed
    as it goes. A command the plane marked dispatched that has not started 60 s later is
    counted lost and not waited for."""
    wait, rss, lost = threading.Event(), {}, set()
    kinds = smaps(pid)
    finished = len(store.commands(1))
    while finished < total and time.monotonic() < deadline:
        batch = min(500, every, total - finished)
        for _ in range(batch):
            store.enqueue(1, FLAT_COMMAND, {}, 60)
        while time.monotonic() < deadline:
            now, open_ = time.time(), []
            for c in store.commands(1):
                if c["status"] == "dispatched" and not c.get("started_at") and now - c["dispatched_at"] > 60:
                    lost.add(c["id"])
                elif c["status"] not in ("succeeded", "failed"):
                    open_.append(c["id"])
            if not open_:
                break
            wait.wait(1)
        finished += batch
        if finished % every < batch or finished >= total:
            rss[finished] = proc_rss_mb(pid)
            now_kinds = smaps(pid)
            grew = ", ".join(f"{k} {now_kinds[k] - kinds.get(k, 0):+d}" for k in now_kinds
                             if now_kinds[k] != kinds.get(k, 0))
            kinds = now_kinds
            print(f"  {time.strftime('%H:%M:%S')} after {finished} commands: RSS {rss[finished]:.1f} MiB "
                  f"(KiB by mapping: {grew or 'same'})"
                  + (f" ({len(lost)} dispatched, never started: {sorted(lost)[:5]})" if lost else ""), flush=True)
    return rss


# `caldera report --once` in a wrapper that writes its own CPU (RUSAGE_SELF: the runtime's
# work) to a file; RUSAGE_CHILDREN of the whole run adds the adapter calls (the agent's code).
ONCE = ("import resource, sys\nfrom caldera.cli import main\nrc = main(['report', '--once', '--agent', 'bench'])\n"
        "u = resource.getrusage(resource.RUSAGE_SELF)\nopen(sys.argv[1], 'w').write(str(u.ru_utime + u.ru_stime))\n"
        "sys.exit(rc)\n")


def report_once(env, runs: int) -> None:
    floor_argv = [sys.executable, "-c", "import requests, jsonschema, yaml"]
    with tempfile.NamedTemporaryFile() as own_file:
        once_argv = [sys.executable, "-c", ONCE, own_file.name]
        child_cpu(once_argv, env)  # first run registers and warms the page cache
        floors, totals, owns = [], [], []
        for _ in range(runs):  # interleaved, so drift hits both alike
            floors.append(child_cpu(floor_argv, env))
            totals.append(child_cpu(once_argv, env))
            owns.append(float(Path(own_file.name).read_text()))
    floor, total, own = statistics.median(floors), statistics.median(totals), statistics.median(owns)
    print(f"report --once CPU, the runtime's own: {own * 1000:.0f} ms vs import floor {floor * 1000:.0f} ms: "
          f"ratio {own / floor:.2f} (target <= 1.3: {'ok' if own / floor <= 1.3 else 'MISSED'})")
    print(f"report --once CPU with the adapter's calls (status, settings get, health check): "
          f"{total * 1000:.0f} ms, ratio {total / floor:.2f}")


if __name__ == "__main__":
    sys.exit(main())
