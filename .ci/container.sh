#!/bin/bash
# The package inside a container as ClawManager runs one (issue 22; docs/container.md).
#
# "Image build": a Debian 13 root debootstrapped from the package's dependencies (cached,
# .ci/root.sh), the .deb installed with apt, a process-mode agent installed with
# `caldera init`, the gateway's cluster DNS name mapped to this host's loopback in the
# image's /etc/hosts. Then the image runs as a plain container, NOT booted: the command of
# packaging/container/Dockerfile (`caldera run`) is PID 1 (systemd-nspawn without -b),
# --read-only, /tmp a tmpfs, the persistent dir bound at /config (empty at first), and
# only ClawManager's variables (the plain-http gateway URL it injects, port 9001 when free).
# The plane runs on the host (caldera's embedded plane from the checkout's venv, through
# .ci/container-plane.py: a request log, 503 on every finish on SIGUSR1, a live proxy).
# Checks: registered, reports carrying the agent's PID (the agent's own namespace PID),
# a command round trip, `caldera status` inside the container, no zombie after an agent
# leaves grandchildren behind (run_now), nothing written outside /config and no error
# logged, plain log lines, SIGTERM (exit 0, agent stopped, final report), a restart (the
# session reused, reports resumed), SIGINT, the proxy case (a dead proxy with the gateway
# in NO_PROXY; a live proxy without it), a kill -9 of PID 1 while the plane answers 503 (the
# queued finish reaches the plane exactly once after the restart, the command never runs
# twice), the same image built for a non-root user (`caldera init --owner app`) run as
# uid 1000 (`systemd-nspawn --user=app`: register, a command, SIGTERM), and the canary
# bootstrap token nowhere in the output or any file. The variables are a current server's
# (issue 34): CLAWMANAGER_AGENT_RUNTIME_TYPE=hermes beside the placement marker
# CLAWMANAGER_RUNTIME_TYPE=desktop, and the AI gateway with a canary key: the agent is
# hermes-12-main, the hermes skill dirs of the volume are scanned (a category recursed; a
# category holding only DESCRIPTION.md is no skill) and named by `caldera status`, the reports say the agent is on the gateway, and the gateway's
# key is nowhere either. Then an OpenCode instance as ClawManager makes one (issue 39: the
# runtime's variables, OPENCODE_CONFIG_CONTENT on the gateway, the server's credentials, the
# `opencode` binary in the image, CALDERA_WORKSPACE_ROOTS=/config/workspace; the plane's port
# fakes the gateway's chat completions, whose model runs one command): two agent_run opencode
# from `caldera plane enqueue` (the command runs under bubblewrap; the second reuses the
# server); the same instance under .ci/no-namespaces.py (Docker's default seccomp rule): the
# command denied, and with CALDERA_RUN_SANDBOX=external run in the container; the report's
# code_agent_confinement each time. Every wait is bounded: a stop by the
# code's own stop bound (docs/container.md), everything else by a limit named where it is.
#
# Usage: .ci/container.sh [DEB | DIR-with-one-caldera_*.deb]
#   without an argument it builds one (packaging/build-deb.sh, tests skipped).
# Needs root. Installs debootstrap and systemd-container itself; the root is cached in
# $CALDERA_CI_CACHE (default /var/cache/caldera-ci), keyed on mirror + package list.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SUITE=trixie
# caldera's Debian dependencies (so that a cached run installs the .deb without the network)
PACKAGES=(python3 python3-requests python3-jsonschema python3-yaml adduser
	bubblewrap ripgrep)  # and what a code agent's commands need (docs/backends.md)
AGENT=ci-agent
APP_USER=app  # the non-root image's user (uid 1000, as packaging/container/Dockerfile makes it)
INSTANCE=12
TOKEN=agt_boot_$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')  # the canary: ClawManager's format
LLM_KEY=igt_$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')  # the gateway key's canary
NS=demo
GATEWAY_HOST=clawmanager-gateway.$NS-system.svc.cluster.local
PERSISTENT=/config/.hermes  # what ClawManager injects for hermes
NSPAWN_PID=
CPID=
WORK=
PLANE_PID=
t0=$(date +%s)

