#!/bin/bash
# The package under a real systemd (issues 18 and 25; docs/packaging.md, "CI under systemd").
#
# Boots a Debian root (SUITE: trixie = Debian 13, bookworm = Debian 12) with
# systemd in a container (systemd-nspawn), installs the .deb there, checks the unit
# with that suite's systemd-analyze (verify, security), starts `caldera plane serve`,
# creates an admin user with sudo and runs README.md's "Install on a host" block AS
# WRITTEN IN README.md NOW (extracted at test time; sudoedit through an editor script).
# Then checks:
# registered + reporting + a command round trip within 60 s, `caldera status`
# without sudo, root's CLI verbs leave no root-owned state, `systemctl reload`,
# kill -9 -> restarted within 15 s with nothing lost, an upgrade restarts the
# agent, `systemctl stop` <= 15 s, a broken config ends `failed` with <= 1
# restart, the cron line, a process agent's 40 s graceful stop outlasting a
# TimeoutStopSec=10s drop-in (the daemon's EXTEND_TIMEOUT_USEC: Result=success,
# no kill), and `apt-get purge` leaves nothing running. Before those, .ci/code-agents.sh (issue
# 39): README's "Code agents" blocks, a turn of each backend (Codex, Claude Code, OpenCode) from
# the plane, restarts mid-turn, another agent's secrets asked for, the key nowhere, stop.
# Then .ci/home-agent.sh (issue 23):
# an adapter agent that lives in its owner's home, README's block for it, every verb,
# owners, the secrets denied to a third account, exposure of both kinds, a kind switch.
#
# Usage: .ci/systemd.sh SUITE [DEB | DIR-with-one-caldera_*.deb]
#   SUITE: trixie or bookworm. Without a .deb it builds one (packaging/build-deb.sh,
#   tests skipped: .ci/deb.sh runs them in its own build). One .deb, built on
#   Debian 12, serves both suites.
# Needs root on a Debian 12 host (CI's). Installs debootstrap and systemd-container itself; the
# three pinned code-agent CLIs come from the host's npm caches (.ci/install-*.sh, which .ci/run
# runs first; without them those scripts install them, with npm).
# The base root (debootstrap + the package's Debian dependencies) is cached in
# $CALDERA_CI_CACHE (default /var/cache/caldera-ci), keyed on suite + mirror + package
# list (.ci/root.sh).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SUITE=${1:-}
case "$SUITE" in
	trixie | bookworm) shift ;;
	*) echo "usage: .ci/systemd.sh trixie|bookworm [DEB | DIR]" >&2; exit 2 ;;
esac
AGENT=task-agent
INSTANCE=7
TOKEN=ci-boot-$RANDOM$RANDOM$RANDOM
INSTANCE2=8  # the agent installed but left unconfigured at first
TOKEN2=ci-boot-$RANDOM$RANDOM$RANDOM
# .ci/code-agents.sh's agents for Claude Code's and OpenCode's turn across a restart
CA_INSTANCES=(10 11)
CA_TOKENS=("ci-boot-$RANDOM$RANDOM$RANDOM" "ci-boot-$RANDOM$RANDOM$RANDOM")
NSPAWN_PID=
CPID=
WORK=
t0=$(date +%s)

CI_NAME=systemd
# shellcheck source=.ci/boot.sh
. "$ROOT/.ci/boot.sh"
trap cleanup EXIT
trap 'exit 130' INT TERM

[ "$(id -u)" -eq 0 ] || fail "needs root (debootstrap, systemd-nspawn, nsenter)"

step "tools"
ci_tools
step "the .deb"
DEB=$(the_deb "${1:-}")
VERSION=$(dpkg-deb -f "$DEB" Version)
echo "$DEB ($VERSION)"

step "base root (debootstrap $SUITE, cached)"
# shellcheck source=.ci/root.sh
. "$ROOT/.ci/root.sh"
b0=$(date +%s)
BASE=$(base_root "$SUITE" "${BOOT_PACKAGES[@]}") || fail "debootstrap $SUITE"
t_base="$(( $(date +%s) - b0 )) s"

step "boot the container (systemd-nspawn -b)"
boot_container "$BASE"

