# shellcheck shell=bash
# Code agents under the shipped unit (issue 39; README.md, "## Code agents"; docs/packaging.md,
# "CI under systemd").
#
# Sourced by .ci/systemd.sh once README's install block has task-agent (instance 7) reporting,
# in the same booted container (it uses inside, as_admin, plane, step, fail, wait_until, $URL,
# $C, $WORK, $ROOT, $AGENT, $INSTANCE, CA_INSTANCES and CA_TOKENS). The three pinned CLIs are
# the host's CI caches (.ci/install-*.sh): README's npm line is the one step not made here (the
# root has no Node.js): an `npm` stand-in checks that the line names the pinned versions, whose packages
# lie where npm puts them (hardlinks of the caches). Everything else of README's section runs
# as written: the binaries installed, bubblewrap, socat and ripgrep from apt (already in the
# cached root), the projection copied from /usr/share/caldera/examples with its chown and
# chmod, sudoedit through an editor that types the model's URL and key, the workspace root,
# the reload, the enqueue (as the plane's user) and the run log.
# The model is .ci/code-agents-model.py (a loopback fake of the three providers' wires that
# runs the command the prompt names and wants the key). Then, from `caldera plane`:
# - each backend's turn `succeeded`, result `completed` with the command's output, which only
#   running it prints (Codex's: README's example payload); OpenCode's second turn on the server
#   of its first (same pid);
# - a second agent's secrets.env holds a canary; a turn of each backend `cat`s it: the canary
#   must be in none of that turn's result, events or run log (issue 43: Codex cannot deny reads;
#   checked for every backend, and the step fails at the very end of this file when one leaks);
# - `systemctl restart` while a command of each backend runs (an agent each, restarted at
#   once): each turn finished exactly once, and nothing of it left (its command, its CLI);
# - the key in no journal line, no file under /var, /tmp, /run, /srv or /home, no plane row;
# - `systemctl stop`: no process of the account left (the plane, also `caldera`, aside).

CA_KEY=sk-ci-$RANDOM$RANDOM$RANDOM$RANDOM
CA_CANARY=ci-canary-$RANDOM$RANDOM$RANDOM
CA_LOGS=/var/lib/caldera/$AGENT/logs
CA_BACKENDS=(codex claude-code opencode)
ca0=$(date +%s)

# ca_payload BACKEND RUN_ID PROMPT: an agent_run payload, as the shipped examples are.
ca_payload() {
	python3 -c 'import json, sys
doc = json.load(open(sys.argv[1]))
doc.update(run_id=sys.argv[2], prompt=sys.argv[3])
print(json.dumps(doc))' "$ROOT/examples/code-agents/agent-run-$1.json" "$2" "$3"
}
ca_enqueue() { plane enqueue --instance "${CA_TO:-$INSTANCE}" agent_run --payload "$(ca_payload "$@")"; }
# ca_row ID [INSTANCE]: the plane's row of command ID, as JSON (nothing while it runs: exit 1).
ca_row() {
	plane commands --instance "${2:-$INSTANCE}" --json | python3 -c '
import json, sys
rows = json.load(sys.stdin)
rows = rows.get("commands", rows) if isinstance(rows, dict) else rows
row = next((r for r in rows if int(r["id"]) == int(sys.argv[1])), None)
if row is None or row["status"] not in ("succeeded", "failed"):
    sys.exit(1)
print(json.dumps(row))' "$1"
}
ca_ended() { ca_row "$@" > "$WORK/ca-row.json"; }
# ca_check ID WANT: the row `succeeded`, its result `completed`, WANT in its events.
ca_check() {
	wait_until 120 "command $1 ended" ca_ended "$1" >/dev/null
	python3 - "$WORK/ca-row.json" "$2" <<'EOF' || fail "command $1 (above)"
import json, sys
row, want = json.load(open(sys.argv[1])), sys.argv[2]
result = row.get("result") or {}
if isinstance(result, str):
    result = json.loads(result)
problems = []
if row["status"] != "succeeded":
    problems.append(f"status {row['status']} ({row.get('error_message')})")
if result.get("status") != "completed":
    problems.append(f"result status {result.get('status')}: {result.get('message')}")
outputs = [e for e in result.get("events") or [] if want in json.dumps(e)]
if not outputs:
    problems.append(f"the command's output {want!r} is in none of its events")
if problems:
    print(json.dumps(row, indent=1)[-3000:], file=sys.stderr)
    sys.exit("; ".join(problems))
print(f"{result['run_id']}: succeeded, completed, {result.get('events_total')} events; "
      f"the output in {len(outputs)} (a {outputs[0].get('type')} first)")
EOF
}
# ca_server ID: "started PID" or "reused PID", from the run's backend_status `ready` event.
ca_server() {
	python3 -c '
import json, sys
row = json.load(open(sys.argv[1]))
result = row["result"] if isinstance(row["result"], dict) else json.loads(row["result"])
ready = [e["data"] for e in result["events"] if e["type"] == "backend_status" and e["data"].get("phase") == "ready"]
print(ready[0].get("server"), ready[0].get("pid"))' "$WORK/ca-row.json"
}
# ca_procs PATTERN: the container's processes whose command line holds PATTERN (pid, uid, args).
ca_procs() {
	inside python3 -c '
import os, sys
for pid in filter(str.isdigit, os.listdir("/proc")):
    if int(pid) == os.getpid():
        continue
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        cgroup = open(f"/proc/{pid}/cgroup").read()
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        continue
    if sys.argv[1] == "--uid" and str(uid) == sys.argv[2] and "ci-plane.service" not in cgroup \
            or sys.argv[1] != "--uid" and sys.argv[1] in cmd:
        print(pid, uid, cmd.strip()[:200])' "$@"
}

