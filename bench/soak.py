#!/usr/bin/env python3
"""The chaos soak (issue 26; docs/reliability.md): one `caldera run` under a supervisor, against
the embedded plane behind a fault-injecting proxy, for an hour of combined faults; then a calm
tail and the accounting. Exit 1 on any accounting miss, each printed as a sentence.

    python bench/soak.py --minutes 60 --seed N
    python bench/soak.py --short --seed N          # CI: under 4 minutes, every episode kind once
    python bench/soak.py --short --skip disk_full  # develop without an episode kind

The same seed gives the same schedule of episodes, kills, adapter moods and commands.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

import soak_account as acc  # noqa: E402
from soak_plane import KILL_HOLD_LIMIT, MODES, FaultProxy, Held, RecordingPlane, durably_kept  # noqa: E402
from soak_runtime import (  # noqa: E402
    ADAPTER,
    ADAPTER_TIMEOUT,
    AGENT,
    INSTANCE,
    AgentTree,
    Disk,
    Sample,
    Supervisor,
    age_seconds,
    become_subreaper,
    cmdline,
    descendants,
    proc_table,
    sample,
)

KINDS = tuple(MODES) + ("disk_full",)
MOODS = ("normal", "slow", "hang", "garbage", "exit1")
MOOD_WEIGHTS = (50, 15, 10, 12, 13)
HEARTBEAT, POLL = 5, 2  # the plane's intervals
COMMAND_TIMEOUT = 120
NS_MARK = "SOAK_IN_NAMESPACE"
STRETCH = 600.0  # the long form's kill-free stretch (memory and threads of one process)
STRETCH_SETTLE = 60.0  # its resources are measured from this far in


@dataclass
class Plan:
    calm: float
    chaos_end: float
    tail_min: float
    tail_max: float
    episodes: list[tuple[float, float, str]] = field(default_factory=list)
    kills: list[float] = field(default_factory=list)
    moods: list[tuple[float, float, str]] = field(default_factory=list)
    commands: list[tuple[float, str, dict[str, Any], bool]] = field(default_factory=list)
    stretch: tuple[float, float] | None = None  # the long form's kill-free stretch, inside the chaos


def plan(rng: random.Random, short: bool, minutes: float, skip: set[str]) -> Plan:
    """Every random choice of the run, made up front from the seed (times from the start)."""
    if short:
        p = Plan(calm=25.0, chaos_end=0.0, tail_min=20.0, tail_max=75.0)
    else:
        p = Plan(calm=60.0, chaos_end=minutes * 60 - 120, tail_min=120.0, tail_max=300.0)
    kinds = [k for k in KINDS if k not in skip]
    order = rng.sample(kinds, len(kinds))  # every kind once first, in a seeded order
    t = p.calm
    while order or (not short and t < p.chaos_end):
        kind = order.pop(0) if order else rng.choice([k for k in kinds if k != "disk_full"])
        length = _length(rng, kind, short)
        p.episodes.append((t, t + length, kind))
        t += length
    p.chaos_end = t
    t = p.calm + rng.uniform(5, 15)
    while t < p.chaos_end:
        p.kills.append(t)
        t += rng.uniform(15, 25) if short else rng.uniform(60, 120)
    _plan_moods(rng, p, short)
    _plan_commands(rng, p, short)
    if not short:
        _plan_stretch(rng, p)
    return p


def _plan_stretch(rng: random.Random, p: Plan) -> None:
    """STRETCH seconds without a kill, somewhere in the chaos (episodes, moods and commands go
    on): one runtime process lives through all of it, so its own growth can be measured."""
    earliest, latest = p.calm + 30, p.chaos_end - STRETCH - 30
    if latest < earliest:
        return  # too short a run: the figures say so
    start = rng.uniform(earliest, latest)
    p.stretch = (start, start + STRETCH)
    p.kills = [t for t in p.kills if not start - 5 <= t <= start + STRETCH]


def _length(rng: random.Random, kind: str, short: bool) -> float:
    if kind == "port_closed":
        return rng.uniform(3, 5) if short else rng.uniform(3, 8)
    if kind == "disk_full":
        return 15.0 if short else 60.0
    return rng.uniform(6, 9) if short else rng.uniform(20, 40)


def _plan_moods(rng: random.Random, p: Plan, short: bool) -> None:
    t = p.calm
    forced = rng.sample(MOODS[1:], len(MOODS) - 1)  # each failing mood at least once
    while t < p.chaos_end:
        if forced:
            mood = forced.pop(0) if not p.moods or p.moods[-1][2] == "normal" else "normal"
        else:
            mood = rng.choices(MOODS, MOOD_WEIGHTS)[0]
        length = rng.uniform(4, 9) if short else rng.uniform(10, 60)
        end = min(t + length, p.chaos_end)
        p.moods.append((t, end, mood))
        t = end


def _plan_commands(rng: random.Random, p: Plan, short: bool) -> None:
    t, n = 5.0, 0
    while t < p.chaos_end:
        n += 1
        kind = rng.choice(("pause", "resume", "run_now", "settings_set", "settings_set_out", "settings_get",
                           "log_get", "collect_system_info"))
        payload: dict[str, Any] = {}
        if kind == "settings_set":
            payload = {"values": rng.choice(({"limit": round(rng.uniform(0.2, 0.8), 2)},
                                             {"interval": rng.randint(1, 1440)}, {"note": f"soak note {n}"}))}
        elif kind == "settings_set_out":
            payload = {"values": rng.choice(({"limit": rng.choice((1.5, 2.0, -0.5))},
                                             {"interval": rng.choice((0, 5000, 99999))}))}
        elif kind == "log_get":
            payload = {"name": "soak.log"}
        p.commands.append((t, kind.removesuffix("_out"), payload, kind.endswith("_out")))
        t += rng.uniform(2, 3.5) if short else rng.uniform(3, 5)


# ---- the namespace for the tmpfs ----------------------------------------------------------------

def enter_namespace(argv: list[str]) -> None:
    """Re-exec in a private mount namespace (the tmpfs vanishes with the soak whatever happens):
    as root plainly, else mapped to root in a user namespace. Returns when that cannot be done."""
    if os.environ.get(NS_MARK) or not shutil.which("unshare"):
        return
    prefix = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        prefix.insert(1, "--map-root-user")
    probe = subprocess.run(prefix + ["true"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        print(f"soak: cannot enter a mount namespace ({probe.stderr.decode(errors='replace').strip()})", flush=True)
        return
    os.environ[NS_MARK] = "1"
    os.execvp(prefix[0], prefix + [sys.executable, *argv])


# ---- the run -------------------------------------------------------------------------------

class Soak:
    def __init__(self, args: argparse.Namespace, root: Path):
        self.args, self.root = args, root
        self.rng = random.Random(args.seed)
        self.plan = plan(self.rng, args.short, args.minutes, args.skip)
        self.stop = threading.Event()
        self.bootstrap = "agt_boot_" + secrets.token_hex(24)
        self.plane = RecordingPlane(root / "plane.db", tokens={self.bootstrap: INSTANCE},
                                    heartbeat_interval=HEARTBEAT, poll_interval=POLL).start()
        self.tree = AgentTree(root, self.bootstrap)
        self.proxy = FaultProxy(("127.0.0.1", self.plane.port), random.Random(args.seed + 1), self.stop,
                                durably_kept(self.plane, self.tree.state_dir))
        self.disk = Disk(self.tree.state_dir)
        self.supervisor = Supervisor(self.tree, threading.Event())
        self.timeline = acc.Timeline()
        self.samples: list[Sample] = []
        self.baseline: Sample | None = None
        self.episode_counts: dict[str, int] = {}
        self.out_of_bounds: set[int] = set()
        self.misses: list[str] = []
        self.notes: list[str] = []
        self.t0 = self.disk_started = 0.0
        self.disk_topup = threading.Event()  # set: the full disk's top-up stops
        self.stretch_at: list[float] = []  # wall times of the stretch's start and end, as they came
        self.stretch_figure = ""

    # -- setup

    def setup(self) -> None:
        if "disk_full" not in self.args.skip:
            why = self.disk.mount()
            if why is not None:
                if os.geteuid() == 0 and self.args.short:
                    self.misses.append(f"the full-disk episode cannot run as root: {why}.")
                print(f"soak: skipping the full-disk episode: {why}", flush=True)
                self.args.skip.add("disk_full")
                self.plan.episodes = [e for e in self.plan.episodes if e[2] != "disk_full"]
        self.tree.install(self.proxy.url)
        if not become_subreaper():
            self.notes.append("not a child subreaper: orphans of a killed runtime go to init")
        self.supervisor.start()
        threading.Thread(target=self._sampler, name="soak-sampler", daemon=True).start()

    def _sampler(self) -> None:
        while not self.stop.wait(2.0):
            pid = self.supervisor.pid()
            got = sample(pid) if pid else None
            if got is not None:
                self.samples.append(got)

    def wait_online(self, timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.plane.store.reports(INSTANCE, last=True) is not None:
                return True
            self.stop.wait(0.5)
        return False

    # -- the schedule

    def run(self) -> None:
        self.t0 = time.time()
        events: list[tuple[float, int, str, Any]] = []
        for start, end, kind in self.plan.episodes:
            events += [(start, 0, "episode", kind), (end, 0, "episode_end", kind)]
        events += [(t, 1, "kill", None) for t in self.plan.kills]
        events += [(s, 2, "mood", m) for s, _, m in self.plan.moods]
        events += [(t, 3, "command", (k, p, o)) for t, k, p, o in self.plan.commands]
        events.append((self.plan.calm, 4, "baseline", None))
        events.append((self.plan.chaos_end, 5, "calm", None))
        if self.plan.stretch is not None:
            events += [(self.plan.stretch[0], 6, "stretch", "begins"), (self.plan.stretch[1], 6, "stretch", "ends")]
        mood_started = (self.t0, "normal")
        for at, _, what, arg in sorted(events, key=lambda e: (e[0], e[1])):
            if self.stop.wait(max(0.0, self.t0 + at - time.time())):
                return
            if what == "mood":
                self._mood_end(mood_started)
                mood_started = (time.time(), arg)
                self.tree.set_mood(arg)
            else:
                getattr(self, f"_{what}")(arg)
        self._mood_end(mood_started)
        self.tree.set_mood("normal")

    def _mood_end(self, started: tuple[float, str]) -> None:
        self.timeline.moods.append((started[0], time.time(), started[1]))

    def _episode(self, kind: str) -> None:
        self.episode_counts[kind] = self.episode_counts.get(kind, 0) + 1
        print(f"  {time.time() - self.t0:6.1f} s  episode {kind}", flush=True)
        if kind == "disk_full":
            self.disk_started = time.time()
            used = self.disk.usage()
            taken = self.disk.fill()
            self.notes.append(f"the full disk took {taken} bytes; the largest files before: {used}")
            # Kept full: the runtime's own deletions (a delivered outbox item) free room, which a
            # one-shot fill left it (seed 63's long run: full for seconds of its minute).
            self.disk_topup = threading.Event()
            threading.Thread(target=self._top_up, args=(self.disk_topup,), name="disk-top-up", daemon=True).start()
            return
        stale = None
        if kind == "401":
            self.plane.drop_session(INSTANCE)
        elif kind == "403":
            stale = self.plane.session_token(INSTANCE)
        held = self.proxy.set_mode(kind, stale)
        if held is not None:
            self._held(held, "the port_closed cut")

    def _top_up(self, done: threading.Event) -> None:
        while not done.wait(1.0) and not self.stop.is_set():
            self.disk.fill()

    def _episode_end(self, kind: str) -> None:
        if kind == "disk_full":
            self.disk_topup.set()
            self._look_at_full_disk()
            self.disk.free()
            self.timeline.disk.append((self.disk_started, time.time()))
        self.proxy.set_mode("healthy")

    def _look_at_full_disk(self) -> None:
        """What the operator is told while the disk is full: the heartbeats go on, and health
        and `caldera status` say so (issue 26, item 2)."""
        beats = [t for t in self.plane.ledger.heartbeats if t >= self.disk_started + 1]
        if not beats:
            self.misses.append("no heartbeat reached the plane while the state dir's disk was full.")
        runtime = self.plane.store._read("SELECT health FROM runtime_status WHERE instance_id=?", (INSTANCE,))
        health = runtime[0]["health"] if runtime else None
        if not health or not acc.CAUSE_WORDS["disk"].search(health):
            self.misses.append("while the disk was full, the last state report's health did not say so.")
        status = subprocess.run([sys.executable, "-m", "caldera.cli", "status", "--agent", AGENT],
                                env=self.tree.env, capture_output=True, text=True, timeout=60)
        if not acc.CAUSE_WORDS["disk"].search(status.stdout):  # a crash's "No space left" on stderr says nothing
            self.misses.append("while the disk was full, `caldera status` did not say so.")

    def _kill(self, _: Any) -> None:
        exited: list[bool] = []
        held = self.proxy.handouts.when_quiet(lambda: exited.append(self.supervisor.kill()), self.stop)
        self.timeline.kills.append(time.time())
        waited = f" (held {held.waited:.1f} s for a hand-out to be confirmed)" if held.waited >= 0.1 else ""
        print(f"  {time.time() - self.t0:6.1f} s  SIGKILL caldera run{waited}", flush=True)
        self._held(held, "a SIGKILL")
        if exited and not exited[0]:
            self.notes.append(f"the runtime had not exited {time.time() - self.t0:.0f} s in, 10 s after its SIGKILL")

    def _held(self, held: Held, what: str) -> None:
        """A wait for a quiet wire that hit its limit: the command(s) it may have cost, by name."""
        if held.unconfirmed or held.on_wire:
            ids = ", ".join(str(cid) for cid in held.unconfirmed) or "none"
            self.notes.append(f"{what} {time.time() - self.t0:.0f} s in went after {KILL_HOLD_LIMIT:.0f} s with "
                              f"command(s) {ids} handed out but not confirmed, {held.on_wire} answer(s) on the wire")

    def _stretch(self, edge: str) -> None:
        self.stretch_at.append(time.time())
        print(f"  {time.time() - self.t0:6.1f} s  kill-free stretch {edge}", flush=True)

    def _command(self, arg: tuple[str, dict[str, Any], bool]) -> None:
        kind, payload, out_of_bounds = arg
        cid = self.plane.store.enqueue(INSTANCE, kind, payload, timeout_seconds=COMMAND_TIMEOUT)
        if out_of_bounds:
            self.out_of_bounds.add(cid)

    def _baseline(self, _: Any) -> None:
        pid = self.supervisor.pid()
        self.baseline = sample(pid) if pid else None
        print(f"  {time.time() - self.t0:6.1f} s  calm minute over; chaos begins", flush=True)

    def _calm(self, _: Any) -> None:
        self.proxy.set_mode("healthy")
        self.tree.set_mood("normal")
        print(f"  {time.time() - self.t0:6.1f} s  calm tail", flush=True)

    def tail(self) -> float:
        """Wait for the calm tail to settle; its length."""
        start = time.time()
        while time.time() - start < self.plan.tail_max:
            if time.time() - start >= self.plan.tail_min and self._settled():
                break
            self.stop.wait(1.0)
        self.stop.wait(3 * 2.0)  # a few more samples of the settled runtime
        return time.time() - start

    def _settled(self) -> bool:
        done = all(c["status"] in ("succeeded", "failed") for c in self.plane.store.commands(INSTANCE))
        outbox = self.tree.state_dir / "outbox"
        return done and not any(p for p in outbox.glob("*.json") if not p.name.startswith("."))

    # -- the end

    def account(self, tail_length: float) -> None:
        store = self.plane.store
        commands = store.commands(INSTANCE)
        now = time.time()
        self.misses += acc.command_misses(commands, self.plane.ledger.finishes, self.out_of_bounds, self.timeline, now)
        self.misses += acc.order_misses(commands)
        self.misses += acc.outbox_misses(self.tree.state_dir)
        registers = len(self.plane.ledger.registers)
        kills = len(self.supervisor.kills)
        auth = self.episode_counts.get("401", 0) + self.episode_counts.get("403", 0)
        if registers > kills + auth + 2:
            self.misses.append(f"{registers} registers, more than kills + auth episodes + 2 = {kills + auth + 2}.")
        last_beat = max(self.plane.ledger.heartbeats, default=0.0)
        if now - last_beat > 3 * HEARTBEAT:
            self.misses.append(f"no heartbeat in the last {now - last_beat:.0f} s of the calm tail.")
        if self.supervisor.clean_exit:
            self.misses.append("caldera run exited 0 on its own during the soak (not restarted).")
        self.misses += self._resource_misses()
        self.misses += self._stretch_misses()
        self.misses += self._process_misses()
        code = self.supervisor.terminate()
        if code != 0:
            dumped = " (its threads' stacks are at the end of runtime.log)" if self.supervisor.stuck else ""
            self.misses.append(f"caldera run exited {code} on SIGTERM after the calm tail, not 0{dumped}.")
        self.misses += self._leftover_misses()
        tokens = [self.bootstrap, *self.plane.ledger.tokens]
        self.misses += acc.token_misses(tokens, self.tree.log_path, self.tree.state_dir, acc.plane_texts(store))
        self._figures(commands, registers, kills, tail_length)

    def _resource_misses(self) -> list[str]:
        end = sample(self.supervisor.pid() or 0)
        base = self.baseline
        if base is None or end is None:
            return ["no resource sample of the runtime at the calm minute or at the end."]
        self.end_sample = end
        misses = []
        if end.rss_kib > 1.3 * base.rss_kib:
            misses.append(f"RSS at the end {end.rss_kib} KiB is over 1.3x the calm minute's {base.rss_kib} KiB.")
        if end.threads > base.threads + 5:
            misses.append(f"{end.threads} threads at the end, more than the calm minute's {base.threads} + 5.")
        if end.fds > base.fds + 5:
            misses.append(f"{end.fds} open fds at the end, more than the calm minute's {base.fds} + 5.")
        return misses

    def _stretch_misses(self) -> list[str]:
        """The long form's kill-free stretch: one process throughout, whose floor over its last
        minute (the least RSS, threads and fds sampled) is within 1.3x (RSS) and +5 of its floor
        over the minute after STRETCH_SETTLE. Floors, not single samples: the chaos goes on, and
        an adapter call or a held connection in flight at one sample is not a leak (seed 62's
        first rule, one sample each, read fds 32 -> 38 so); a leak raises the floor."""
        if self.plan.stretch is None:
            if not self.args.short:
                self.notes.append(f"no kill-free stretch: the chaos phase is shorter than {STRETCH + 60:.0f} s")
            return []
        if len(self.stretch_at) < 2:
            return ["the kill-free stretch did not run to its end."]
        start, end = self.stretch_at
        exits = [f"pid {pid} exited {code}" for t, pid, code in self.supervisor.exits if start <= t <= end]
        if exits:
            return [f"the runtime exited on its own during the kill-free stretch ({', '.join(exits)}) and was "
                    f"restarted."]
        early = [s for s in self.samples if start + STRETCH_SETTLE <= s.at <= start + STRETCH_SETTLE + 60]
        late = [s for s in self.samples if end - 60 <= s.at <= end]
        if not early or not late or len({s.pid for s in early + late}) != 1:
            return ["no samples of one runtime process through the kill-free stretch."]
        a, b = _floor(early), _floor(late)
        self.stretch_figure = (f"pid {late[-1].pid}, {end - start:.0f} s, floors of a minute: RSS {a.rss_kib} -> "
                               f"{b.rss_kib} KiB, threads {a.threads} -> {b.threads}, fds {a.fds} -> {b.fds}")
        misses = []
        if b.rss_kib > 1.3 * a.rss_kib:
            misses.append(f"in the kill-free stretch the runtime's RSS floor grew from {a.rss_kib} KiB to "
                          f"{b.rss_kib} KiB, over 1.3x.")
        if b.threads > a.threads + 5 or b.fds > a.fds + 5:
            misses.append(f"in the kill-free stretch the runtime's thread floor went {a.threads} -> {b.threads} and "
                          f"its open-fd floor {a.fds} -> {b.fds}, more than 5 up.")
        return misses

    def _process_misses(self) -> list[str]:
        """While the settled runtime runs: no zombie under it, no adapter call older than its timeout."""
        pid = self.supervisor.pid()
        table = proc_table()
        misses = []
        for child in descendants(table, pid) if pid else []:
            if table[child][1] == "Z":
                misses.append(f"a zombie under caldera run: pid {child}.")
        for other, (_, state, start) in table.items():
            if state != "Z" and str(ADAPTER) in cmdline(other) and age_seconds(start) > ADAPTER_TIMEOUT + 10:
                misses.append(f"an adapter process (pid {other}) has lived {age_seconds(start):.0f} s, past its "
                              f"{ADAPTER_TIMEOUT} s timeout.")
        return misses

    def _leftover_misses(self) -> list[str]:
        """After caldera run stopped: nothing of it or its adapter is left, no zombie child of the soak."""
        self.stop.wait(1.0)
        me, misses = os.getpid(), []
        for pid, (ppid, state, _) in proc_table().items():
            line = cmdline(pid)
            if pid != me and state != "Z" and (str(ADAPTER) in line or str(self.root) in line):
                misses.append(f"a process was left after caldera run stopped: pid {pid}: {line[:120]}.")
            elif ppid == me and state == "Z":
                misses.append(f"a zombie was left after caldera run stopped: pid {pid}.")
        return misses

    def _figures(self, commands: list[dict[str, Any]], registers: int, kills: int, tail: float) -> None:
        finishes = sum(len(v) for v in self.plane.ledger.finishes.values())
        by_status: dict[str, int] = {}
        for c in commands:
            by_status[c["status"]] = by_status.get(c["status"], 0) + 1
        base, end = self.baseline, getattr(self, "end_sample", None)
        longest = self._longest_lived()
        print("\nfigures")
        print(f"  seed              {self.args.seed}")
        print(f"  length            {time.time() - self.t0:.0f} s (calm tail {tail:.0f} s)")
        print(f"  commands          {len(commands)} ({', '.join(f'{k} {v}' for k, v in sorted(by_status.items()))})")
        print(f"  finish requests   {finishes} (duplicates {finishes - len(self.plane.ledger.finishes)})")
        print(f"  kills             {kills} (runtime starts {len(self.supervisor.starts)}, orphans swept "
              f"{len(self.supervisor.swept)})")
        print(f"  episodes          {', '.join(f'{k} {v}' for k, v in sorted(self.episode_counts.items()))}")
        moods: dict[str, float] = {}
        for s, e, m in self.timeline.moods:
            moods[m] = moods.get(m, 0.0) + e - s
        print(f"  adapter moods     {', '.join(f'{m} {v:.0f} s' for m, v in sorted(moods.items()))}")
        print(f"  registers         {registers}")
        if base and end:
            print(f"  RSS               {base.rss_kib} KiB -> {end.rss_kib} KiB")
            print(f"  threads, fds      {base.threads} -> {end.threads}, {base.fds} -> {end.fds}")
        if self.stretch_figure:
            print(f"  stretch           {self.stretch_figure}")
        if longest:
            print(f"  longest-lived     pid {longest[0]}, {longest[1]:.0f} s: RSS {longest[2]} -> {longest[3]} KiB")
        print(f"  proxy             {json.dumps(dict(sorted(self.proxy.counts.items())))}")
        for note in self.notes:
            print(f"  note              {note}")

    def _longest_lived(self) -> tuple[int, float, int, int] | None:
        by_pid: dict[int, list[Sample]] = {}
        for s in self.samples:
            by_pid.setdefault(s.pid, []).append(s)
        if not by_pid:
            return None
        pid, got = max(by_pid.items(), key=lambda kv: kv[1][-1].at - kv[1][0].at)
        return pid, got[-1].at - got[0].at, got[0].rss_kib, got[-1].rss_kib

    def close(self) -> None:
        self.stop.set()
        self.supervisor.terminate(grace=10)
        self.proxy.close()
        self.plane.stop()
        self.disk.free()
        self.disk.unmount()


def _floor(samples: list[Sample]) -> Sample:
    """The least of each figure over `samples` (of one process)."""
    return Sample(samples[-1].at, samples[-1].pid, min(s.rss_kib for s in samples),
                  min(s.threads for s in samples), min(s.fds for s in samples))


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="length of the long form (default 60)")
    parser.add_argument("--seed", type=int, default=None, help="the schedule's seed (default: a random one)")
    parser.add_argument("--short", action="store_true", help="the CI form: under 4 minutes, every kind once")
    parser.add_argument("--skip", default="", help=f"episode kinds to leave out, comma-separated: {', '.join(KINDS)}")
    parser.add_argument("--keep", action="store_true", help="keep the temporary tree (logs, plane database)")
    args = parser.parse_args(argv)
    args.skip = {k for k in args.skip.split(",") if k}
    unknown = args.skip - set(KINDS)
    if unknown:
        parser.error(f"--skip: unknown kind(s) {', '.join(sorted(unknown))}")
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)
    return args


def _on_signal(signum: int, _frame: Any) -> None:
    """SIGTERM or SIGINT: unwind the main thread through `soak.close()` (the runtime stopped,
    the tmpfs unmounted); a second signal meanwhile is ignored."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    print(f"soak: {signal.Signals(signum).name}: shutting down", flush=True)
    raise SystemExit(128 + signum)


def main(argv: list[str]) -> int:
    args = parse(argv)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    if "disk_full" not in args.skip:
        enter_namespace([str(Path(__file__).resolve()), *argv])
    root = Path(tempfile.mkdtemp(prefix="caldera-soak-"))
    soak = Soak(args, root)
    p = soak.plan
    print(f"soak: seed {args.seed}, {'short' if args.short else f'{args.minutes:g}-minute'} form, "
          f"{len(p.episodes)} episodes, {len(p.kills)} kills, {len(p.moods)} mood spells, {len(p.commands)} commands; "
          f"chaos {p.calm:.0f}-{p.chaos_end:.0f} s; tree {root}", flush=True)
    try:
        soak.setup()
        if not soak.wait_online():
            soak.misses.append("the runtime did not come online within 60 s.")
        else:
            soak.run()
            soak.account(soak.tail())
    finally:
        soak.close()
        if args.keep or soak.misses:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    if soak.misses:
        print(f"\n{len(soak.misses)} miss(es):")
        for miss in soak.misses:
            print(f"  - {miss}")
        return 1
    print("\nno misses")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
