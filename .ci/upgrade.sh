#!/bin/bash
# An upgrade in place under a real systemd (issue 35; docs/packaging.md, "Upgrades").
#
# Boots the cached Debian root of SUITE (.ci/boot.sh, the one .ci/systemd.sh boots), installs
# the released 0.1.0 from its .deb (.ci/old-deb.sh: built from its commit, cached) with
# README.md's "Install on a host" block as the admin (an enabled agent), plus a second agent
# started by hand without enable, whose run-now takes as long as a file says, a plane behind
# .ci/finish-gate.py answering 503 to finishes (so results queue) and a command in flight
# longer than 0.1.0's drain; the admin uncomments the cron line and edits agent.env; the
# caldera user plants links where a root script could follow them. Then:
#   1. `sudo apt-get install ./caldera_NEW_all.deb` without a terminal: exit 0, no conffile
#      prompt; no agent process ran while the new files were put in place (each unit's stop
#      before the first file's ctime); each agent restarted once on the new version (its
#      state dir's format.json says so), enabled or not, same session (no register), the
#      admin's edits byte for byte; nothing the planted links point to touched;
#   2. the plane recovers: every queued finish and the in-flight command (cut off by the
#      drain) reach it once, sent by the new version (the gate logs each finish's User-Agent);
#   3. a downgrade to 0.1.0 and back: both agents restarted on 0.1.0's files and their
#      finishes come from caldera/0.1.0; a finish queued under 0.1.0 reaches the plane once
#      after the way back;
#   4. `apt-get remove` with a command in flight: the agents stop within their budget,
#      config and state stay, root's record of them is root's only; installing again starts
#      them where they were.
#
# Usage: .ci/upgrade.sh SUITE [DEB | DIR-with-one-caldera_*.deb]   (SUITE: trixie or bookworm)
# Without a .deb it builds one (packaging/build-deb.sh, tests skipped). Needs root.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SUITE=${1:-}
case "$SUITE" in
	trixie | bookworm) shift ;;
	*) echo "usage: .ci/upgrade.sh trixie|bookworm [DEB | DIR]" >&2; exit 2 ;;
esac
AGENT=task-agent
INSTANCE=7
TOKEN=ci-boot-$RANDOM$RANDOM$RANDOM
SLOW=slow-agent
INSTANCE2=8
TOKEN2=ci-boot-$RANDOM$RANDOM$RANDOM
NSPAWN_PID=
CPID=
WORK=
t0=$(date +%s)
CI_NAME=upgrade
FAIL_UNITS="caldera@$AGENT caldera@$SLOW ci-gate"
# shellcheck source=.ci/boot.sh
. "$ROOT/.ci/boot.sh"
trap cleanup EXIT
trap 'exit 130' INT TERM