step "apt-get install ./$(basename "$DEB") (as root)"
mkdir -p "$C/root/ci"
cp "$DEB" "$C/root/ci/"
if ! inside sh -c "cd /root/ci && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends ./$(basename "$DEB")" > "$WORK/apt.log" 2>&1; then
	# A dependency the cached base lacks: fetch the lists once and retry.
	inside sh -c "apt-get update -q && cd /root/ci && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends ./$(basename "$DEB")" \
		> "$WORK/apt.log" 2>&1 || { cat "$WORK/apt.log"; fail "apt-get install"; }
fi
[ "$(unit_prop NeedDaemonReload)" = no ] || fail "NeedDaemonReload=yes after install: postinst did not daemon-reload"
got=$(inside caldera --version)
[ "$got" = "caldera $VERSION" ] || fail "caldera --version said '$got', want 'caldera $VERSION'"
echo "installed; $got; no daemon-reload pending"

step "systemd-analyze verify and security, by this suite's own systemd"
# .ci/deb.sh checks the unit with the host's systemd (Debian 12's 252); the unit must be
# as clean for the suite's (257 on Debian 13). --man=no: minbase has no man(1).
inside sh -c 'mkdir -p /root/ci/unit && cp /usr/lib/systemd/system/caldera@.service /root/ci/unit/'
inside systemd-analyze verify --man=no /root/ci/unit/caldera@.service > "$WORK/verify" 2>&1 \
	|| { cat "$WORK/verify"; fail "systemd-analyze verify exited non-zero"; }