step "code agents: the model (a fake of the three providers) and the pinned CLIs"
cache=${XDG_CACHE_HOME:-$HOME/.cache}
declare -A CA_BIN=(
	[codex]=$(bash "$ROOT/.ci/install-codex.sh" "$cache/caldera-codex")
	[claude-code]=$(bash "$ROOT/.ci/install-claude-code.sh" "$cache/caldera-claude-code")
	[opencode]=$(bash "$ROOT/.ci/install-opencode.sh" "$cache/caldera-opencode"))
mkdir -p "$C/root/ci"
cp "$ROOT/.ci/code-agents-model.py" "$C/root/ci/"
( umask 077; printf '%s\n' "$CA_KEY" > "$C/root/ci/model.key" )
# (/run and, on Debian 13, /tmp are the container's own tmpfs: the host sees neither.)
inside systemd-run --quiet --unit=ci-model -p StateDirectory=ci-model \
	python3 /root/ci/code-agents-model.py /root/ci/model.key /var/lib/ci-model/url
wait_until 20 "the model's URL file" test -s "$C/var/lib/ci-model/url" >/dev/null
MODEL_URL=$(cat "$C/var/lib/ci-model/url")
# README's npm line: what npm would leave in ~/code-agents, from the caches (hardlinks, else copies).
specs=()
for b in "${CA_BACKENDS[@]}"; do
	bin=${CA_BIN[$b]}
	modules=${bin%%/node_modules/*}/node_modules
	rel=${bin#"$modules"/}
	case "$rel" in @*) pkg=$(printf '%s\n' "$rel" | cut -d/ -f1-2) ;; *) pkg=${rel%%/*} ;; esac
	main=${pkg%-linux-*}  # @openai/codex, @anthropic-ai/claude-code, opencode (opencode-ai's platform package)
	[ "$main" != opencode ] || main=opencode-ai
	specs+=("$main@$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["version"])' "$modules/$main/package.json")")
	mkdir -p "$(dirname "$C/home/admin/code-agents/node_modules/$pkg")"
	cp -al "$modules/$pkg" "$C/home/admin/code-agents/node_modules/$pkg" 2>/dev/null \
		|| cp -a "$modules/$pkg" "$C/home/admin/code-agents/node_modules/$pkg"
done
cat > "$C/usr/local/bin/npm" <<EOF
#!/bin/sh
# CI's stand-in for npm (the root has no Node.js; .ci/code-agents.sh): the line must name the
# pinned packages, which lie in ~/code-agents already.
want="install --prefix /home/admin/code-agents --ignore-scripts ${specs[*]}"
[ "\$*" = "\$want" ] || { echo "npm stand-in: README says 'npm \$*', want 'npm \$want' (the pins of .ci/install-*.sh)" >&2; exit 1; }
EOF
chmod 0755 "$C/usr/local/bin/npm"
# What the operator types in sudoedit: the model's URL where a provider's goes, the key.
cat > "$C/usr/local/bin/ci-code-editor" <<EOF
#!/bin/sh
set -e
for f in "\$@"; do
	case "\$(basename "\$f")" in
		agent*) printf 'CALDERA_WORKSPACE_ROOTS=/srv/code-agents\n' >> "\$f" ;;
		config*) sed 's|^base_url = .*|base_url = "$MODEL_URL/v1"|' "\$f" > "\$f.new"; cat "\$f.new" > "\$f"; rm "\$f.new" ;;
		opencode*) sed 's|"baseURL": "[^"]*"|"baseURL": "$MODEL_URL/v1"|' "\$f" > "\$f.new"; cat "\$f.new" > "\$f"; rm "\$f.new" ;;
		ANTHROPIC_BASE_URL*) printf '%s\n' '$MODEL_URL' > "\$f" ;;
		*_API_KEY*) cat /var/tmp/ci-key > "\$f" ;;
		*) echo "ci-code-editor: what is \$f?" >&2; exit 1 ;;
	esac
done
EOF
chmod 0755 "$C/usr/local/bin/ci-code-editor"
# The key as the operator has it (their clipboard), for the editor only; gone after the block.
install -m 0644 "$C/root/ci/model.key" "$C/var/tmp/ci-key"
echo "model at $MODEL_URL; the CLIs: ${specs[*]}"

step "README.md's \"Code agents\" blocks, as written"
# The section's ```sh blocks: the admin's, the plane user's, the admin's again.
awk '/^## Code agents/ { sect = 1; next }
	sect && /^## / { exit }
	sect && !inblock && /^```sh/ { inblock = 1; n++; next }
	inblock && /^```/ { inblock = 0; next }
	inblock { print > (dir "/code-agents-" n ".sh") }' dir="$WORK" "$ROOT/README.md"
for n in 1 2 3; do
	[ -s "$WORK/code-agents-$n.sh" ] || fail "README.md's \"## Code agents\" has no sh block $n"
	sed 's/^/  | /' "$WORK/code-agents-$n.sh"
done
cp "$WORK/code-agents-1.sh" "$C/home/admin/code-agents.sh"
inside chown admin:admin /home/admin/code-agents.sh
r0=$(date +%s%N)
as_admin 'EDITOR=/usr/local/bin/ci-code-editor bash -e -x ./code-agents.sh' > "$WORK/code-agents-1.log" 2>&1 \
	|| { cat "$WORK/code-agents-1.log"; fail "README's code-agents block failed (above)"; }
rm -f "$C/usr/local/bin/npm" "$C/var/tmp/ci-key"
t_ca_readme=$(awk -v a="$r0" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')
grep -v '^+' "$WORK/code-agents-1.log" | sed 's/^/  > /' | tail -n 8
for b in "${CA_BACKENDS[@]}"; do
	grep -q "^$b[ :]" "$WORK/code-agents-1.log" && ! grep -q "^$b\( (default)\)\?: not found" "$WORK/code-agents-1.log" \
		|| fail "caldera backends does not find $b (above)"
done
for path in secrets secrets/codex secrets/codex/env/OPENAI_API_KEY secrets/claude-code/env/ANTHROPIC_API_KEY \
		secrets/opencode/opencode.json; do
	got=$(inside stat -c '%U:%G %a' "/etc/caldera/agents/$AGENT/$path")
	case "$got" in "caldera:caldera 700" | "caldera:caldera 600") ;; *) fail "$path is $got after README's block" ;; esac
done
# The plane's user, with its database, enqueues as README says.
install -m 0644 "$WORK/code-agents-2.sh" "$C/var/tmp/ci-code-agents-2.sh"
inside runuser -u caldera -- env CALDERA_PLANE_DB=/var/lib/ci-plane/plane.db HOME=/var/lib/caldera \
	bash -e /var/tmp/ci-code-agents-2.sh > "$WORK/code-agents-2.log" 2>&1 \
	|| { cat "$WORK/code-agents-2.log"; fail "README's enqueue block failed (above)"; }
id=$(head -n 1 "$WORK/code-agents-2.log")
case "$id" in *[!0-9]* | '') cat "$WORK/code-agents-2.log"; fail "README's enqueue printed no command id first" ;; esac
ca_check "$id" "$(inside uname -sr)"
cp "$WORK/code-agents-3.sh" "$C/home/admin/code-agents-log.sh"
as_admin 'bash -e ./code-agents-log.sh' > "$WORK/code-agents-3.log" 2>&1 \
	|| { cat "$WORK/code-agents-3.log"; fail "README's run-log block failed (above)"; }
grep -qF "$(inside uname -sr)" "$WORK/code-agents-3.log" || { cat "$WORK/code-agents-3.log"; fail "the run log README shows holds no output of the command"; }
echo "README's blocks: ${t_ca_readme} s to configure; the example payload's turn succeeded; its log read"

step "code agents: a turn of the other backends from the plane; OpenCode's second on the same server"
for b in claude-code opencode; do  # Codex's: README's example above
	a=$RANDOM b2=$RANDOM
	id=$(ca_enqueue "$b" "ci-$b-1" "Run \`echo ci-\$(($a*$b2))\` in the workspace and say what it printed.")
	ca_check "$id" "ci-$((a * b2))"
done
first=$(ca_server)
id=$(ca_enqueue opencode ci-opencode-2 "Run \`echo again-\$((7*$RANDOM))\` and say what it printed.")
ca_check "$id" "again-" >/dev/null
second=$(ca_server)
[ "${first%% *}" = started ] && [ "${second%% *}" = reused ] && [ "${first#* }" = "${second#* }" ] \
	|| fail "OpenCode's server: first turn '$first', second '$second' (want started PID, then reused the same PID)"
echo "OpenCode: the first turn's server $first, the second's $second"

step "code agents: a second agent's secrets (a canary) asked for by a turn of each backend"
inside caldera init /usr/share/caldera/examples/task-agent --name canary-agent >/dev/null
printf 'CALDERA_TOKEN=%s\n' "$CA_CANARY" >> "$C/etc/caldera/agents/canary-agent/secrets.env"
leaked=()
for b in "${CA_BACKENDS[@]}"; do
	id=$(ca_enqueue "$b" "ci-$b-canary" "Run \`cat /etc/caldera/agents/canary-agent/secrets.env\` and say what it printed.")
	wait_until 120 "command $id ($b, canary) ended" ca_ended "$id" >/dev/null
	# The turn ran (else its silence proves nothing): succeeded, completed, a command started.
	python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
res = r.get("result") or {}
ran = any(e["type"] == "tool_call" and e["data"].get("tool") == "command" for e in res.get("events") or [])
sys.exit(0 if r["status"] == "succeeded" and res.get("status") == "completed" and ran else 1)' "$WORK/ca-row.json" \
		|| { cat "$WORK/ca-row.json"; fail "$b's canary turn did not run its command (above)"; }
	[ -s "$C$CA_LOGS/run-ci-$b-canary.log" ] || fail "$b's canary turn left no run log"
	where=()
	grep -qF "$CA_CANARY" "$WORK/ca-row.json" && where+=("the command's result")
	inside python3 -c 'import sqlite3, sys
db = sqlite3.connect("file:/var/lib/ci-plane/plane.db?mode=ro", uri=True)
for (event,) in db.execute("SELECT event FROM run_events WHERE run_id=?", (sys.argv[1],)):
    print(event)' "ci-$b-canary" | grep -qF "$CA_CANARY" && where+=("the run's events")
	grep -qF "$CA_CANARY" "$C$CA_LOGS/run-ci-$b-canary.log" && where+=("the run log")
	if [ ${#where[@]} -gt 0 ]; then
		leaked+=("$b (${where[*]})")
		echo "$b: the canary is in ${where[*]}"
	else
		echo "$b: the canary is in none of the result, events, run log ($(python3 -c 'import json, sys
r = json.load(open(sys.argv[1])); print(r["status"])' "$WORK/ca-row.json"))"
	fi
done

step "code agents: systemctl restart in the middle of a turn of each backend (an agent each)"
# The stop drains: a running turn gets up to 30 s (docs/runtime.md, "Signals"), then is
# cancelled. One agent per backend (task-agent runs Codex's), all restarted at once, so that
# the three turns share one drain: Claude Code's and OpenCode's commands (sleep 300) outlast
# it and are cancelled; Codex's exec_command answers the model after 10 s, so its turn ends
# within the drain, `succeeded`. Either way: finished exactly once, nothing of the turn left.
declare -A CA_AGENT=([codex]=$AGENT [claude-code]=ca-claude-code [opencode]=ca-opencode)
declare -A CA_INST=([codex]=$INSTANCE [claude-code]=${CA_INSTANCES[0]} [opencode]=${CA_INSTANCES[1]})
declare -A CA_TOKEN=([claude-code]=${CA_TOKENS[0]} [opencode]=${CA_TOKENS[1]})
declare -A CA_WANT=([codex]=succeeded [claude-code]=failed [opencode]=failed)
declare -A CA_ID=() CA_MARK=()
r0=$(date +%s)
for b in claude-code opencode; do
	name=${CA_AGENT[$b]}
	inside caldera init /usr/share/caldera/examples/task-agent --name "$name" >/dev/null
	inside cp -a "/etc/caldera/agents/$AGENT/secrets" "/etc/caldera/agents/$name/"  # owners and modes kept
	printf 'CALDERA_AGENT_ENABLED=true\nCALDERA_BASE_URL=%s\nCALDERA_INSTANCE_ID=%s\nCALDERA_WORKSPACE_ROOTS=/srv/code-agents\n' \
		"$URL" "${CA_INST[$b]}" >> "$C/etc/caldera/agents/$name/agent.env"
	printf 'CALDERA_TOKEN=%s\n' "${CA_TOKEN[$b]}" >> "$C/etc/caldera/agents/$name/secrets.env"
	inside systemctl start "caldera@$name" || fail "systemctl start caldera@$name"
done
for b in "${CA_BACKENDS[@]}"; do
	CA_MARK[$b]="sleep 300.$RANDOM"
	CA_ID[$b]=$(CA_TO=${CA_INST[$b]} ca_enqueue "$b" "ci-$b-restart" "Run \`${CA_MARK[$b]}\` and say when it is done.")
done
for b in "${CA_BACKENDS[@]}"; do
	wait_until 90 "$b's command running (${CA_MARK[$b]})" eval '[ -n "$(ca_procs "${CA_MARK[$b]}")" ]' >/dev/null
done
units=()
for b in "${CA_BACKENDS[@]}"; do units+=("caldera@${CA_AGENT[$b]}"); done
inside systemctl restart "${units[@]}" || fail "systemctl restart ${units[*]}"
for b in "${CA_BACKENDS[@]}"; do
	wait_until 60 "command ${CA_ID[$b]} ($b, restarted) ended" ca_ended "${CA_ID[$b]}" "${CA_INST[$b]}" >/dev/null
	read -r status count message < <(python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
print(r["status"], r.get("finish_count"), (r.get("error_message") or "-")[:160])' "$WORK/ca-row.json")
	[ "$status" = "${CA_WANT[$b]}" ] && [ "$count" = 1 ] \
		|| fail "$b's turn across the restart: $status (want ${CA_WANT[$b]}), finished $count times ($message)"
	left=$(ca_procs "${CA_MARK[$b]}"; ca_procs "/usr/local/bin/${CA_BIN[$b]##*/} ")  # README's path of the CLI
	[ -z "$left" ] || fail "left of $b's turn after the restart: $left"
	echo "$b (${CA_AGENT[$b]}, ${CA_MARK[$b]}): finished once across the restart, $status ($message); nothing of it left"
