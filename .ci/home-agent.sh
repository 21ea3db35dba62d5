# shellcheck shell=bash
# An adapter agent that lives in its owner's home, under the shipped unit (issue 23; SPEC
# section 11; README.md, "### An agent that lives in a user's home").
#
# Sourced by .ci/systemd.sh after its purge step, in the same booted container (it uses
# inside, as_admin, step, fail, wait_until, $C, $WORK, $DEB, $ROOT). The README's home block
# installs an agent named task-agent too, so it runs once the first one is purged:
# the package again; account `agent` made by adduser (home 0700, as Debian 13 makes it) with
# seed 000's checkout in /home/agent/task-agent (the seed's manifest and its minimal adapter,
# verbatim: examples/home-agent/, checked against the seed by
# tests/packaging/test_packaging_home_agent.py; .venv/bin/python a symlink, as a venv has it);
# the README block run as the admin, exactly as written; then every verb from the plane and
# from the host CLI, the owners of every file, a third account denied the secrets and the
# session, `systemd-analyze security` for both kinds of instance (the home one at most 1.0
# above the bundle one), a kind switch each way keeping state and session, and purge
# removing the drop-in.

HOME_AGENT=task-agent
HOME_DIR=/home/agent
CHECKOUT=$HOME_DIR/task-agent
INSTANCE3=9
TOKEN3=ci-home-$RANDOM$RANDOM$RANDOM
HPLANE_DB=/var/lib/ci-plane-home/plane.db
DROP_IN=/etc/systemd/system/caldera@$HOME_AGENT.service.d/caldera-account.conf
hplane() { inside caldera plane "$@" --db "$HPLANE_DB"; }
hprop() { inside systemctl show -P "$1" "caldera@$HOME_AGENT"; }
h0=$(date +%s)

step "home agent: the package again; account agent (adduser, home 0700); seed 000's checkout"
inside sh -c "cd /root/ci && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends ./$(basename "$DEB")" \
	> "$WORK/apt.log" 2>&1 || { cat "$WORK/apt.log"; fail "apt-get install (again, for the home agent)"; }
inside adduser --quiet --disabled-password --comment '' --shell /bin/bash agent
inside adduser --quiet --disabled-password --comment '' --shell /bin/bash other
[ "$(inside stat -c %a $HOME_DIR)" = 700 ] || fail "agent's home is $(inside stat -c %a $HOME_DIR), want adduser's 0700"
mkdir -p "$C$CHECKOUT/caldera" "$C$CHECKOUT/.venv/bin"
cp "$ROOT/examples/home-agent/caldera.agent.yaml" "$C$CHECKOUT/caldera.agent.yaml"
cp "$ROOT/examples/home-agent/caldera/adapter.py" "$C$CHECKOUT/caldera/adapter.py"
cmp "$ROOT/examples/home-agent/caldera/adapter.py" "$C$CHECKOUT/caldera/adapter.py" || fail "the adapter copy differs"
# A virtualenv's interpreter is a symlink to the system's (python3 -m venv makes the same).
ln -s /usr/bin/python3 "$C$CHECKOUT/.venv/bin/python"
printf 'home = /usr/bin\ninclude-system-site-packages = false\n' > "$C$CHECKOUT/.venv/pyvenv.cfg"
inside chown -R agent:agent $CHECKOUT
inside runuser -u agent -- sh -c "cd $CHECKOUT && .venv/bin/python caldera/adapter.py status" >/dev/null \
	|| fail "the seed's adapter does not answer status as agent in its checkout"
grep -n 'workdir\|command' "$C$CHECKOUT/caldera.agent.yaml" | sed 's/^/  | /'

step "home agent: init refuses bad set-ups with a sentence"
refused() {  # refused WHAT EXPECTED-WORDS COMMAND…
	local what=$1 words=$2 out
	shift 2
	if out=$(inside "$@" 2>&1); then fail "$what: caldera init accepted it: $out"; fi
	printf '%s\n' "$out" | grep -qF "$words" || fail "$what: '$out' does not say '$words'"
	echo "$what: $out"
}
refused "no such account" "no such account" caldera init $CHECKOUT --name refused-1 --user nobody-here
refused "not the checkout's owner" "belongs to agent, not other" caldera init $CHECKOUT --name refused-2 --user other
refused "a system account" "is a system account" caldera init $CHECKOUT --name refused-3 --user daemon
# The service user plants its state dir as a link to /etc: root follows it nowhere.
etc_before=$(inside stat -c '%U:%G %a' /etc)
inside runuser -u caldera -- ln -s /etc /var/lib/caldera/refused-4
refused "a state dir planted as a link" "not a directory of its own" \
	caldera init /usr/share/caldera/examples/task-agent --name refused-4