step() { printf '\n== container: %s (%ds)\n' "$*" "$(( $(date +%s) - t0 ))"; }
fail() {
	printf 'container: FAILED: %s\n' "$*" >&2
	if [ -n "$WORK" ] && [ -f "$WORK/container.log" ]; then
		echo "--- the container's output (last 60 lines)" >&2
		grep -v '^Attempted to remove disk file system' "$WORK/container.log" | tail -n 60 >&2 || true
	fi
	exit 1
}
now_ns() { date +%s%N; }
since() { awk -v a="$1" -v b="$(now_ns)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }'; }
# wait_until SECONDS WHAT COMMAND...: poll every 0.25 s; the elapsed seconds on stdout.
wait_until() {
	local limit=$1 what=$2 start
	shift 2
	start=$(now_ns)
	while :; do
		if "$@" >/dev/null 2>&1; then
			since "$start"
			echo
			return 0
		fi
		[ $(( ($(now_ns) - start) / 1000000000 )) -lt "$limit" ] || fail "$what: not within $limit s"
		sleep 0.25
	done
}

# gone PID: the process has ended (exited, reaped or not: bash may have collected its status
# already, and `wait` then returns it at once). kill -0 alone would count a zombie as alive.
gone() {
	local st
	st=$(ps -o stat= -p "$1" 2>/dev/null | tr -d ' ')
	[ -z "$st" ] || [ "${st#Z}" != "$st" ]
}
# reap_within SECONDS PID: wait for a child known to be ending, at most SECONDS; 1 if it did not end
reap_within() {
	local pid=$2 i
	for ((i = 0; i < $1 * 4; i++)); do
		if gone "$pid"; then
			wait "$pid" 2>/dev/null || true
			return 0
		fi
		sleep 0.25
	done
	return 1
}
stop_container() {  # stop_container: whatever is left of it, killed (bounded: never hangs the cleanup)
	[ -n "$NSPAWN_PID" ] || return 0
	if ! gone "$NSPAWN_PID"; then
		# PID 1 first: its death ends every process of its namespace.
		[ -z "$CPID" ] || kill -KILL "$CPID" 2>/dev/null || true
		reap_within 10 "$NSPAWN_PID" || kill -KILL "$NSPAWN_PID" 2>/dev/null || true
	fi
	reap_within 10 "$NSPAWN_PID" || echo "container: systemd-nspawn (pid $NSPAWN_PID) did not end after SIGKILL; left behind" >&2
	NSPAWN_PID=
	CPID=
}
cleanup() {
	local rc=$?
	stop_container
	if [ -n "$PLANE_PID" ]; then
		kill -TERM "$PLANE_PID" 2>/dev/null || true
		reap_within 10 "$PLANE_PID" || { kill -KILL "$PLANE_PID" 2>/dev/null || true; reap_within 5 "$PLANE_PID" || true; }
	fi
	[ -z "$WORK" ] || rm -rf "$WORK"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ "$(id -u)" -eq 0 ] || fail "needs root (debootstrap, systemd-nspawn, nsenter)"

step "tools"
need=()
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v systemd-nspawn >/dev/null 2>&1 || need+=(systemd-container)
command -v nsenter >/dev/null 2>&1 || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
	DEBIAN_FRONTEND=noninteractive apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
echo "$(systemd-nspawn --version | head -n 1), debootstrap $(dpkg-query -W -f '${Version}' debootstrap)"
PY=$ROOT/.venv/bin/python  # the plane: caldera's own, from the checkout
[ -x "$PY" ] || make -C "$ROOT" .venv/.deps-newest >/dev/null
"$PY" -c 'import caldera.plane.server' || fail "the checkout's venv has no caldera plane"
plane() { timeout 60 "$PY" -m caldera.cli plane "$@" --db "$WORK/plane.db"; }
# The longest graceful stop of the CI agent (stop_timeout_seconds: 10), from the code's own
# constants (docs/container.md, "Stopping"): a stop not over by then is a failure.
STOP_LIMIT=$("$PY" -c 'import math; from caldera.daemon import run; print(math.ceil(run.agent_stop_limit(10) + run.REST_OF_STOP))')

step "the .deb"
DEB=${1:-}
if [ -d "$DEB" ]; then
	DEB=$(ls "$DEB"/caldera_*_all.deb | head -n 1)
fi
if [ -z "$DEB" ]; then
	mkdir -p /tmp/caldera-ci-container-deb
	DEB=$(DEB_BUILD_OPTIONS=nocheck "$ROOT/packaging/build-deb.sh" /tmp/caldera-ci-container-deb | tail -n 1)
fi
[ -f "$DEB" ] || fail "no .deb at '$DEB'"
echo "$DEB ($(dpkg-deb -f "$DEB" Version))"
DOCKERFILE=$ROOT/packaging/container/Dockerfile
# The command the shipped image definition runs (its CMD, exec form), run here as PID 1.
read -r -a CMD < <(sed -n 's/^CMD \[\(.*\)\]$/\1/p' "$DOCKERFILE" | tr -d '",')
[ "${CMD[*]}" = "caldera run" ] || fail "packaging/container/Dockerfile's CMD is '${CMD[*]}', not 'caldera run'"

step "base root (debootstrap $SUITE, cached)"
# shellcheck source=.ci/root.sh
. "$ROOT/.ci/root.sh"
b0=$(date +%s)
BASE=$(base_root "$SUITE" "${PACKAGES[@]}") || fail "debootstrap $SUITE"
t_base="$(( $(date +%s) - b0 )) s"

step "image build: apt-get install the .deb, caldera init the agent"
WORK=$(mktemp -d /var/tmp/caldera-ci-container.XXXXXX)
IMG=$WORK/image
cp -a --reflink=auto "$BASE" "$IMG"
rm -f "$IMG/.complete"
mkdir -p "$WORK/build/$AGENT" "$IMG/config"
cp "$DEB" "$WORK/build/"
cat > "$WORK/build/$AGENT/caldera.agent.yaml" <<'EOF'
name: ci-agent
version: 1.0.0
description: CI only - a process agent whose run-now leaves grandchildren behind.
runtime:
  type: process
  command: [python3, agent.py]
  stop_timeout_seconds: 10
  run_now_signal: USR1
status: status.json
state: agent
controls: [run_now]
bindings: [llm_gateway]
EOF
cat > "$WORK/build/$AGENT/agent.py" <<'EOF'
import json, os, signal, subprocess, sys, time
state = os.environ["CALDERA_AGENT_STATE_DIR"]
runs = [0]
# A helper starts a grandchild and exits at once: the grandchild is handed to PID 1, records
# the parent it was handed to, and ends. Nobody but PID 1 can wait for it.
GRAND = "import os, sys, time; time.sleep(0.5); open(sys.argv[1], 'w').write(str(os.getppid())); time.sleep(0.5)"
HELPER = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {GRAND!r}, sys.argv[1]])"

def status():
    tmp = os.path.join(state, ".status.tmp")
    with open(tmp, "w") as fh:
        json.dump({"state": {"level": "ok", "label": f"Idle, {runs[0]} runs"}, "agent": {"version": "ci-1.0"}}, fh)
    os.replace(tmp, os.path.join(state, "status.json"))

def run_now(*_):
    runs[0] += 1
    for i in range(3):
        subprocess.run([sys.executable, "-c", HELPER, os.path.join(state, f"orphan-{runs[0]}-{i}")], check=True)
    status()

signal.signal(signal.SIGUSR1, run_now)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("ci agent up, pid", os.getpid(), flush=True)
while True:
    status()
    time.sleep(2)
EOF
# As a Dockerfile's RUN lines would (the build's /tmp: the files COPY brings in), in $BUILD_IMG
# (the root image unless said otherwise); at most 15 minutes (apt may fetch its lists).
BUILD_IMG=$IMG
build() { timeout --kill-after=10 900 systemd-nspawn -q -D "$BUILD_IMG" -M caldera-ctr-build --register=no \
	--keep-unit --pipe --bind="$WORK/build:/tmp" "$@" 2>&1 | grep -v '^Attempted to remove disk file system' || true; }
