"""`caldera run` as a container's PID 1: orphans are reaped, and no wait of the runtime races it.

In a container the image's command is PID 1 of its PID namespace, and every process
whose parent dies is re-parented to it: an agent whose helpers leave grandchildren
behind hands them to PID 1, which must wait for them or they stay zombies for the
life of the container. A reaper inside the runtime itself would have to call
waitpid(-1), and that takes the exit status of any child, also one the runtime waits
for by PID (subprocess.Popen.wait, host/proc.py's runner, the process supervisor):
those waits would then see a process that is already gone (ChildProcessError, or
subprocess's silent returncode 0) and report the wrong exit. Waiting only for PIDs the
runtime does not know races every fork that has not yet been recorded.

So PID 1 splits in two before anything else starts (`split_if_init`): the child goes
on to be the runtime, unchanged (its waits are its own: only its children can be
waited for by it); the parent stays PID 1 and does nothing but wait for whatever the
kernel hands it (waitpid(-1): orphans, and the runtime itself), forwarding SIGTERM,
SIGINT and SIGHUP to the runtime when a process sent them (`forwards`: one from the
terminal reached the runtime already). When the runtime ends, PID 1 exits with its status
(128 + N after a signal N), and the kernel ends what is left of the container.
Anywhere else (systemd, s6, supervisord, a terminal) caldera is not PID 1 and
nothing changes.
"""
from __future__ import annotations

import os
import signal
import sys

# What the runtime handles (caldera.daemon.signals); the kernel drops any other signal sent
# to a PID 1 that has no handler for it, so the others are left to that rule.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# What PID 1 waits for: those, and its children's ends.
WAITED = {signal.SIGCHLD, *FORWARDED}


def split_if_init(pid: int | None = None) -> None:
    """Return at once unless this process is PID 1 (`pid`: for tests). As PID 1: fork; the
    child returns and is the runtime; the parent reaps until the runtime ends and never
    returns. Call it first, before any thread, file or lock exists: `caldera run` calls it
    while caldera.cli is being imported (see there)."""
    if (os.getpid() if pid is None else pid) != 1:
        return
    # Blocked across the fork: the runtime inherits them blocked and unblocks them once its
    # handlers are in place (Signals.install), so a stop forwarded early waits for it.
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    try:
        child = os.fork()
    except OSError as exc:  # no process to spare: run unsplit (orphans then stay zombies)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        _say(f"WARNING caldera.reaper: caldera run is PID 1 but could not fork a reaper ({exc.strerror}); "
             "orphans will not be reaped")
        return
    if child == 0:
        return
    reap(child)


def forwards(si_code: int) -> bool:
    """Whether PID 1 passes a signal on to the runtime: only one a process sent (kill(2),
    sigqueue, tgkill: si_code <= 0, the kernel's SI_FROMUSER). One the kernel sent (si_code
    SI_KERNEL) comes from the terminal: Ctrl-C, Ctrl-\\ or a hangup reach the whole foreground
    process group, the runtime included, so the runtime has its own copy already; passing it
    on would count one Ctrl-C twice (the second signal cancels the running command)."""
    return si_code <= 0


def reap(child: int) -> None:
    """PID 1's whole life after the fork: forward the stop and reload signals a process sent
    to `child`, wait for every process the kernel gives it, exit with `child`'s status. Never
    returns. Everything arrives through sigwaitinfo (the signals stay blocked, no handler
    runs), so each signal comes with its sender's si_code and nothing is lost between a look
    and a wait."""
    signal.pthread_sigmask(signal.SIG_BLOCK, WAITED)
    _say(f"INFO caldera.reaper: caldera run is PID 1: this process reaps orphans and forwards SIGTERM, "
         f"SIGINT and SIGHUP; the runtime is pid {child}")
    _reap_exited(child)  # any that ended before SIGCHLD was blocked: that SIGCHLD was discarded
    while True:
        info = signal.sigwaitinfo(WAITED)
        if info.si_signo == signal.SIGCHLD:
            _reap_exited(child)
        elif forwards(info.si_code):
            try:
                os.kill(child, info.si_signo)
            except ProcessLookupError:  # the runtime is ending; its SIGCHLD follows
                pass


def _reap_exited(child: int) -> None:
    """Wait for every child that has ended (SIGCHLD is not queued: one may stand for many);
    exit with the runtime's status once it is among them."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:  # nothing left to wait for: cannot happen before the runtime's end
            os._exit(1)
        if pid == 0:
            return
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            os._exit(code if code >= 0 else 128 - code)


def _say(line: str) -> None:
    """One plain log line on stderr (logging is not set up in PID 1); a closed stderr is no reason to fail."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