[ "$(inside stat -c '%U:%G %a' /etc)" = "$etc_before" ] || fail "init changed /etc through a planted link"
inside rm /var/lib/caldera/refused-4
[ ! -e "$C/etc/caldera/agents/refused-1" ] && [ ! -e "$C/etc/caldera/agents/refused-2" ] \
	&& [ ! -e "$C/etc/caldera/agents/refused-4" ] || fail "a refused init left files"

step "home agent: caldera plane serve for it (inside)"
inside systemd-run --quiet --unit=ci-plane-home -p User=caldera -p StateDirectory=ci-plane-home \
	caldera plane serve --host 127.0.0.1 --port 0 --db "$HPLANE_DB" \
	--bootstrap-token "$TOKEN3" --instance-id "$INSTANCE3" --heartbeat-interval 2 --poll-interval 1 \
	--url-file /var/lib/ci-plane-home/url
wait_until 20 "the home plane's URL file" test -s "$C/var/lib/ci-plane-home/url" >/dev/null
URL3=$(cat "$C/var/lib/ci-plane-home/url")
# The operator's values for this agent, as the sudoedit steps type them.
ci_editor "$URL3" "$INSTANCE3" "$TOKEN3"
echo "plane at $URL3"

step "README.md's \"An agent that lives in a user's home\" block, as the admin"
awk '/^### An agent that lives in a user.s home/ { sect = 1; next }
	sect && /^##/ { exit }
	sect && !inblock && /^```sh/ { inblock = 1; next }
	inblock && /^```/ { exit }
	inblock { print }' "$ROOT/README.md" > "$C/home/admin/home-agent.sh"
[ -s "$C/home/admin/home-agent.sh" ] || fail "README.md has no sh block under \"### An agent that lives in a user's home\""
sed 's/^/  | /' "$C/home/admin/home-agent.sh"
inside chown admin:admin /home/admin/home-agent.sh
r0=$(date +%s%N)
as_admin 'bash -e -x ./home-agent.sh' > "$WORK/home-readme.log" 2>&1 \
	|| { cat "$WORK/home-readme.log"; fail "the README's home-agent block failed (above)"; }
cat "$WORK/home-readme.log"
t_home_readme=$(awk -v a="$r0" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')

step "home agent: the unit runs the runtime as agent; the drop-in"
sed 's/^/  | /' "$C$DROP_IN"
[ "$(hprop User)" = agent ] || fail "caldera@$HOME_AGENT runs as '$(hprop User)', want agent"
[ "$(hprop ActiveState)" = active ] || fail "caldera@$HOME_AGENT is $(hprop ActiveState)"
pid=$(hprop MainPID)
[ "$(inside stat -c %U "/proc/$pid")" = agent ] || fail "the main PID $pid belongs to $(inside stat -c %U "/proc/$pid")"
[ "$(hprop ProtectHome)" = tmpfs ] || fail "ProtectHome=$(hprop ProtectHome) for the home agent, want tmpfs"
echo "User=agent, main PID $pid is agent's, ProtectHome=tmpfs + BindPaths=$HOME_DIR"
hregistered() { hplane agents --json | grep -q "\"$INSTANCE3\"\\|: *$INSTANCE3[,}]"; }
hreported() { [ -n "$(hplane reports --instance "$INSTANCE3" --last --json | tr -d '[]{} \n')" ]; }
t_home_reg=$(wait_until 60 "the home agent registered" hregistered)
t_home_rep=$(wait_until 60 "the home agent reporting" hreported)
echo "registered ${t_home_reg} s, reporting ${t_home_rep} s after the README block"

step "home agent: every verb from the plane"
# hcommand TYPE PAYLOAD: enqueue, wait until it ends; its row (JSON) on stdout; fails unless succeeded.
hcommand() {
	local id row
	id=$(hplane enqueue --instance "$INSTANCE3" --payload "$2" "$1")
	ended() { hplane commands --instance "$INSTANCE3" --json | python3 -c '
import json, sys
want = int(sys.argv[1])
rows = json.load(sys.stdin)
rows = rows.get("commands", rows) if isinstance(rows, dict) else rows
for r in rows:
    if int(r["id"]) == want and r["status"] in ("succeeded", "failed"):
        print(json.dumps(r)); sys.exit(0)
sys.exit(1)' "$id"; }
	wait_until 30 "plane command $1 ($id) ended" ended >/dev/null
	row=$(ended)
	printf '%s\n' "$row" | grep -q '"status": "succeeded"' || fail "plane command $1: $row"
	printf '%s\n' "$row"
}
owned_by_agent() {  # owned_by_agent PATH: exists and is agent's
	[ "$(inside stat -c %U:%G "$1")" = agent:agent ] || fail "$1 is $(inside stat -c %U:%G "$1" 2>&1), want agent:agent"
}
hcommand pause '{}' >/dev/null
owned_by_agent $CHECKOUT/paused
hcommand resume '{}' >/dev/null
[ ! -e "$C$CHECKOUT/paused" ] || fail "resume from the plane left $CHECKOUT/paused"
hcommand run_now '{}' >/dev/null
owned_by_agent $CHECKOUT/run-now
hcommand settings_set '{"values": {"max_7d": 0.5}}' >/dev/null
owned_by_agent $CHECKOUT/settings.json
grep -q '"max_7d": 0.5' "$C$CHECKOUT/settings.json" || fail "settings.json: $(cat "$C$CHECKOUT/settings.json")"
hcommand settings_get '{}' | grep -q max_7d || fail "settings_get from the plane has no max_7d"
hcommand log_list '{}' >/dev/null
hcommand collect_system_info '{}' >/dev/null
echo "pause, resume, run_now, settings_set, settings_get, log_list, collect_system_info: succeeded; files agent's"

step "home agent: every verb from the host CLI (sudo, as the admin)"
rm -f "$C$CHECKOUT/run-now"
for verb in "pause" "resume" "run-now" "settings get" "settings set max_7d=0.6" "log" "status" "check"; do
	as_admin "sudo caldera $verb --agent $HOME_AGENT" > "$WORK/verb.log" 2>&1 \
		|| { cat "$WORK/verb.log"; fail "sudo caldera $verb --agent $HOME_AGENT"; }
	echo "sudo caldera $verb: $(head -c 160 "$WORK/verb.log" | tr '\n' ' ')"
	case "$verb" in
		pause) owned_by_agent $CHECKOUT/paused ;;
		resume) [ ! -e "$C$CHECKOUT/paused" ] || fail "sudo caldera resume left $CHECKOUT/paused" ;;
		run-now) owned_by_agent $CHECKOUT/run-now ;;
		"settings set"*) grep -q '"max_7d": 0.6' "$C$CHECKOUT/settings.json" || fail "settings set from the host CLI" ;;
	esac