b0=$(date +%s)
deb=/tmp/$(basename "$DEB")
build sh -c "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $deb" > "$WORK/apt.log"
if ! build dpkg-query -W -f '${Status}' caldera | grep -q 'install ok installed'; then
	# a dependency the cached base lacks: fetch the lists once and retry
	build sh -c "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $deb" \
		> "$WORK/apt.log"
	build dpkg-query -W -f '${Status}' caldera | grep -q 'install ok installed' || { cat "$WORK/apt.log"; fail "apt-get install"; }
fi
rm -rf "$IMG/var/lib/apt/lists/"*
# The cluster's DNS, as the pod would see it: the gateway's names on this host's loopback.
printf '127.0.0.1\tlocalhost\n127.0.0.1\t%s clawmanager-gateway.%s-system clawmanager-gateway\n::1\tlocalhost\n' \
	"$GATEWAY_HOST" "$NS" > "$IMG/etc/hosts"
# The same image for a non-root user (the Dockerfile's CALDERA_USER=app): from here they differ.
IMG_APP=$WORK/image-app
cp -a --reflink=auto "$IMG" "$IMG_APP"
# The OpenCode image's CLI (the root image only): the native binary on PATH, as an image installs
# it; and the CI's seccomp filter, which forbids namespaces for the instance that runs under it.
OPENCODE_BIN=${CALDERA_OPENCODE_BIN:-$(bash "$ROOT/.ci/install-opencode.sh" "${HOME:-/root}/.cache/caldera-opencode")}
[ -x "$OPENCODE_BIN" ] || fail "no opencode binary at '$OPENCODE_BIN' (.ci/install-opencode.sh)"
cp --reflink=auto "$OPENCODE_BIN" "$IMG/usr/local/bin/opencode"
mkdir -p "$IMG/usr/local/lib/caldera-ci"
cp "$ROOT/.ci/no-namespaces.py" "$IMG/usr/local/lib/caldera-ci/"
# As the Dockerfile does: caldera init --owner the image's user (root here, app there).
build caldera init "/tmp/$AGENT" --name "$AGENT" --owner root | tee "$WORK/init.log"
[ -f "$IMG/etc/caldera/agents/$AGENT/caldera.agent.yaml" ] || fail "caldera init installed nothing"
BUILD_IMG=$IMG_APP
build useradd --uid 1000 --user-group --create-home --shell /usr/sbin/nologin "$APP_USER"  # systemd-nspawn --user needs its home to exist
build caldera init "/tmp/$AGENT" --name "$AGENT" --owner "$APP_USER" | tee -a "$WORK/init.log"
BUILD_IMG=$IMG
cfg=$IMG_APP/etc/caldera/agents/$AGENT
[ "$(stat -c '%u %a' "$cfg/secrets.env")" = "1000 600" ] || fail "caldera init --owner $APP_USER: secrets.env is $(stat -c '%U %a' "$cfg/secrets.env"), not $APP_USER 0600"
[ "$(stat -c '%g %a' "$cfg/agent.env")" = "1000 640" ] || fail "caldera init --owner $APP_USER: agent.env is $(stat -c '%U:%G %a' "$cfg/agent.env"), not root:$APP_USER 0640"
t_build="$(( $(date +%s) - b0 )) s"
touch "$WORK/image-done"  # the images are final from here: nothing in them may change
echo "built in $t_build (a root image and an '$APP_USER' one); $(build caldera --version)"

step "the control plane on the host"
PORT=9001
if ! "$PY" -c 'import socket, sys; s = socket.socket(); s.bind(("127.0.0.1", 9001))' 2>/dev/null; then
	PORT=0  # ClawManager's port is taken on this machine: any free one
fi
"$PY" "$ROOT/.ci/container-plane.py" "$WORK/plane.db" "$PORT" 0 "$WORK/plane.url" "$WORK/requests.log" \
	"$WORK/proxied.log" "$TOKEN" "$INSTANCE" > "$WORK/plane.log" 2>&1 &