[ ! -s "$WORK/verify" ] || { cat "$WORK/verify"; fail "systemd-analyze verify printed warnings"; }
score=$(inside systemd-analyze security --offline=yes --no-pager /root/ci/unit/caldera@.service 2>&1 \
	| sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
[ -n "$score" ] || fail "no exposure score from systemd-analyze security"
awk -v s="$score" -v m="${CALDERA_MAX_EXPOSURE:-4.5}" 'BEGIN { exit !(s <= m) }' || fail "exposure $score is above ${CALDERA_MAX_EXPOSURE:-4.5}"
echo "verify: no warnings; security: exposure $score"

step "caldera plane serve (inside)"
inside systemd-run --quiet --unit=ci-plane -p User=caldera -p StateDirectory=ci-plane \
	caldera plane serve --host 127.0.0.1 --port 0 --db /var/lib/ci-plane/plane.db \
	--bootstrap-token "$TOKEN" --instance-id "$INSTANCE" --bootstrap-token "$TOKEN2" --instance-id "$INSTANCE2" \
	--bootstrap-token "${CA_TOKENS[0]}" --instance-id "${CA_INSTANCES[0]}" \
	--bootstrap-token "${CA_TOKENS[1]}" --instance-id "${CA_INSTANCES[1]}" \
	--heartbeat-interval 2 --poll-interval 1 \
	--url-file /var/lib/ci-plane/url
wait_until 20 "the plane's URL file" test -s "$C/var/lib/ci-plane/url" >/dev/null
URL=$(cat "$C/var/lib/ci-plane/url")
echo "plane at $URL"

step "admin user with sudo; the editor sudoedit runs"
make_admin "$URL" "$INSTANCE" "$TOKEN"
# The operator's download: the .deb in the admin's home.
cp "$DEB" "$C/home/admin/"
inside chown admin:admin "/home/admin/$(basename "$DEB")"

step "README.md's \"Install on a host\" block, as the admin"
readme_install
step "registered, reporting and running commands within 60 s of the README block"
cfg=$C/etc/caldera/agents/$AGENT
# Owner names as the container knows them (stat on the host would use the host's passwd).
incfg=/etc/caldera/agents/$AGENT
inside stat -c '%n %U:%G %a' "$incfg/agent.env" "$incfg/secrets.env"
[ "$(inside stat -c '%U:%G %a' "$incfg/secrets.env")" = "caldera:caldera 600" ] || fail "secrets.env is not caldera:caldera 0600 after sudoedit"
[ "$(inside stat -c '%U:%G %a' "$incfg/agent.env")" = "root:caldera 640" ] || fail "agent.env is not root:caldera 0640 after sudoedit"
registered() { plane agents --json | grep -q "\"$INSTANCE\"\\|: *$INSTANCE[,}]"; }
reported() { [ -n "$(plane reports --instance "$INSTANCE" --last --json | tr -d '[]{} \n')" ]; }
roundtrip() {  # enqueue collect_system_info; wait for `succeeded`
	local id
	id=$(plane enqueue --instance "$INSTANCE" collect_system_info)
	# shellcheck disable=SC2317
	done_ok() { plane commands --instance "$INSTANCE" --json | python3 -c '
import json, sys
want = int(sys.argv[1])
rows = json.load(sys.stdin)
rows = rows.get("commands", rows) if isinstance(rows, dict) else rows
sys.exit(0 if any(int(r["id"]) == want and r["status"] == "succeeded" for r in rows) else 1)' "$id"; }
	wait_until "$1" "command $id ($2) succeeded" done_ok
}
t_reg=$(wait_until 60 "registered with the plane" registered)
t_rep=$(wait_until 60 "a state report" reported)
t_cmd=$(roundtrip 60 "first round trip")
t_working=$(awk -v a="$r0" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')
awk -v t="$t_working" 'BEGIN { exit !(t <= 60) }' || fail "README block to a finished command took $t_working s (over 60)"
echo "after the README block: registered ${t_reg} s, reporting ${t_rep} s, a command round trip ${t_cmd} s more"
echo "README block start to the first finished command: $t_working s"
as_admin "caldera status --agent $AGENT" || fail "caldera status as the admin (no sudo)"

step "root's CLI verbs leave no root-owned file in the state dir"
pid_before=$(unit_prop MainPID)
for verb in "pause" "resume" "status" "report --once --deadline 5"; do
	as_admin "sudo caldera $verb --agent $AGENT" > "$WORK/verb.log" 2>&1 \
		|| { cat "$WORK/verb.log"; fail "sudo caldera $verb"; }
done
left=$(inside find /var/lib/caldera ! -user caldera -printf '%u %p\n')
[ -z "$left" ] || fail "not owned by caldera after the admin's sudo verbs: $left"
[ "$(unit_prop ActiveState)" = active ] || fail "caldera@$AGENT is not active after the sudo verbs"
[ "$(unit_prop MainPID)" = "$pid_before" ] || fail "caldera@$AGENT restarted during the sudo verbs"
roundtrip 30 "after the sudo verbs" >/dev/null
echo "state dir all caldera's; the unit kept running and runs commands"

# ---- issue 39: README's "Code agents" section, a turn of each backend from the plane (its own script)
# shellcheck source=.ci/code-agents.sh
. "$ROOT/.ci/code-agents.sh"

step "an installed but unconfigured agent: no crash loop; reload in local mode connects it"
inside caldera init /usr/share/caldera/examples/task-agent --name idle-agent >/dev/null
inside systemctl start caldera@idle-agent
sleep 7  # longer than RestartSec=5: a crash loop would show as a restart
idle() { inside systemctl show -P "$1" caldera@idle-agent; }
[ "$(idle ActiveState)" = active ] || fail "unconfigured caldera@idle-agent is $(idle ActiveState)"
[ "$(idle NRestarts)" = 0 ] || fail "unconfigured caldera@idle-agent restarted $(idle NRestarts) times"
inside journalctl -u caldera@idle-agent --no-pager -o cat | grep -q 'staying local' || fail "no 'staying local' in the journal"
icfg=$C/etc/caldera/agents/idle-agent
printf 'CALDERA_AGENT_ENABLED=true\nCALDERA_BASE_URL=%s\nCALDERA_INSTANCE_ID=%s\n' "$URL" "$INSTANCE2" >> "$icfg/agent.env"
printf 'CALDERA_TOKEN=%s\n' "$TOKEN2" >> "$icfg/secrets.env"
inside systemctl reload caldera@idle-agent || fail "systemctl reload caldera@idle-agent"
idle_reported() { [ -n "$(plane reports --instance "$INSTANCE2" --last --json | tr -d '[]{} \n')" ]; }
t_idle=$(wait_until 30 "the idle agent reporting after reload" idle_reported)
inside journalctl -u caldera@idle-agent --no-pager -o cat | grep 'reload:' || fail "the reload logged nothing"
if inside journalctl -u caldera@idle-agent --no-pager -o cat | grep -qF "$TOKEN2"; then fail "the token reached the journal"; fi
inside systemctl stop caldera@idle-agent
echo "active in local mode, 0 restarts; after reload reporting within $t_idle s"

step "systemctl reload re-reads agent.env and secrets.env"
pid_before=$(unit_prop MainPID)
cursor=$(inside journalctl -u "caldera@$AGENT" -n 0 --show-cursor --no-pager | sed -n 's/^-- cursor: //p')
printf 'CALDERA_LOG_LEVEL=debug\n' >> "$cfg/agent.env"
inside systemctl reload "caldera@$AGENT" || fail "systemctl reload caldera@$AGENT"
reload_logged() { inside journalctl -u "caldera@$AGENT" --after-cursor "$cursor" --no-pager -o cat | grep -q 'CALDERA_LOG_LEVEL'; }
t_reload=$(wait_until 30 "the journal naming CALDERA_LOG_LEVEL after reload" reload_logged)
inside journalctl -u "caldera@$AGENT" --after-cursor "$cursor" --no-pager -o cat | grep -i reload || true
if inside journalctl -u "caldera@$AGENT" --after-cursor "$cursor" --no-pager -o cat | grep -qF "$TOKEN"; then
	fail "the token reached the journal"
fi
wait_until 30 "active after reload" sh -c "[ \"\$(nsenter -t $CPID -a systemctl is-active caldera@$AGENT)\" = active ]" >/dev/null
roundtrip 30 "after reload" >/dev/null
echo "reload logged in ${t_reload} s (main PID $pid_before -> $(unit_prop MainPID)); commands run"

step "kill -9 of the main PID: restarted within 15 s, nothing lost"
restarts=$(unit_prop NRestarts)
pid_before=$(unit_prop MainPID)
ids=()
for _ in 1 2 3; do ids+=("$(plane enqueue --instance "$INSTANCE" collect_system_info)"); done
inside sh -c "kill -9 $pid_before"  # the shell's kill: minbase has no /bin/kill
back() { p=$(unit_prop MainPID); [ "$p" != 0 ] && [ "$p" != "$pid_before" ] && [ "$(unit_prop ActiveState)" = active ]; }
t_restart=$(wait_until 15 "caldera@$AGENT active again after kill -9" back)
[ "$(unit_prop NRestarts)" -eq $(( restarts + 1 )) ] || fail "NRestarts $(unit_prop NRestarts), want $(( restarts + 1 ))"
# Nothing lost: each command ends (SPEC: one the kill interrupted is finished
# `failed`, "interrupted: runtime restarted"; it is never run twice), the outbox empties.
all_done() { plane commands --instance "$INSTANCE" --json | python3 -c '
import json, sys
want = {int(i) for i in sys.argv[1:]}
rows = json.load(sys.stdin)
rows = rows.get("commands", rows) if isinstance(rows, dict) else rows
ended = {int(r["id"]): r for r in rows if int(r["id"]) in want and (r["status"] == "succeeded"
         or (r["status"] == "failed" and "interrupted" in str(r.get("error_message"))))}
if set(ended) != want:
    sys.exit(1)
print(" ".join("%d:%s" % (i, ended[i]["status"]) for i in sorted(ended)))' "${ids[@]}"; }
wait_until 60 "the 3 commands queued around kill -9 ended" all_done >/dev/null
ends=$(all_done)
# Outbox items only (NNN-kind.json): the dir also keeps the accepted-inventory digest and rejected/.
outbox_empty() { [ -z "$(inside find "/var/lib/caldera/$AGENT/outbox" -maxdepth 1 -type f -name '[0-9]*.json' 2>/dev/null)" ]; }
wait_until 30 "an empty outbox after the restart" outbox_empty >/dev/null
echo "active again ${t_restart} s after kill -9; the 3 commands queued around it ended ($ends); outbox empty"

step "upgrade (apt-get install --reinstall) restarts the running agent"
pid_before=$(unit_prop MainPID)
inside sh -c "cd /root/ci && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --reinstall ./$(basename "$DEB")" > "$WORK/apt.log" 2>&1 \
	|| { cat "$WORK/apt.log"; fail "apt-get install --reinstall"; }
[ "$(unit_prop MainPID)" != "$pid_before" ] || fail "the agent was not restarted by the upgrade"
[ "$(unit_prop ActiveState)" = active ] || fail "caldera@$AGENT not active after the upgrade"
[ "$(unit_prop NeedDaemonReload)" = no ] || fail "NeedDaemonReload=yes after the upgrade"
roundtrip 30 "after the upgrade" >/dev/null
echo "restarted by the upgrade (pid $pid_before -> $(unit_prop MainPID)), commands run"

step "systemctl stop within 15 s"
s0=$(date +%s%N)
inside timeout 60 systemctl stop "caldera@$AGENT" || fail "systemctl stop"
t_stop=$(awk -v a="$s0" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')
awk -v t="$t_stop" 'BEGIN { exit !(t <= 15) }' || fail "systemctl stop took $t_stop s"
echo "stopped in $t_stop s ($(unit_prop ActiveState), result $(unit_prop Result))"

step "a broken configuration ends failed, with at most one restart"
broken() {  # broken DESCRIPTION SETUP-COMMAND NAMED: start, wait for `failed`, count restarts, restore
	local what=$1 named=$3
	cp -a "$cfg/agent.env" "$WORK/agent.env.good"
	cp -a "$cfg/secrets.env" "$WORK/secrets.env.good"
	eval "$2"
	inside systemctl reset-failed "caldera@$AGENT" 2>/dev/null || true
	inside systemctl start "caldera@$AGENT" 2>/dev/null || true
	is_failed() { [ "$(unit_prop ActiveState)" = failed ]; }
	wait_until 30 "caldera@$AGENT failed ($what)" is_failed >/dev/null
	# Stay a while: a restart loop (RestartSec=5) would show up as NRestarts > 1.
	sleep 7
	[ "$(unit_prop ActiveState)" = failed ] || fail "$what: not failed any more: $(unit_prop ActiveState)"
	n=$(unit_prop NRestarts)
	[ "$n" -le 1 ] || fail "$what: $n restarts"
	status=$(unit_prop ExecMainStatus)
	[ "$status" = 2 ] || fail "$what: exit status $status, want 2"
	msg=$(inside journalctl -u "caldera@$AGENT" --no-pager -o cat -n 20 | grep '^caldera run: ' | tail -n 1)
	printf '%s\n' "$msg" | grep -qF "$named" || fail "$what: the journal's sentence does not name $named: '$msg'"
	echo "$what: failed, $n restarts, exit $status: $msg"
	cp -a "$WORK/agent.env.good" "$cfg/agent.env"
	cp -a "$WORK/secrets.env.good" "$cfg/secrets.env"
	inside systemctl reset-failed "caldera@$AGENT"
}
broken "bad CALDERA_BASE_URL" "printf 'CALDERA_BASE_URL=ftp://nowhere\n' >> '$cfg/agent.env'" CALDERA_BASE_URL
broken "secrets.env readable by others" "chmod 0644 '$cfg/secrets.env'" secrets.env
broken "agent.env not readable by caldera" "chmod 0600 '$cfg/agent.env'" agent.env

step "the cron line, uncommented"
inside systemctl start "caldera@$AGENT"
line=$(sed -n 's/^#\(\*.*caldera report --once.*\)$/\1/p' "$C/etc/cron.d/caldera" | sed "s/NAME/$AGENT/g")
[ -n "$line" ] || fail "no commented report --once line in /etc/cron.d/caldera"
cron_path=$(sed -n 's/^PATH=//p' "$C/etc/cron.d/caldera")
[ -n "$cron_path" ] || fail "/etc/cron.d/caldera sets no PATH"
cmd=$(printf '%s\n' "$line" | cut -f 3-)
user=$(printf '%s\n' "$line" | cut -f 2)
echo "runs as $user: $cmd"
# As cron would: that user, the file's PATH, /bin/sh, almost no environment.
inside runuser -u "$user" -- env -i PATH="$cron_path" HOME=/var/lib/caldera SHELL=/bin/sh /bin/sh -c "$cmd" \
	|| fail "the cron command exited non-zero"
cron_logged() { inside journalctl -t caldera-report --no-pager -o cat | grep -q 'exit'; }
wait_until 10 "the cron run's exit status in the journal" cron_logged >/dev/null
inside journalctl -t caldera-report --no-pager -o cat | tail -n 3

step "a process agent's long graceful stop outlasts TimeoutStopSec (EXTEND_TIMEOUT_USEC)"
# A process agent that ignores SIGTERM and ends by itself 40 s later (stop_timeout_seconds: 60),
# in a unit whose drop-in cuts TimeoutStopSec to 10 s: without the daemon's EXTEND_TIMEOUT_USEC
# systemd kills the unit at 10 s (Result=timeout); with it the stop ends gracefully after ~40 s.
# 40 s, not less: the first request only reaches 30 s, so the stop lives on the renewals
# (every 10 s) too; a daemon that asked once and stopped asking would be killed at 30 s.
# Local mode (no agent.env values): the extension lives in the agent's stop, which both modes share.
SLOW=slow-stop
SLOW_EXIT_AFTER=40
slow_prop() { inside systemctl show -P "$1" "caldera@$SLOW"; }
slow_fail() {
	echo "--- journal of caldera@$SLOW (last 40 lines)" >&2
	inside journalctl -u "caldera@$SLOW" --no-pager -n 40 >&2 || true
	fail "$@"
}
mkdir -p "$C/root/ci/$SLOW"
cat > "$C/root/ci/$SLOW/caldera.agent.yaml" <<EOF
name: $SLOW
version: 1.0.0
description: CI only - ignores SIGTERM and exits by itself $SLOW_EXIT_AFTER s later.
runtime:
  type: process
  command: [python3, slow_stop.py]
  stop_signal: TERM
  stop_timeout_seconds: 60
  restart: never
EOF
cat > "$C/root/ci/$SLOW/slow_stop.py" <<EOF
import os, signal, time
state = os.environ["CALDERA_AGENT_STATE_DIR"]
termed = []
signal.signal(signal.SIGTERM, lambda *_: termed.append(time.monotonic()))
open(os.path.join(state, "ready"), "w").close()  # only now is SIGTERM caught
while not termed:
    time.sleep(0.2)
print("SIGTERM: exiting by myself in $SLOW_EXIT_AFTER s", flush=True)
while time.monotonic() < termed[0] + $SLOW_EXIT_AFTER:
    time.sleep(0.2)
with open(os.path.join(state, "graceful-exit"), "w") as fh:
    fh.write("%.1f s after SIGTERM\n" % (time.monotonic() - termed[0]))
EOF
inside caldera init "/root/ci/$SLOW" --name "$SLOW" >/dev/null || slow_fail "caldera init of the $SLOW blueprint"
mkdir -p "$C/etc/systemd/system/caldera@$SLOW.service.d"
printf '[Service]\nTimeoutStopSec=10s\n' > "$C/etc/systemd/system/caldera@$SLOW.service.d/ci-short-stop.conf"
inside systemctl daemon-reload
[ "$(slow_prop TimeoutStopUSec)" = 10s ] || slow_fail "the drop-in did not set TimeoutStopSec=10s: $(slow_prop TimeoutStopUSec)"
inside systemctl start "caldera@$SLOW" || slow_fail "systemctl start caldera@$SLOW"
slow_state=$C/var/lib/caldera/$SLOW/agent
wait_until 30 "the $SLOW agent running with its SIGTERM handler" test -e "$slow_state/ready" >/dev/null
cursor=$(inside journalctl -u "caldera@$SLOW" -n 0 --show-cursor --no-pager | sed -n 's/^-- cursor: //p')
s0=$(date +%s%N)
inside timeout 90 systemctl stop "caldera@$SLOW" || slow_fail "systemctl stop caldera@$SLOW"
t_slow=$(awk -v a="$s0" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')
slow_journal=$(inside journalctl -u "caldera@$SLOW" --after-cursor "$cursor" --no-pager -o cat)
printf '%s\n' "$slow_journal" | sed 's/^/  | /'
result=$(slow_prop Result)
[ "$result" = success ] || slow_fail "Result=$result after a ${t_slow} s stop (want success; timeout: systemd killed at TimeoutStopSec=10s or at the end of the last EXTEND_TIMEOUT_USEC)"
if printf '%s\n' "$slow_journal" | grep -iE 'timed out|killing'; then slow_fail "systemd timed out or killed during the stop (above)"; fi
awk -v t="$t_slow" -v n="$SLOW_EXIT_AFTER" 'BEGIN { exit !(t >= n - 5 && t <= n + 20) }' \
	|| slow_fail "systemctl stop took $t_slow s (the agent exits $SLOW_EXIT_AFTER s after SIGTERM)"
[ -s "$slow_state/graceful-exit" ] || slow_fail "the agent left no graceful-exit marker: it did not end by itself"
printf '%s\n' "$slow_journal" | grep -q 'the runtime stopped (exited with status 0)' \
	|| slow_fail "the journal does not say the agent exited with status 0"
echo "stopped in $t_slow s (TimeoutStopSec=10s): Result=$result, no timeout or kill; the agent: $(cat "$slow_state/graceful-exit")"
# Gone again, so that nothing later sees it: the drop-in (purge removes /etc/caldera, not it).
rm -rf "$C/etc/systemd/system/caldera@$SLOW.service.d"
inside systemctl daemon-reload

step "apt-get purge: nothing left running"
[ "$(unit_prop ActiveState)" = active ] || fail "caldera@$AGENT not active before purge"
inside systemctl stop ci-plane  # the test's own plane (user caldera too) ends first
inside sh -c 'DEBIAN_FRONTEND=noninteractive apt-get purge -y -q caldera' > "$WORK/apt.log" 2>&1 \
	|| { cat "$WORK/apt.log"; fail "apt-get purge"; }
# (minbase has no ps: /proc, read by the container's python3)
left=$(inside python3 -c '
import os, pwd
uid = pwd.getpwnam("caldera").pw_uid
for pid in filter(str.isdigit, os.listdir("/proc")):
    if int(pid) == os.getpid():
        continue
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        owner = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        continue
    if owner == uid or "/usr/bin/caldera" in cmd or "caldera.cli" in cmd:
        print(pid, owner, cmd)
')
[ -z "$left" ] || fail "still running after purge: $left"
load=$(unit_prop LoadState)
[ "$load" = not-found ] || fail "caldera@$AGENT is still $load after purge (no daemon-reload?)"
for path in /etc/caldera /var/lib/caldera /usr/bin/caldera /usr/lib/systemd/system/caldera@.service; do
	[ ! -e "$C$path" ] || fail "$path is left after purge"
done
echo "purged: no caldera process, unit not-found, trees gone"

# ---- issue 23: an adapter agent that lives in its owner's home (its own script, same container)
# shellcheck source=.ci/home-agent.sh
. "$ROOT/.ci/home-agent.sh"

shutdown_container
t_total=$(( $(date +%s) - t0 ))
printf '\n== systemd %s: summary\n' "$SUITE"
printf 'in the root      %s\n' "$os_release"
printf 'base root        %s\n' "$t_base"
printf 'unit             verify clean, exposure %s\n' "$score"
printf 'README block     %s s (as the admin, from README.md)\n' "$t_readme"
printf 'to registered    %s s, reporting %s s, first command +%s s (README start to a finished command: %s s)\n' "$t_reg" "$t_rep" "$t_cmd" "$t_working"
printf 'code agents      README blocks %s s, restarts %s s; %s s in all (every backend, canary, restarts, stop)\n' \
	"$t_ca_readme" "$t_ca_restarts" "$t_ca"
printf 'kill -9 restart  %s s\n' "$t_restart"
printf 'stop             %s s\n' "$t_stop"
printf 'long agent stop  %s s (TimeoutStopSec=10s; the agent exits %s s after SIGTERM)\n' "$t_slow" "$SLOW_EXIT_AFTER"
printf 'home agent       README block %s s, registered %s s, reporting %s s; exposure home %s vs bundle %s; %s s in all\n' \
	"$t_home_readme" "$t_home_reg" "$t_home_rep" "$score_home" "$score_bundle" "$t_home"
printf 'total            %s s\n' "$t_total"