done
as_admin "caldera status --agent $HOME_AGENT" >/dev/null || fail "caldera status without sudo (admin)"
inside runuser -u other -- caldera status --agent $HOME_AGENT >/dev/null || fail "caldera status without sudo (other)"
echo "caldera status without sudo: the admin and a third account read status.json"

step "home agent: owners; a third account denied the secrets and the session"
inside stat -c '%n %U:%G %a' /etc/caldera/agents/$HOME_AGENT/agent.env /etc/caldera/agents/$HOME_AGENT/secrets.env \
	/var/lib/caldera/$HOME_AGENT /var/lib/caldera/$HOME_AGENT/session.json
[ "$(inside stat -c '%U:%G %a' /etc/caldera/agents/$HOME_AGENT/secrets.env)" = "agent:agent 600" ] || fail "secrets.env is not agent:agent 0600"
[ "$(inside stat -c '%U:%G %a' /etc/caldera/agents/$HOME_AGENT/agent.env)" = "root:agent 640" ] || fail "agent.env is not root:agent 0640"
[ "$(inside stat -c '%U %a' /var/lib/caldera/$HOME_AGENT/session.json)" = "agent 600" ] || fail "session.json is not agent's 0600"
left=$(inside find /var/lib/caldera/$HOME_AGENT $CHECKOUT ! -user agent -printf '%u %p\n')
[ -z "$left" ] || fail "not owned by agent: $left"
for who in other caldera; do
	for f in /etc/caldera/agents/$HOME_AGENT/secrets.env /var/lib/caldera/$HOME_AGENT/session.json; do
		if inside runuser -u "$who" -- cat "$f" >/dev/null 2>&1; then fail "$who can read $f"; fi
	done
done
echo "state dir and checkout all agent's; other and caldera cannot read secrets.env or session.json"