PLANE_PID=$!
wait_until 20 "the plane's URL file" test -s "$WORK/plane.url" >/dev/null
read -r PLANE_URL PROXY_PORT < "$WORK/plane.url"
PORT=${PLANE_URL##*:}
BASE_URL=http://$GATEWAY_HOST:$PORT
echo "plane $PLANE_URL, live proxy on port $PROXY_PORT; the container's base URL: $BASE_URL"
touch "$WORK/requests.log" "$WORK/proxied.log"

PERSIST=$WORK/config  # the platform's volume: the hermes image's skills in it, no caldera state yet
mkdir -p "$PERSIST/hermes/skills/productivity/notes" "$PERSIST/.hermes/skills/deploy"
printf -- '---\nname: notes\n---\nTake notes.\n' > "$PERSIST/hermes/skills/productivity/notes/SKILL.md"
printf -- '---\nname: deploy\n---\nDeploy.\n' > "$PERSIST/.hermes/skills/deploy/SKILL.md"
# what is no skill: a category's own DESCRIPTION.md, a category with nothing in it yet
printf -- 'Tools for work.\n' > "$PERSIST/hermes/skills/productivity/DESCRIPTION.md"
mkdir -p "$PERSIST/hermes/skills/research"
printf -- 'Papers.\n' > "$PERSIST/hermes/skills/research/DESCRIPTION.md"
RUN_PERSIST=$PERSIST
STATE=$PERSIST/.hermes/caldera-agent
GATEWAY_LLM=http://$GATEWAY_HOST:$PORT/api/v1/gateway/llm  # never called: the agent only reads it
# A current server's variables (issue 34): the runtime's name beside the placement marker, the gateway.
ENVS=(CLAWMANAGER_AGENT_ENABLED=true "CLAWMANAGER_AGENT_BASE_URL=$BASE_URL"
	"CLAWMANAGER_AGENT_BOOTSTRAP_TOKEN=$TOKEN" "CLAWMANAGER_AGENT_INSTANCE_ID=$INSTANCE"
	"CLAWMANAGER_AGENT_PERSISTENT_DIR=$PERSISTENT" CLAWMANAGER_AGENT_PROTOCOL_VERSION=v1
	CLAWMANAGER_AGENT_DISK_LIMIT_BYTES=10737418240 CLAWMANAGER_AGENT_RUNTIME_TYPE=hermes
	CLAWMANAGER_RUNTIME_TYPE=desktop "CLAWMANAGER_LLM_BASE_URL=$GATEWAY_LLM" "CLAWMANAGER_LLM_API_KEY=$LLM_KEY"
	'CLAWMANAGER_LLM_MODEL=["auto","gpt-4.1"]' CLAWMANAGER_LLM_PROVIDER=openai-compatible
	"CLAWMANAGER_INSTANCE_TOKEN=$LLM_KEY" "OPENAI_BASE_URL=$GATEWAY_LLM" "OPENAI_API_BASE=$GATEWAY_LLM"
	"OPENAI_API_KEY=$LLM_KEY" OPENAI_MODEL=auto
	# CM-aug's (clawmanager-notes 1.5): JSON, of a shape the notes do not give; the egress instance id
	'CLAWMANAGER_LLM_REASONING={"gpt-4.1":"medium"}' 'CLAWMANAGER_LLM_REASONING_CONTROL={"enabled":true}'
	"CLAWMANAGER_EGRESS_INSTANCE_ID=$INSTANCE")

# start_container [VAR=VALUE...]: the image with ClawManager's variables (and the extra ones
# given); $RUN_IMG, $RUN_PERSIST and $RUN_USER (empty: the image's root) say which image, volume and user.
RUN_IMG=$IMG
RUN_USER=
RUN_PREFIX=()  # what execs the image's command (the seccomp filter of the instance without namespaces)
start_container() {
	local setenv=() kv user=()
	for kv in "${ENVS[@]}" "$@"; do setenv+=("--setenv=$kv"); done
	[ -z "$RUN_USER" ] || user=("--user=$RUN_USER")
	printf '\n--- container start %s\n' "$(date -u +%FT%TZ)" >> "$WORK/container.log"
	systemd-nspawn -D "$RUN_IMG" -M caldera-ctr --register=no --keep-unit --pipe --read-only "${user[@]}" \
		--tmpfs=/tmp --bind="$RUN_PERSIST:/config" "${setenv[@]}" "${RUN_PREFIX[@]}" "${CMD[@]}" \
		>> "$WORK/container.log" 2>&1 &
	NSPAWN_PID=$!
	CPID=
	local pid
	for _ in $(seq 200); do
		# PID 1 of the container: the process under nspawn whose PID in its namespace is 1
		for pid in $(ps -o pid= --ppid "$NSPAWN_PID" 2>/dev/null); do
			if [ "$(awk '/^NSpid:/ { print $NF }' "/proc/$pid/status" 2>/dev/null)" = 1 ]; then CPID=$pid; fi
		done
		[ -n "$CPID" ] && break
		kill -0 "$NSPAWN_PID" 2>/dev/null || break
		sleep 0.05
	done
	[ -n "$CPID" ] || fail "no PID 1 under systemd-nspawn"
	# at first it is still nspawn's own helper, whose argv holds the command too (nspawn's
	# own arguments end with it): only its executable tells the two apart
	local exe
	for _ in $(seq 200); do
		exe=$(readlink "/proc/$CPID/exe" 2>/dev/null) || exe=
		if [ -n "$exe" ] && [ "${exe##*/}" != systemd-nspawn ] &&
			tr '\0' ' ' < "/proc/$CPID/cmdline" 2>/dev/null | grep -q "caldera run"; then
			return 0
		fi
		sleep 0.05
	done
	fail "PID 1 of the container never became '${CMD[*]}'"
}
nspawn_gone() { gone "$NSPAWN_PID"; }
# stop_with SIGNAL: signal the container's PID 1 (as docker stop and the kubelet do) and wait
# for it, at most the stop bound (here, not in a subshell: nspawn is this shell's child);
# sets STOP_T (s, printed, never judged) and STOP_RC.
stop_with() {
	local s0
	s0=$(now_ns)
	STOP_RC=0
	kill "-$1" "$CPID"
	wait_until "$STOP_LIMIT" "the container's exit after SIG$1 (the stop bound, 2 x stop_timeout_seconds + 104 s)" \
		nspawn_gone >/dev/null
	wait "$NSPAWN_PID" || STOP_RC=$?
	STOP_T=$(since "$s0")
	NSPAWN_PID=
	CPID=
}
# A command in the running container, with the environment `docker exec` would have.
inside() {
	timeout 60 nsenter -t "$CPID" -a env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
		"${ENVS[@]}" "$@"
}
last_report() { plane reports --instance "$INSTANCE" --last --json; }
report_field() {  # report_field PYTHON-EXPR-ON-BODY
	last_report | "$PY" -c "import json, sys; r = json.load(sys.stdin)['report']; b = r['body'] if r else None; print($1)"
}
command_status() {  # command_status ID: its status
	plane commands --instance "$INSTANCE" --json | "$PY" -c '
import json, sys
for row in json.load(sys.stdin)["commands"]:
    if int(row["id"]) == int(sys.argv[1]):
        print(row["status"])' "$1"
}
succeeded() { [ "$(command_status "$1")" = succeeded ]; }
registered() { plane agents --json | grep -q "\"hermes-$INSTANCE-main\""; }
count_requests() { grep -cE "$1" "$WORK/requests.log" || true; }
reported_since() { [ "$(count_requests '^POST /api/v1/agent/state/report 200$')" -gt "$1" ]; }
descendants() {  # every process of the container (host pids), with its state
	"$PY" - "$CPID" <<'EOF'
import os, sys
table = {}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        stat = open(f"/proc/{pid}/stat", "rb").read()
    except OSError:
        continue
    fields = stat[stat.rindex(b")") + 2:].split()
    table[int(pid)] = (int(fields[1]), fields[0].decode())
found, frontier = {int(sys.argv[1]): table.get(int(sys.argv[1]), (0, "?"))[1]}, [int(sys.argv[1])]
while frontier:
    parent = frontier.pop()
    for pid, (ppid, state) in table.items():
        if ppid == parent and pid not in found:
            found[pid] = state
            frontier.append(pid)
for pid, state in sorted(found.items()):
    print(pid, state)
EOF
}
zombies() { descendants | awk '$2 == "Z"'; }
no_zombie() { [ -z "$(zombies)" ]; }

step "start: caldera run as PID 1, read-only root, only ClawManager's variables"
c0=$(now_ns)
start_container
echo "PID 1 is host pid $CPID (NSpid $(awk '/^NSpid:/ { $1 = ""; print }' "/proc/$CPID/status"))"
env_names=$(tr '\0' '\n' < "/proc/$CPID/environ" | cut -d= -f1 | sort | tr '\n' ' ')
echo "PID 1's environment: $env_names"
if printf '%s\n' "$env_names" | grep -q 'CALDERA_\|JOURNAL_STREAM'; then fail "a CALDERA_ variable or JOURNAL_STREAM reached the container"; fi
t_reg=$(wait_until 60 "registered with the plane" registered)
reported_pid() { [ "$(report_field "isinstance(b and b['runtime']['openclaw_pid'], int) and b['runtime']['openclaw_pid'] == b['runtime']['runtime_pid']")" = True ]; }
t_rep=$(wait_until 60 "a report carrying the agent's pid" reported_pid)
AGENT_PID=$(report_field "b['runtime']['openclaw_pid']")
[ "$(report_field "b['agent_id']")" = "hermes-$INSTANCE-main" ] || fail "agent_id is not hermes-$INSTANCE-main"
# The reported pid is the agent's own PID in the container (its namespace's view): find it.
host_agent=
for pid in $(descendants | awk '{ print $1 }'); do
	if [ "$(awk '/^NSpid:/ { print $NF }' "/proc/$pid/status" 2>/dev/null)" = "$AGENT_PID" ]; then host_agent=$pid; fi
done
[ -n "$host_agent" ] && tr '\0' ' ' < "/proc/$host_agent/cmdline" | grep -q 'agent.py' \
	|| fail "the reported pid $AGENT_PID is not the agent's process in the container"
[ -d "$STATE" ] || fail "no state in $PERSISTENT/caldera-agent"
echo "registered ${t_reg} s, a report with the agent's pid $AGENT_PID (host pid $host_agent) ${t_rep} s after the start"

step "a command round trip; caldera status inside the container"
id=$(plane enqueue --instance "$INSTANCE" collect_system_info)
t_cmd=$(wait_until 30 "collect_system_info $id succeeded" succeeded "$id")
inside caldera status > "$WORK/status.txt" 2>&1 || { cat "$WORK/status.txt"; fail "caldera status inside the container"; }
sed 's/^/  | /' "$WORK/status.txt"
grep -q "process: pid $AGENT_PID, running" "$WORK/status.txt" || fail "caldera status does not show the agent's pid $AGENT_PID running"
echo "round trip ${t_cmd} s; caldera status shows pid $AGENT_PID"

step "the hermes skill dirs (a category recursed); the LLM-governance fields"
grep -q "/config/hermes/skills, /config/.hermes/skills (hermes default)" "$WORK/status.txt" \
	|| fail "caldera status does not name the hermes skill dirs"
# The plane's inventory: the skills the runtime reported, as the server keeps them (one row a skill).
plane_skills() { "$PY" -c 'import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
print(" ".join(sorted(r[0] for r in db.execute("SELECT install_path FROM instance_skills WHERE instance_id=? AND status=?", (int(sys.argv[2]), "active")))))' "$WORK/plane.db" "$INSTANCE"; }
hermes_skills() { [ "$(plane_skills)" = "/config/.hermes/skills/deploy /config/hermes/skills/productivity/notes" ]; }
wait_until 30 "the plane's inventory: the two hermes skills (got: $(plane_skills))" hermes_skills >/dev/null
[ "$(report_field "' '.join(str(x) for x in (b['runtime'].get('llm_config_status'), b['runtime'].get('llm_provider_base_url'), len(b['runtime'].get('llm_config_fingerprint') or '')))")" = "gateway $GATEWAY_LLM 71" ] \
	|| fail "the report does not say the agent is on the gateway: $(report_field "{k: v for k, v in b['runtime'].items() if k.startswith('llm')}")"
echo "skills: $(plane_skills); the report: llm_config_status gateway, $GATEWAY_LLM"

step "an agent whose children leave grandchildren behind: no zombie"
id=$(plane enqueue --instance "$INSTANCE" run_now)
wait_until 30 "run_now $id succeeded" succeeded "$id" >/dev/null
wait_until 30 "the three grandchildren's records" sh -c "[ \$(ls '$STATE/agent'/orphan-1-* 2>/dev/null | wc -l) -eq 3 ]" >/dev/null
for f in "$STATE/agent"/orphan-1-*; do
	wait_until 10 "$f written" test -s "$f" >/dev/null
	[ "$(cat "$f")" = 1 ] || fail "a grandchild was handed to pid $(cat "$f"), not PID 1"
done
# Each grandchild ends 0.5 s after its record; reaped, it leaves the process table (a zombie,
# its command line empty, stays in it): none running and none a zombie, else the zombies are named.
grandchild_running() {
	local pid
	for pid in $(descendants | awk '{ print $1 }'); do
		tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q "orphan-1-" && return 0
	done
	return 1
}
all_reaped() { ! grandchild_running && no_zombie; }
wait_until 30 "the grandchildren ended and reaped (a zombie left in the container, or a grandchild still running)" \
	all_reaped >/dev/null
echo "3 grandchildren handed to PID 1, all reaped: $(descendants | wc -l) processes in the container, none a zombie"
rss1=$(awk '/^VmRSS:/ { print $2 }' "/proc/$CPID/status")
pss1=$(awk '/^Pss:/ { print $2 }' "/proc/$CPID/smaps_rollup")
runtime_pid=$(ps -o pid= --ppid "$CPID" | head -n 1 | tr -d ' ')
rss2=$(awk '/^VmRSS:/ { print $2 }' "/proc/$runtime_pid/status")
echo "PID 1 (the reaper): RSS $rss1 KiB, PSS $pss1 KiB; the runtime: RSS $rss2 KiB"

step "read-only root: nothing written outside /config, nothing logged as an error"
tmp_left=$(inside sh -c 'ls -A /tmp' || true)
changed=$(find "$IMG" -xdev -newer "$WORK/image-done" -printf '%p\n' | head -n 20)
[ -z "$changed" ] || fail "written in the image (read-only): $changed"
if grep -v '^Attempted to remove disk file system' "$WORK/container.log" | grep -E 'Traceback|^ERROR|Read-only file system|Permission denied'; then
	fail "an error in the container's output (above)"
fi
if grep -v '^Attempted to remove disk file system\|^--- container start\|^$' "$WORK/container.log" | grep -v '^\(INFO\|WARNING\) caldera'; then
	fail "a line that is not a plain log line (above)"
fi
grep -q "^WARNING caldera: the control plane at $GATEWAY_HOST is reached over plain http" "$WORK/container.log" \
	|| fail "the plain-http URL was not named at start"
echo "image unchanged; /tmp holds: ${tmp_left:-nothing}; every line plain ('LEVEL logger: message')"

step "SIGTERM: agent stopped, final report, exit 0"
regs_before=$(count_requests '^POST /api/v1/agent/register ')
stop_with TERM
t_term=$STOP_T
[ "$STOP_RC" = 0 ] || fail "exit status $STOP_RC after SIGTERM (want 0)"
[ "$(report_field "b['runtime']['openclaw_status'] + ' ' + str(b['runtime']['openclaw_pid']) + ' ' + b['runtime']['runtime_status']")" = "stopped None stopping" ] \
	|| fail "the final report does not say the agent stopped: $(report_field "b['runtime']")"
grep -q "agent pid $AGENT_PID the runtime stopped (exited with status 0)" "$WORK/container.log" || fail "the agent did not exit 0"
echo "stopped in $t_term s, exit 0; the final report: agent stopped, runtime stopping"

step "restart: the session is reused, reports resume; then SIGINT"
reports_before=$(count_requests '^POST /api/v1/agent/state/report 200$')
start_container
t_resume=$(wait_until 30 "reports after the restart" reported_since "$reports_before")
[ "$(count_requests '^POST /api/v1/agent/register ')" = "$regs_before" ] || fail "the restarted container registered again"
id=$(plane enqueue --instance "$INSTANCE" collect_system_info)
wait_until 30 "a command after the restart" succeeded "$id" >/dev/null
stop_with INT
t_int=$STOP_T
[ "$STOP_RC" = 0 ] || fail "exit status $STOP_RC after SIGINT (want 0)"
echo "reports ${t_resume} s after the restart, no new register, a command ran; SIGINT: stopped in $t_int s, exit 0"

step "proxies: a dead one with the gateway in NO_PROXY; a live one without"
dead=http://127.0.0.1:$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
reports_before=$(count_requests '^POST /api/v1/agent/state/report 200$')
start_container "HTTP_PROXY=$dead" "HTTPS_PROXY=$dead" "http_proxy=$dead" "https_proxy=$dead" \
	"NO_PROXY=clawmanager-gateway,clawmanager-gateway.$NS-system,$GATEWAY_HOST" \
	"no_proxy=clawmanager-gateway,clawmanager-gateway.$NS-system,$GATEWAY_HOST"
t_noproxy=$(wait_until 30 "reports with a dead proxy and the gateway in NO_PROXY" reported_since "$reports_before")
stop_with TERM
[ "$STOP_RC" = 0 ] || fail "exit status $STOP_RC after SIGTERM (want 0)"
live=http://127.0.0.1:$PROXY_PORT
reports_before=$(count_requests '^POST /api/v1/agent/state/report 200$')
start_container "HTTP_PROXY=$live" "http_proxy=$live"
t_live=$(wait_until 30 "reports through the live proxy" reported_since "$reports_before")
grep -q "^POST $BASE_URL/api/v1/agent/state/report" "$WORK/proxied.log" || fail "the live proxy saw no report"
stop_with TERM
[ "$STOP_RC" = 0 ] || fail "exit status $STOP_RC after SIGTERM (want 0)"
echo "dead proxy + NO_PROXY: reports in ${t_noproxy} s; live proxy: reports in ${t_live} s ($(grep -c . "$WORK/proxied.log") requests went through it)"

step "kill -9 of PID 1 while the plane answers every finish 503; restart: delivered exactly once"
start_container
wait_until 30 "reports after the restart" reported_since "$(count_requests '^POST /api/v1/agent/state/report 200$')" >/dev/null
kill -USR1 "$PLANE_PID"  # every finish: 503
id=$(plane enqueue --instance "$INSTANCE" collect_system_info)
queued() { ls "$STATE/outbox" 2>/dev/null | grep -q -- '-finish\.json$'; }
wait_until 30 "the finish of $id queued in the outbox" queued >/dev/null
wait_until 30 "the plane refusing the finish of $id" sh -c "grep -q '^POST /api/v1/agent/commands/$id/finish 503' '$WORK/requests.log'" >/dev/null
kill -KILL "$CPID"  # the container's hard kill: PID 1 dies, the kernel ends the rest
wait_until 30 "the container's end after kill -9 of PID 1" nspawn_gone >/dev/null
wait "$NSPAWN_PID" || true
NSPAWN_PID=
CPID=
[ "$(command_status "$id")" != succeeded ] || fail "the finish of $id arrived before the kill"
kill -USR2 "$PLANE_PID"  # the plane answers again
start_container
t_k9=$(wait_until 60 "the queued finish of $id delivered after the restart" succeeded "$id")
no_finish_queued() { ! queued; }
wait_until 30 "the finish gone from the outbox" no_finish_queued >/dev/null
# A graceful stop: the sender's passes and the final flush are over at the exit, so a finish
# that would go twice has gone by then; the counts are taken after it.
stop_with TERM
[ "$STOP_RC" = 0 ] || fail "exit status $STOP_RC after SIGTERM (want 0)"
took=$(count_requests "^POST /api/v1/agent/commands/$id/finish 200$")
starts=$(count_requests "^POST /api/v1/agent/commands/$id/start ")
[ "$took" = 1 ] || fail "the finish of $id reached the plane $took times (want exactly 1)"
[ "$starts" = 1 ] || fail "command $id was started $starts times (want 1: never run again)"
echo "after the restart the finish of $id arrived in ${t_k9} s: taken once, started once, outbox empty"

step "a non-root image user: caldera init --owner $APP_USER, run as uid 1000"
PERSIST_APP=$WORK/config-app  # a fresh volume, the user's (the pod's fsGroup, or a chown)
mkdir -p "$PERSIST_APP"
chown 1000:1000 "$PERSIST_APP"
STATE_APP=$PERSIST_APP/.hermes/caldera-agent
RUN_IMG=$IMG_APP RUN_PERSIST=$PERSIST_APP RUN_USER=$APP_USER
regs_before=$(count_requests '^POST /api/v1/agent/register 200$')
start_container
RUN_IMG=$IMG RUN_PERSIST=$PERSIST RUN_USER=
registered_again() { [ "$(count_requests '^POST /api/v1/agent/register 200$')" -gt "$regs_before" ]; }
t_app_reg=$(wait_until 60 "registered, as $APP_USER" registered_again)
uids=$(awk '/^Uid:/ { print $2 }' "/proc/$CPID/status")
runtime_pid=$(ps -o pid= --ppid "$CPID" | head -n 1 | tr -d ' ')
uids="$uids $(awk '/^Uid:/ { print $2 }' "/proc/$runtime_pid/status")"
[ "$uids" = "1000 1000" ] || fail "PID 1 and the runtime run as uids $uids, not 1000"
id=$(plane enqueue --instance "$INSTANCE" collect_system_info)
t_app_cmd=$(wait_until 30 "collect_system_info $id succeeded, as $APP_USER" succeeded "$id")
stop_with TERM
[ "$STOP_RC" = 0 ] || fail "exit status $STOP_RC after SIGTERM, as $APP_USER (want 0)"
[ "$(stat -c '%u %a' "$STATE_APP/session.json")" = "1000 600" ] || fail "session.json is not $APP_USER's 0600"
changed=$(find "$IMG_APP" -xdev -newer "$WORK/image-done" -printf '%p\n' | head -n 20)
[ -z "$changed" ] || fail "written in the image (read-only): $changed"
if grep -v '^Attempted to remove disk file system' "$WORK/container.log" | grep -E 'Traceback|^ERROR|Permission denied|permission denied'; then
	fail "an error in the container's output, as $APP_USER (above)"
fi
echo "as uid 1000: registered ${t_app_reg} s after the start, a command round trip ${t_app_cmd} s, SIGTERM exit 0 in $STOP_T s"

# An OpenCode instance, as ClawManager makes one (clawmanager-notes 1.5, 4.2): the runtime's
# name, its persistent dir, the server's config on the gateway and its credentials, the project
# path. The workspace root is given as CALDERA_WORKSPACE_ROOTS (the instance's project dir).
OC_CONTENT='{"$schema":"https://opencode.ai/config.json","provider":{"clawmanager":{"npm":"@ai-sdk/openai-compatible","name":"ClawManager","options":{"baseURL":"{env:CLAWMANAGER_LLM_BASE_URL}","apiKey":"{env:CLAWMANAGER_LLM_API_KEY}"},"models":{"auto":{"name":"auto"}}}},"model":"clawmanager/auto"}'
OC_STATE=$PERSIST/.opencode/caldera-agent
mkdir -p "$PERSIST/workspace"
ENVS_HERMES=("${ENVS[@]}")
ENVS=("${ENVS[@]/#CLAWMANAGER_AGENT_RUNTIME_TYPE=hermes/CLAWMANAGER_AGENT_RUNTIME_TYPE=opencode}")
ENVS=("${ENVS[@]/#CLAWMANAGER_AGENT_PERSISTENT_DIR=*/CLAWMANAGER_AGENT_PERSISTENT_DIR=/config/.opencode}")
ENVS+=("OPENCODE_CONFIG_CONTENT=$OC_CONTENT" OPENCODE_SERVER_USERNAME=opencode "OPENCODE_SERVER_PASSWORD=$LLM_KEY"
	CLAWMANAGER_PROJECT_PATH=/config/workspace CALDERA_WORKSPACE_ROOTS=/config/workspace)
oc_registered() { plane agents --json | grep -q "\"opencode-$INSTANCE-main\""; }
finished() { case "$(command_status "$1")" in succeeded|failed) return 0 ;; esac; return 1; }
# oc_run RUN-ID: an opencode agent_run from the plane; prints "STATUS RUN-STATUS CONFINEMENT SERVER RAN"
# (RAN: what the command printed, "-" if it never ran) and the commands' line of backend_status.
oc_run() {
	local id
	id=$(plane enqueue --instance "$INSTANCE" --timeout 180 --payload "{\"run_id\":\"$1\",\"prompt\":\"Say where you run.\",\"backend_profile\":\"opencode\",\"workspace\":\"/config/workspace\",\"execution_policy\":{\"timeout_seconds\":120}}" agent_run)
	wait_until 150 "agent_run $1 ($id) finished" finished "$id" > "$WORK/oc-$1.t"
	plane commands --instance "$INSTANCE" --json | "$PY" -c '
import json, sys
row = next(r for r in json.load(sys.stdin)["commands"] if int(r["id"]) == int(sys.argv[1]))
res = row.get("result") or {}
events = [e for e in res.get("events") or [] if isinstance(e, dict)]
start = next((e["data"] for e in events if e["type"] == "backend_status" and e["data"].get("phase") == "starting"), {})
ran = " ".join(e["data"].get("output") or "" for e in events if e["type"] == "command_output").split()
ready = next((e["data"] for e in events if e["type"] == "backend_status" and e["data"].get("phase") == "ready"), {})
print(row["status"], res.get("status"), (start.get("policy") or {}).get("confinement"), ready.get("server"),
      "_".join(ran) or "-")
print(start.get("commands"), "| the server listening after", ready.get("listening_after_ms"), "ms")' "$id"
}

step "an OpenCode instance (ClawManager's variables, the binary in the image): agent_run opencode from the plane"
regs_before=$(count_requests '^POST /api/v1/agent/register 200$')
start_container
t_oc_reg=$(wait_until 60 "registered as opencode-$INSTANCE-main" oc_registered)
oc_run oc-1 > "$WORK/oc-1.out"
t_oc1=$(cat "$WORK/oc-oc-1.t")
read -r st rst conf server ran < "$WORK/oc-1.out"
sed -n 2p "$WORK/oc-1.out" | sed 's/^/  commands: /'
[ "$st $rst $conf" = "succeeded completed backend" ] || fail "the OpenCode run: $(head -n 1 "$WORK/oc-1.out") (want succeeded completed backend)"
case "$ran" in caldera-ran-42_in_/config/workspace_pid1=/usr/bin/bwrap_*) ;; *) fail "the model's command did not run under bubblewrap: $ran" ;; esac
oc_run oc-2 > "$WORK/oc-2.out"
t_oc2=$(cat "$WORK/oc-oc-2.t")
read -r st rst conf server ran < "$WORK/oc-2.out"
[ "$st $rst" = "succeeded completed" ] && [ "$ran" != - ] || fail "the second OpenCode run: $(head -n 1 "$WORK/oc-2.out")"
[ "$server" = reused ] || fail "the second run did not reuse the agent's OpenCode server (its server: $server)"
[ "$(report_field "b['runtime'].get('code_agent_confinement')")" = backend ] || fail "the report does not say code_agent_confinement backend"
stop_with TERM
[ "$STOP_RC" = 0 ] || fail "exit status $STOP_RC after SIGTERM, the OpenCode instance (want 0)"
echo "registered ${t_oc_reg} s; the first run ${t_oc1} s (the command ran under bubblewrap: $ran), the second ${t_oc2} s (the server reused)"