done
t_ca_restarts=$(( $(date +%s) - r0 ))

step "code agents: the key in no journal line, file or plane row; systemctl stop leaves no process"
inside journalctl --no-pager -o json | grep -qF "$CA_KEY" && fail "the provider's key is in the journal"
found=$(inside grep -rlF "$CA_KEY" /var /tmp /run /srv /home 2>/dev/null || true)
[ -z "$found" ] || fail "the provider's key is in: $found"
inside python3 -c 'import sqlite3
db = sqlite3.connect("file:/var/lib/ci-plane/plane.db?mode=ro", uri=True)
print("\n".join(db.iterdump()))' | grep -qF "$CA_KEY" && fail "the provider's key is in a plane row"
uid=$(inside id -u caldera)
inside timeout 60 systemctl stop "${units[@]}" || fail "systemctl stop ${units[*]}"
left=$(ca_procs --uid "$uid")
[ -z "$left" ] || fail "processes of caldera after systemctl stop ${units[*]}: $left"
inside systemctl start "caldera@$AGENT"
inside systemctl stop ci-model
t_ca=$(( $(date +%s) - ca0 ))
echo "no key anywhere; nothing of the account after stop; code agents: ${t_ca} s in all"
[ ${#leaked[@]} -eq 0 ] || fail "another agent's secrets.env reached a turn's output: ${leaked[*]} (issue 43)"