step "systemd-analyze security: the bundle agent's instance and the home agent's"
# A bundle instance for comparison: idle-agent from the first half is purged; a fresh one.
inside caldera init /usr/share/caldera/examples/task-agent --name bundle-agent >/dev/null
[ -z "$(inside systemctl show -P DropInPaths caldera@bundle-agent)" ] || fail "the bundle agent's instance has a drop-in"
inside systemd-analyze security --no-pager caldera@bundle-agent.service > "$WORK/sec-bundle" 2>&1 || true
inside systemd-analyze security --no-pager "caldera@$HOME_AGENT.service" > "$WORK/sec-home" 2>&1 || true
echo "--- caldera@bundle-agent (bundle: the unit as shipped)"; cat "$WORK/sec-bundle"
echo "--- caldera@$HOME_AGENT (home: + caldera-account.conf)"; cat "$WORK/sec-home"
exposure() { sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p' "$1"; }
score_bundle=$(exposure "$WORK/sec-bundle")
score_home=$(exposure "$WORK/sec-home")
[ -n "$score_bundle" ] && [ -n "$score_home" ] || fail "no exposure score (bundle '$score_bundle', home '$score_home')"
echo "exposure: bundle instance $score_bundle, home instance $score_home"
awk -v h="$score_home" -v b="$score_bundle" 'BEGIN { exit !(h <= b + 1.0) }' \
	|| fail "the home agent's exposure $score_home is more than 1.0 above the bundle agent's $score_bundle"
diff <(grep -v '^→ Overall' "$WORK/sec-bundle") <(grep -v '^→ Overall' "$WORK/sec-home") | sed -n 's/^[<>]/  &/p' || true

step "home agent: kind switch home -> bundle -> home keeps state and session, fixes owners"
refused "a kind switch under the running unit" "is running: stop it first" \
	caldera init /usr/share/caldera/examples/task-agent --name $HOME_AGENT
[ -e "$C$DROP_IN" ] || fail "a refused kind switch removed the drop-in"
inside systemctl stop "caldera@$HOME_AGENT"
session_sum() { inside sha256sum "/var/lib/caldera/$HOME_AGENT/session.json" | cut -d' ' -f1; }
sum0=$(session_sum)
inside caldera init /usr/share/caldera/examples/task-agent --name $HOME_AGENT > "$WORK/switch.log" 2>&1 \
	|| { cat "$WORK/switch.log"; fail "re-init into the bundle"; }
cat "$WORK/switch.log"
[ ! -e "$C$DROP_IN" ] || fail "the drop-in is left after the move into the bundle"
[ "$(session_sum)" = "$sum0" ] || fail "the session changed in the move into the bundle"
left=$(inside find /var/lib/caldera/$HOME_AGENT ! -user caldera -printf '%u %p\n')
[ -z "$left" ] || fail "not caldera's after the move into the bundle: $left"
[ "$(inside stat -c '%U:%G' /etc/caldera/agents/$HOME_AGENT/secrets.env)" = caldera:caldera ] || fail "secrets.env not caldera's"
grep -q "CALDERA_TOKEN=$TOKEN3" "$C/etc/caldera/agents/$HOME_AGENT/secrets.env" || fail "secrets.env lost its token"
inside systemctl start "caldera@$HOME_AGENT"
[ "$(hprop User)" = caldera ] || fail "after the move the unit runs as $(hprop User)"
t_switch=$(wait_until 30 "the bundle kind reporting" sh -c "[ \"\$(nsenter -t $CPID -a systemctl is-active caldera@$HOME_AGENT)\" = active ]")
hcommand collect_system_info '{}' >/dev/null
inside systemctl stop "caldera@$HOME_AGENT"
sum1=$(session_sum)
inside caldera init $CHECKOUT --name $HOME_AGENT --user agent > "$WORK/switch.log" 2>&1 \
	|| { cat "$WORK/switch.log"; fail "re-init back into the home"; }
cat "$WORK/switch.log"
[ -e "$C$DROP_IN" ] || fail "no drop-in after the move back"
[ "$(session_sum)" = "$sum1" ] || fail "the session changed in the move back"
left=$(inside find /var/lib/caldera/$HOME_AGENT ! -user agent -printf '%u %p\n')
[ -z "$left" ] || fail "not agent's after the move back: $left"
inside systemctl start "caldera@$HOME_AGENT"
[ "$(hprop User)" = agent ] || fail "after the move back the unit runs as $(hprop User)"
hcommand pause '{}' >/dev/null
owned_by_agent $CHECKOUT/paused
hcommand resume '{}' >/dev/null
echo "home -> bundle -> home: session kept, owners caldera then agent, commands run each time"

step "home agent: apt-get purge removes the drop-in, keeps the agent's checkout"
inside systemctl stop ci-plane-home
inside sh -c 'DEBIAN_FRONTEND=noninteractive apt-get purge -y -q caldera' > "$WORK/apt.log" 2>&1 \
	|| { cat "$WORK/apt.log"; fail "apt-get purge (home agent)"; }
[ ! -e "$C/etc/systemd/system/caldera@$HOME_AGENT.service.d" ] || fail "the drop-in dir is left after purge"
[ -s "$C$CHECKOUT/caldera/adapter.py" ] || fail "purge touched the agent's checkout"
echo "purged: no drop-in left; $CHECKOUT stays (the agent's own)"
t_home=$(( $(date +%s) - h0 ))