step "the same instance with namespaces forbidden (Docker's default seccomp filter): what runs"
RUN_PREFIX=(python3 /usr/local/lib/caldera-ci/no-namespaces.py)
start_container
oc_run oc-3 > "$WORK/oc-3.out"
t_oc3=$(cat "$WORK/oc-oc-3.t")
read -r st rst conf server ran < "$WORK/oc-3.out"
[ "$st $rst $conf $ran" = "succeeded completed backend -" ] || fail "without namespaces and without the setting: $(head -n 1 "$WORK/oc-3.out") (want the command denied)"
grep -q '^denied (bubblewrap is not there, cannot start here' <(sed -n 2p "$WORK/oc-3.out") || fail "backend_status does not say the commands are denied"
stop_with TERM
reports_before=$(count_requests '^POST /api/v1/agent/state/report 200$')
start_container CALDERA_RUN_SANDBOX=external
wait_until 30 "a report" reported_since "$reports_before" >/dev/null
oc_run oc-4 > "$WORK/oc-4.out"
t_oc4=$(cat "$WORK/oc-oc-4.t")
read -r st rst conf server ran < "$WORK/oc-4.out"
[ "$st $rst $conf" = "succeeded completed external" ] || fail "with CALDERA_RUN_SANDBOX=external: $(head -n 1 "$WORK/oc-4.out")"
case "$ran" in caldera-ran-42_in_/config/workspace_pid1=*caldera_run*) ;; *) fail "with CALDERA_RUN_SANDBOX=external the command did not run in the container: $ran" ;; esac
[ "$(report_field "b['runtime'].get('code_agent_confinement')")" = external ] || fail "the report does not say code_agent_confinement external"
stop_with TERM
[ "$STOP_RC" = 0 ] || fail "exit status $STOP_RC after SIGTERM, the instance without namespaces (want 0)"
RUN_PREFIX=()
ENVS=("${ENVS_HERMES[@]}")
changed=$(find "$IMG" -xdev -newer "$WORK/image-done" -printf '%p\n' | head -n 20)
[ -z "$changed" ] || fail "written in the image (read-only): $changed"
echo "without the setting: the command denied (${t_oc3} s); CALDERA_RUN_SANDBOX=external: it ran in the container (${t_oc4} s), the report says external"