PLANE_PY=/opt/ci-plane/usr/lib/python3/dist-packages
# The plane runs from its own copy of the new package's code: the installed caldera comes
# and goes (downgrade, remove) under it.
plane() { inside env PYTHONPATH=$PLANE_PY python3 -m caldera.cli plane "$@" --db /var/lib/ci-plane/plane.db; }
prop() { inside systemctl show -P "$2" "caldera@$1"; }
secs() { awk -v a="$1" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }'; }
# status INSTANCE ID: the plane's status of one command
status() { plane commands --instance "$1" --json | python3 -c '
import json, sys
rows = json.load(sys.stdin)
rows = rows.get("commands", rows) if isinstance(rows, dict) else rows
print(next((r["status"] for r in rows if int(r["id"]) == int(sys.argv[1])), "missing"))' "$2"; }
registered() { registrations | grep -qw "$1:[0-9]*"; }
ended() { case "$(status "$1" "$2")" in succeeded | failed) return 0 ;; *) return 1 ;; esac; }
registrations() { plane agents --json | python3 -c '
import json, sys
rows = json.load(sys.stdin)
rows = rows.get("agents", rows) if isinstance(rows, dict) else rows
print(" ".join("%s:%s" % (r["instance_id"], r.get("registrations")) for r in sorted(rows, key=lambda r: r["instance_id"])))'; }
queued() { inside sh -c "ls /var/lib/caldera/$1/outbox/ 2>/dev/null | grep -c -- '-finish.json\$'" || true; }
starts() { inside journalctl -u "caldera@$1" --no-pager -o cat | grep -c "caldera run: agent $1 as" || true; }
token_digest() { inside python3 -c 'import hashlib, json, sys
print(hashlib.sha256(json.load(open(sys.argv[1]))["session_token"].encode()).hexdigest()[:16])' "/var/lib/caldera/$1/session.json"; }
forwarded() { inside journalctl -u ci-gate --no-pager -o cat | grep -c "^fwd finish $1 " || true; }
# sent_by ID...: the User-Agent (caldera/VERSION) of each command's forwarded finish, one per line
sent_by() { local id; for id in "$@"; do inside journalctl -u ci-gate --no-pager -o cat | awk -v id="$id" '$1 == "fwd" && $3 == id { print $5 }'; done | sort -u; }
# error INSTANCE ID: the plane's error_message of one command
error() { plane commands --instance "$1" --json | python3 -c '
import json, sys
rows = json.load(sys.stdin)["commands"]
print(next((r.get("error_message") or "" for r in rows if int(r["id"]) == int(sys.argv[1])), "missing"))' "$2"; }
now_us() { date +%s%6N; }
# in_order MODE SINCE: .ci/unpack-order.py on both agents' units (stopped-before, started-after)
in_order() { inside python3 /opt/ci/unpack-order.py "$1" "$2" "caldera@$AGENT.service" "caldera@$SLOW.service" \
	|| fail "the agents and the unpack, $1 (above)"; }
RECORD=/var/lib/caldera-dpkg/stopped
gate_close() { inside sh -c ': > /var/lib/ci-gate/gate'; }
gate_open() { inside rm -f /var/lib/ci-gate/gate; }
as_admin_apt() {  # as_admin_apt LOGFILE ARGS: sudo apt-get ARGS, no terminal, stdin empty
	local log=$1
	shift
	as_admin "cd && sudo apt-get $* < /dev/null" > "$log" 2>&1
}
# finishes INSTANCE ID: how many finishes of the command the plane took (its finish_count)
finishes() { plane commands --instance "$1" --json | python3 -c '
import json, sys
rows = json.load(sys.stdin)
rows = rows.get("commands", rows) if isinstance(rows, dict) else rows
print(next((r.get("finish_count") for r in rows if int(r["id"]) == int(sys.argv[1])), "missing"))' "$2"; }
# once INSTANCE ID...: each command's finish reached the plane exactly once (the gate
# forwarded one, and the plane counted one)
once() {
	local instance=$1 id n m
	shift
	for id in "$@"; do
		n=$(forwarded "$id")
		m=$(finishes "$instance" "$id")
		[ "$n" = 1 ] && [ "$m" = 1 ] || fail "command $id: its finish reached the plane $n times through the gate, the plane counted $m (want 1)"
	done
}

[ "$(id -u)" -eq 0 ] || fail "needs root (debootstrap, systemd-nspawn, nsenter)"

step "tools"
ci_tools

step "the two .debs"
NEW=$(the_deb "${1:-}")
b0=$(date +%s)
OLD=$(bash "$ROOT/.ci/old-deb.sh" 0.1.0) || fail "the 0.1.0 .deb (.ci/old-deb.sh)"
t_old="$(( $(date +%s) - b0 )) s"
V_NEW=$(dpkg-deb -f "$NEW" Version)
V_OLD=$(dpkg-deb -f "$OLD" Version)
dpkg --compare-versions "$V_NEW" gt "$V_OLD" || fail "$NEW ($V_NEW) is not newer than $V_OLD"
echo "old: $OLD ($V_OLD, $t_old); new: $NEW ($V_NEW)"

step "base root (debootstrap $SUITE, cached)"
# shellcheck source=.ci/root.sh
. "$ROOT/.ci/root.sh"
BASE=$(base_root "$SUITE" "${BOOT_PACKAGES[@]}") || fail "debootstrap $SUITE"

step "boot the container (systemd-nspawn -b)"
boot_container "$BASE"

step "the plane (the new version's code, its own copy) behind the finish gate"
mkdir -p "$C/opt/ci"
cp "$ROOT/.ci/finish-gate.py" "$ROOT/.ci/unpack-order.py" "$C/opt/ci/"
inside dpkg-deb -x /dev/stdin /opt/ci-plane < "$NEW"
inside systemd-run --quiet --unit=ci-plane -p StateDirectory=ci-plane -E PYTHONPATH=$PLANE_PY \
	python3 -m caldera.cli plane serve --host 127.0.0.1 --port 0 --db /var/lib/ci-plane/plane.db \
	--bootstrap-token "$TOKEN" --instance-id "$INSTANCE" --bootstrap-token "$TOKEN2" --instance-id "$INSTANCE2" \
	--heartbeat-interval 2 --poll-interval 1 --url-file /var/lib/ci-plane/url
wait_until 20 "the plane's URL file" test -s "$C/var/lib/ci-plane/url" >/dev/null
inside systemd-run --quiet --unit=ci-gate -p StateDirectory=ci-gate \
	python3 /opt/ci/finish-gate.py "$(cat "$C/var/lib/ci-plane/url")" /var/lib/ci-gate/gate /var/lib/ci-gate/url
wait_until 20 "the gate's URL file" test -s "$C/var/lib/ci-gate/url" >/dev/null
URL=$(cat "$C/var/lib/ci-gate/url")
echo "plane at $(cat "$C/var/lib/ci-plane/url"), agents reach it through the gate at $URL"

step "caldera $V_OLD as README.md installs it, as the admin"
make_admin "$URL" "$INSTANCE" "$TOKEN"
cp "$OLD" "$C/home/admin/"
inside chown admin:admin "/home/admin/$(basename "$OLD")"
readme_install
[ "$(inside caldera --version)" = "caldera $V_OLD" ] || fail "caldera --version is not $V_OLD"
wait_until 60 "$AGENT registered" registered "$INSTANCE" >/dev/null

step "the admin's edits: a line in agent.env, the cron line uncommented"
cfg=/etc/caldera/agents/$AGENT
printf '# the admin: keep this across upgrades\n' >> "$C$cfg/agent.env"
sed -i "s/^#\(\*.*caldera report --once --agent\) NAME\(.*\)$/\1 $AGENT\2/" "$C/etc/cron.d/caldera"
grep -q "^\*.*--agent $AGENT" "$C/etc/cron.d/caldera" || fail "could not uncomment the cron line"
edits() { inside sha256sum "$cfg/agent.env" "$cfg/secrets.env" /etc/cron.d/caldera | awk '{ print $1 }' | tr '\n' ' '; }
EDITS=$(edits)
# The admin's edit is to a conffile dpkg knows. It is the package's only one and both releases
# ship it byte for byte (tests/packaging/test_packaging_files.py holds it to 0.1.0's), so dpkg
# keeps the edit without asking; the day a release changes it, this upgrade would ask (and,
# without a terminal, fail): the check below exists for that day (docs/packaging.md).
packaged=$(inside dpkg-query -W -f='${Conffiles}\n' caldera | awk '$1 == "/etc/cron.d/caldera" { print $2 }')
[ -n "$packaged" ] || fail "/etc/cron.d/caldera is not a conffile of caldera $V_OLD"
[ "$(inside md5sum /etc/cron.d/caldera | cut -d ' ' -f 1)" != "$packaged" ] || fail "the admin's edit left the cron conffile as packaged"
shipped=$(dpkg-deb --fsys-tarfile "$NEW" | tar -xO ./etc/cron.d/caldera | md5sum | cut -d ' ' -f 1)
echo "conffile /etc/cron.d/caldera: edited (packaged md5 $packaged); $V_NEW ships $shipped ($([ "$shipped" = "$packaged" ] && echo "the same: no prompt expected" || echo "changed: dpkg would ask"))"

step "a second agent, started without enable, whose run-now takes as long as a file says"
mkdir -p "$C/root/ci/$SLOW"
cat > "$C/root/ci/$SLOW/caldera.agent.yaml" <<EOF
name: $SLOW
version: 1.0.0
description: CI only - its run-now verb takes as long as /etc/caldera/agents/slow-agent/run-now-seconds says (12 s without it).
runtime:
  type: adapter
  command: [python3, adapter.py]
  workdir: .
  timeout_seconds: 60
controls: [pause, resume, run_now]
EOF
cat > "$C/root/ci/$SLOW/adapter.py" <<'EOF'
import json
import sys
import time

verb = sys.argv[1] if len(sys.argv) > 1 else ""
if verb == "status":
    print(json.dumps({"state": {"level": "ok", "label": "Ready"}}))
elif verb == "run-now":
    try:
        with open("/etc/caldera/agents/slow-agent/run-now-seconds") as fh:
            seconds = float(fh.read())
    except OSError:
        seconds = 12.0
    time.sleep(seconds)
    print(json.dumps({"message": f"Ran for {seconds:g} s."}))
elif verb in ("pause", "resume"):
    print(json.dumps({"message": "Done."}))
else:
    sys.exit(2)
EOF
inside caldera init "/root/ci/$SLOW" --name "$SLOW" >/dev/null || fail "caldera init $SLOW"
printf 'CALDERA_AGENT_ENABLED=true\nCALDERA_BASE_URL=%s\nCALDERA_INSTANCE_ID=%s\n' "$URL" "$INSTANCE2" >> "$C/etc/caldera/agents/$SLOW/agent.env"
printf 'CALDERA_TOKEN=%s\n' "$TOKEN2" >> "$C/etc/caldera/agents/$SLOW/secrets.env"
# Started by hand, not enabled: after the upgrade (and remove + install) it must run again all
# the same (deb-systemd-invoke start skips a unit that is not enabled).
inside systemctl start "caldera@$SLOW"
[ "$(inside systemctl is-enabled "caldera@$SLOW" || true)" = disabled ] || fail "caldera@$SLOW is enabled"
wait_until 60 "$SLOW registered" registered "$INSTANCE2" >/dev/null
REG=$(registrations)
S1=$(token_digest "$AGENT")
S2=$(token_digest "$SLOW")
echo "registrations (instance:count) $REG"

step "the caldera user plants links where a root script could follow them"
# The daemon's user owns /var/lib/caldera (ProtectSystem=full leaves /var writable): links
# there, named as the record of stopped agents once was, to a root-only file and to
# /etc/shadow. Root's record now lives in /var/lib/caldera-dpkg, which that user can
# neither make nor plant. After every dpkg run below: both targets unchanged, both links as
# planted, and no copy of /etc/shadow under /var/lib/caldera.
printf 'victim: only root may change this\n' > "$C/etc/victim"
chmod 0600 "$C/etc/victim"
inside runuser -u caldera -- ln -s /etc/victim /var/lib/caldera/.stopped-by-dpkg.new
inside runuser -u caldera -- ln -sf /etc/shadow /var/lib/caldera/.stopped-by-dpkg
if inside runuser -u caldera -- ln -s /etc/victim /var/lib/caldera-dpkg 2>/dev/null \
		|| inside runuser -u caldera -- mkdir /var/lib/caldera-dpkg 2>/dev/null; then
	fail "the caldera user could make /var/lib/caldera-dpkg"
fi
targets() { inside sh -c 'stat -c "%n %a %U:%G %s %Y" /etc/victim /etc/shadow; sha256sum /etc/victim /etc/shadow'; }
TARGETS=$(targets)
SHADOW1=$(inside head -n 1 /etc/shadow)
untouched() {
	[ "$(targets)" = "$TARGETS" ] || fail "$1: /etc/victim or /etc/shadow changed through a planted link: $(targets)"
	[ "$(inside readlink /var/lib/caldera/.stopped-by-dpkg.new)" = /etc/victim ] \
		&& [ "$(inside readlink /var/lib/caldera/.stopped-by-dpkg)" = /etc/shadow ] \
		|| fail "$1: a planted link was replaced"
	local copy
	copy=$(inside grep -rlF -D skip -- "$SHADOW1" /var/lib/caldera /var/lib/caldera-dpkg 2>/dev/null || true)
	[ -z "$copy" ] || fail "$1: a copy of /etc/shadow in $copy"
	echo "$1: nothing the planted links point to was touched"
}

step "the plane answers 503 to finishes: three results queue, a fourth command in flight"
gate_close
ids=()
for _ in 1 2 3; do ids+=("$(plane enqueue --instance "$INSTANCE" collect_system_info)"); done
wait_until 60 "three finishes queued in $AGENT's outbox" sh -c "[ \"\$(nsenter -t $CPID -a sh -c 'ls /var/lib/caldera/$AGENT/outbox/' | grep -c -- '-finish.json\$')\" = 3 ]" >/dev/null
# Longer than 0.1.0's drain (30 s): the preinst's stop cuts it off, and it still ends once.
printf '60\n' > "$C/etc/caldera/agents/$SLOW/run-now-seconds"
slow=$(plane enqueue --instance "$INSTANCE2" run_now --timeout 300)
running() { [ "$(status "$INSTANCE2" "$slow")" = running ]; }
wait_until 30 "the run_now started (in flight)" running >/dev/null
pid1=$(prop "$AGENT" MainPID)
pid2=$(prop "$SLOW" MainPID)
echo "queued: ${ids[*]} (finishes in the outbox: $(queued "$AGENT")); in flight: $slow on $SLOW"

step "sudo apt-get install ./$(basename "$NEW"), no terminal"
cp "$NEW" "$C/home/admin/"
inside chown admin:admin "/home/admin/$(basename "$NEW")"
u0=$(date +%s%N)
as_admin_apt "$WORK/upgrade.log" install "./$(basename "$NEW")" || { cat "$WORK/upgrade.log"; fail "apt-get install of $V_NEW over $V_OLD"; }
in_order stopped-before "$(( u0 / 1000 ))"
t_upgrade=$(secs "$u0")
sed 's/^/  | /' "$WORK/upgrade.log"
if grep -qiE "configuration file|conffile|\*\*\* .* \(Y/I/N/O/D/Z\)" "$WORK/upgrade.log"; then fail "the upgrade spoke of a conffile (above)"; fi
[ "$(inside caldera --version)" = "caldera $V_NEW" ] || fail "caldera --version is not $V_NEW after the upgrade"
for name in "$AGENT" "$SLOW"; do
	[ "$(prop "$name" ActiveState)" = active ] || fail "caldera@$name is $(prop "$name" ActiveState) after the upgrade"
	[ "$(starts "$name")" = 2 ] || fail "caldera@$name started $(starts "$name") times in all (want 2: before and after the upgrade)"
	fmt=$(inside cat "/var/lib/caldera/$name/format.json" 2>/dev/null || true)
	[ "$fmt" = "{\"format\":1,\"written_by\":\"$V_NEW\"}" ] || fail "$name's format.json is '$fmt': $V_NEW did not start on it"
done
[ "$(prop "$AGENT" MainPID)" != "$pid1" ] && [ "$(prop "$SLOW" MainPID)" != "$pid2" ] || fail "an agent kept its old process"
[ "$(token_digest "$AGENT")" = "$S1" ] && [ "$(token_digest "$SLOW")" = "$S2" ] || fail "a session changed"
[ "$(edits)" = "$EDITS" ] || fail "the admin's agent.env, secrets.env or cron line changed"
[ ! -e "$C$RECORD" ] || fail "the preinst's record is left after configure"
untouched "the upgrade"
echo "upgraded in $t_upgrade s: both agents restarted once on $V_NEW (format.json), enabled or not, same sessions, edits kept"

step "the plane recovers: every queued finish and the in-flight command reach it once"
gate_open
r0=$(date +%s%N)
for id in "${ids[@]}"; do wait_until 60 "command $id finished at the plane" ended "$INSTANCE" "$id" >/dev/null; done
wait_until 60 "command $slow finished at the plane" ended "$INSTANCE2" "$slow" >/dev/null
t_recover=$(secs "$r0")
once "$INSTANCE" "${ids[@]}"
once "$INSTANCE2" "$slow"
[ "$(sent_by "${ids[@]}" "$slow")" = "caldera/$V_NEW" ] || fail "finishes sent by $(sent_by "${ids[@]}" "$slow" | tr '\n' ' ')(want caldera/$V_NEW only)"
# Cut off by the drain: 0.1.0 cancels it and records its failure ("The agent's adapter failed:
# run-now: cancelled"), or (killed first) the next start finishes it as interrupted; never
# succeeded, never twice.
case "$(status "$INSTANCE2" "$slow"):$(error "$INSTANCE2" "$slow")" in
	failed:*cancelled* | "failed:interrupted: runtime restarted") ;;
	*) fail "the run_now in flight across the upgrade ended $(status "$INSTANCE2" "$slow"): $(error "$INSTANCE2" "$slow")" ;;
esac
[ "$(registrations)" = "$REG" ] || fail "registrations changed: $REG -> $(registrations)"
ends="$(for id in "${ids[@]}"; do printf '%s:%s ' "$id" "$(status "$INSTANCE" "$id")"; done)$slow:$(status "$INSTANCE2" "$slow") ($(error "$INSTANCE2" "$slow"))"
echo "all delivered within $t_recover s of the recovery ($ends); no new register ($REG)"

step "downgrade to $V_OLD and back to $V_NEW"
rm -f "$C/etc/caldera/agents/$SLOW/run-now-seconds"  # 12 s from here on: within the drain
d0=$(date +%s%N)
as_admin_apt "$WORK/down.log" install -y --allow-downgrades "./$(basename "$OLD")" || { cat "$WORK/down.log"; fail "the downgrade to $V_OLD"; }
[ "$(inside caldera --version)" = "caldera $V_OLD" ] || fail "caldera --version is not $V_OLD after the downgrade"
for name in "$AGENT" "$SLOW"; do
	wait_until 30 "caldera@$name active on $V_OLD" sh -c "[ \"\$(nsenter -t $CPID -a systemctl is-active caldera@$name)\" = active ]" >/dev/null
done
in_order started-after "$(( d0 / 1000 ))"  # their processes began on 0.1.0's files
untouched "the downgrade"
c1=$(plane enqueue --instance "$INSTANCE" collect_system_info)
p1=$(plane enqueue --instance "$INSTANCE2" collect_system_info)
wait_until 60 "a command run by $V_OLD on the $V_NEW state dir" ended "$INSTANCE" "$c1" >/dev/null
wait_until 60 "a command run by $V_OLD on $SLOW" ended "$INSTANCE2" "$p1" >/dev/null
[ "$(status "$INSTANCE" "$c1")" = succeeded ] || fail "command $c1 under $V_OLD: $(status "$INSTANCE" "$c1")"
[ "$(status "$INSTANCE2" "$p1")" = succeeded ] || fail "command $p1 under $V_OLD: $(status "$INSTANCE2" "$p1")"
[ "$(sent_by "$c1" "$p1")" = "caldera/$V_OLD" ] || fail "after the downgrade, finishes sent by $(sent_by "$c1" "$p1" | tr '\n' ' ')(want caldera/$V_OLD only)"
gate_close
c2=$(plane enqueue --instance "$INSTANCE" collect_system_info)
wait_until 60 "command $c2's finish queued under $V_OLD" sh -c "[ \"\$(nsenter -t $CPID -a sh -c 'ls /var/lib/caldera/$AGENT/outbox/' | grep -c -- '-finish.json\$')\" = 1 ]" >/dev/null
b0=$(date +%s%N)
as_admin_apt "$WORK/up2.log" install "./$(basename "$NEW")" || { cat "$WORK/up2.log"; fail "the upgrade back to $V_NEW"; }
[ "$(inside caldera --version)" = "caldera $V_NEW" ] || fail "caldera --version is not $V_NEW after the way back"
in_order stopped-before "$(( b0 / 1000 ))"
untouched "the upgrade back"
gate_open
wait_until 60 "command $c2 (queued under $V_OLD) finished after the way back" ended "$INSTANCE" "$c2" >/dev/null
once "$INSTANCE" "$c1" "$c2"
[ "$(sent_by "$c2")" = "caldera/$V_NEW" ] || fail "command $c2's finish was sent by $(sent_by "$c2") (want caldera/$V_NEW)"
[ "$(registrations)" = "$REG" ] || fail "registrations changed: $REG -> $(registrations)"
[ "$(token_digest "$AGENT")" = "$S1" ] || fail "the session changed across the downgrade"
[ "$(edits)" = "$EDITS" ] || fail "the admin's edits changed across the downgrade"
echo "$V_OLD ran on the $V_NEW state dir (commands $c1 and $p1 succeeded, sent by caldera/$V_OLD); $c2, queued under $V_OLD, reached the plane once under $V_NEW"

step "apt-get remove with a command in flight: stopped within the budget, config and state kept"
slow2=$(plane enqueue --instance "$INSTANCE2" run_now --timeout 300)
running2() { [ "$(status "$INSTANCE2" "$slow2")" = running ]; }
wait_until 30 "the run_now $slow2 in flight" running2 >/dev/null
m0=$(date +%s%N)
as_admin_apt "$WORK/remove.log" remove -y caldera || { cat "$WORK/remove.log"; fail "apt-get remove"; }
t_remove=$(secs "$m0")
left=$(inside python3 -c '
import os
for pid in filter(str.isdigit, os.listdir("/proc")):
    if int(pid) == os.getpid():
        continue
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
    except OSError:
        continue
    if "caldera.cli run" in cmd or "/usr/bin/caldera" in cmd:
        print(pid, cmd)
')
[ -z "$left" ] || fail "still running after remove: $left"
awk -v t="$t_remove" 'BEGIN { exit !(t <= 90) }' || fail "apt-get remove took $t_remove s (TimeoutStopSec=90s)"
if inside journalctl -u "caldera@$SLOW" -u "caldera@$AGENT" --no-pager -o cat | grep -iE 'timed out|killing'; then
	fail "systemd timed out or killed an agent during the removal (above)"
fi
for path in "$cfg/agent.env" "$cfg/secrets.env" /etc/cron.d/caldera "/var/lib/caldera/$AGENT/session.json" \
		"/var/lib/caldera/$SLOW/session.json" "/var/lib/caldera/$AGENT/format.json"; do
	[ -e "$C$path" ] || fail "$path is gone after apt-get remove"
done
[ "$(edits)" = "$EDITS" ] || fail "the admin's edits changed at the removal"
untouched "the removal"
[ "$(inside stat -c '%a %U:%G' /var/lib/caldera-dpkg "$RECORD" | tr '\n' ' ')" = "700 root:root 600 root:root " ] \
	|| fail "root's record: $(inside stat -c '%n %a %U:%G' /var/lib/caldera-dpkg "$RECORD" | tr '\n' ' ')(want 0700 and 0600, root's)"
if inside runuser -u caldera -- ln -s /etc/victim /var/lib/caldera-dpkg/stopped.x 2>/dev/null; then
	fail "the caldera user could plant a link beside root's record"
fi
recorded=$(tr '\n' ' ' < "$C$RECORD")
[ "$recorded" = "caldera@$SLOW.service caldera@$AGENT.service " ] || fail "recorded '$recorded' (want both agents)"
echo "removed in $t_remove s (run_now $slow2 in flight: $(status "$INSTANCE2" "$slow2")); kept config, state, cron line; recorded: $recorded"

step "apt-get install again: the agents start where they were"
as_admin_apt "$WORK/again.log" install "./$(basename "$NEW")" || { cat "$WORK/again.log"; fail "apt-get install after remove"; }
for name in "$AGENT" "$SLOW"; do
	[ "$(prop "$name" ActiveState)" = active ] || fail "caldera@$name is $(prop "$name" ActiveState) after the install"
done
wait_until 60 "command $slow2 (in flight at the removal) finished" ended "$INSTANCE2" "$slow2" >/dev/null
once "$INSTANCE2" "$slow2"
[ "$(status "$INSTANCE2" "$slow2")" = succeeded ] || fail "the run_now in flight at the removal (12 s, within the drain) ended $(status "$INSTANCE2" "$slow2"): $(error "$INSTANCE2" "$slow2")"
c3=$(plane enqueue --instance "$INSTANCE" collect_system_info)
wait_until 60 "a command after the install" ended "$INSTANCE" "$c3" >/dev/null
[ "$(registrations)" = "$REG" ] || fail "registrations changed: $REG -> $(registrations)"
[ "$(token_digest "$AGENT")" = "$S1" ] && [ "$(token_digest "$SLOW")" = "$S2" ] || fail "a session changed"
[ ! -e "$C$RECORD" ] && [ ! -e "$C/var/lib/caldera-dpkg" ] || fail "the record of the stopped agents is left"
[ "$(inside systemctl is-enabled "caldera@$SLOW" || true)" = disabled ] || fail "caldera@$SLOW was enabled on the way"
untouched "the install after the removal"
echo "both agents active again, same sessions; $slow2: $(status "$INSTANCE2" "$slow2"), $c3: $(status "$INSTANCE" "$c3")"

shutdown_container
printf '\n== upgrade %s: summary\n' "$SUITE"
printf 'in the root      %s\n' "$os_release"
printf 'old .deb         %s (%s)\n' "$V_OLD" "$t_old"
printf 'upgrade          %s s (apt-get install, two agents, one command in flight)\n' "$t_upgrade"
printf 'recovery         %s s (the gate opened to every finish at the plane)\n' "$t_recover"
printf 'remove           %s s (a command in flight), budget %s\n' "$t_remove" "90 s"
printf 'total            %s s\n' "$(( $(date +%s) - t0 ))"