step "the canary bootstrap token: nowhere but where ClawManager put it; the gateway key nowhere"
[ "$(stat -c %a "$STATE/session.json")" = 600 ] || fail "session.json is not 0600"
leaks=$(grep -rlF "$TOKEN" "$WORK/container.log" "$PERSIST" "$IMG" "$PERSIST_APP" "$IMG_APP" 2>/dev/null \
	| grep -v "^$STATE/session.json$" | grep -v "^$STATE_APP/session.json$" || true)
[ -z "$leaks" ] || fail "the bootstrap token is in: $leaks"
leaks=$(grep -rlF "$LLM_KEY" "$WORK/container.log" "$PERSIST" "$IMG" "$PERSIST_APP" "$IMG_APP" "$WORK/plane.db" \
	"$WORK/requests.log" 2>/dev/null || true)
[ -z "$leaks" ] || fail "the gateway key is in: $leaks"
echo "not in the container's output, the persistent dir, the image or the plane (session.json 0600)"

stop_container
printf '\n== container: summary\n'
printf 'base root          %s\n' "$t_base"
printf 'image build        %s (apt-get install the .deb, caldera init)\n' "$t_build"
printf 'first start        registered %s s, then a report with the agent pid +%s s, a command round trip +%s s\n' "$t_reg" "$t_rep" "$t_cmd"
printf 'PID 1              RSS %s KiB, PSS %s KiB (the runtime: RSS %s KiB)\n' "$rss1" "$pss1" "$rss2"
printf 'SIGTERM / SIGINT   %s s / %s s, exit 0\n' "$t_term" "$t_int"
printf 'restart            reports %s s after the start, session reused\n' "$t_resume"
printf 'proxies            dead + NO_PROXY %s s, live %s s\n' "$t_noproxy" "$t_live"
printf 'kill -9 + 503      finish delivered once, %s s after the restart\n' "$t_k9"
printf 'as uid 1000        registered %s s, a command round trip +%s s, SIGTERM exit 0\n' "$t_app_reg" "$t_app_cmd"
printf 'OpenCode instance  registered %s s; agent_run %s s, the second %s s (server reused)\n' "$t_oc_reg" "$t_oc1" "$t_oc2"
printf 'no namespaces      the command denied %s s; CALDERA_RUN_SANDBOX=external: it ran, %s s\n' "$t_oc3" "$t_oc4"
printf 'total              %s s\n' "$(( $(date +%s) - t0 ))"
