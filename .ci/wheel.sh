#!/bin/bash
# The wheel where the .deb does not reach (issue 35; docs/packaging.md, "The wheel"): build
# it from a copy of this tree, install it into a fresh venv (its dependencies from PyPI),
# and from outside the checkout, with an emptied environment: `caldera --version`,
# `caldera check` on the examples that live in their bundle (task-agent, inbox-watcher: the
# schemas come from the installed package, read with importlib.resources), one
# `caldera init` + `caldera report --once` against `caldera plane serve` on 127.0.0.1, and
# `caldera demo` (its example agents are package data too) until its agents are online and
# its commands finished, then Ctrl-C (SIGINT to its process group), as a person would.
#
# Usage: .ci/wheel.sh [PYTHON]      (default python3; needs its venv module)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${1:-python3}
t0=$(date +%s)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/caldera-ci-wheel.XXXXXX")
PLANE_PID=
DEMO_PID=
cleanup() {
	[ -z "$PLANE_PID" ] || { kill "$PLANE_PID" 2>/dev/null || true; wait "$PLANE_PID" 2>/dev/null || true; }
	[ -z "$DEMO_PID" ] || { kill -KILL -- "-$DEMO_PID" 2>/dev/null || true; wait "$DEMO_PID" 2>/dev/null || true; }
	rm -rf "$WORK"
}
trap cleanup EXIT
step() { printf '\n== wheel: %s (%ds)\n' "$*" "$(( $(date +%s) - t0 ))"; }
fail() { printf 'wheel: FAILED: %s\n' "$*" >&2; exit 1; }
# The venv's caldera only: no checkout on sys.path (cwd is $WORK), no CALDERA_* from CI.
VENV=(env -i -C "$WORK" PATH="$WORK/venv/bin:/usr/sbin:/usr/bin:/sbin:/bin" HOME="$WORK/home" LANG=C.UTF-8
	CALDERA_CONFIG_DIR="$WORK/etc" CALDERA_STATE_DIR="$WORK/var")
venv() { "${VENV[@]}" "$@"; }
# In the background: the array itself, not the function (its subshell would be $!, not the program).

step "build the wheel (a copy of the tree, pip wheel)"
mkdir "$WORK/src" "$WORK/dist" "$WORK/home" "$WORK/etc" "$WORK/var"
tar -C "$ROOT" --exclude=./.git --exclude='./.venv*' --exclude=./build --exclude=./dist --exclude='*.egg-info' \
	--exclude=__pycache__ --exclude=.caldera-state --exclude=./debian -cf - . | tar -C "$WORK/src" -xf -
"$PY" -m venv "$WORK/build-venv"
"$WORK/build-venv/bin/pip" install --quiet --disable-pip-version-check 'setuptools>=61' wheel
"$WORK/build-venv/bin/pip" wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation \
	-w "$WORK/dist" "$WORK/src" > "$WORK/build.log" 2>&1 || { cat "$WORK/build.log"; fail "pip wheel"; }
WHEEL=$(ls "$WORK"/dist/caldera-*.whl)
n=$("$PY" -m zipfile -l "$WHEEL" | grep -cE '^caldera/schemas/.*[.]schema[.]json ' || true)
want=$(find "$ROOT/schemas" -name '*.schema.json' | wc -l)
[ "$n" = "$want" ] || fail "the wheel holds $n schemas, the tree $want"
"$PY" -m zipfile -l "$WHEEL" > "$WORK/wheel.list"
for ex in task-agent/caldera.agent.yaml task-agent/adapter.py inbox-watcher/caldera.agent.yaml inbox-watcher/watcher.py; do
	grep -q "^caldera/examples/$ex " "$WORK/wheel.list" || fail "the wheel has no caldera/examples/$ex"
done
if grep -E '^caldera/examples/.*(__pycache__|/data/)' "$WORK/wheel.list"; then fail "the wheel carries the examples' leftovers (above)"; fi
echo "$(basename "$WHEEL"): $(( $(stat -c %s "$WHEEL") / 1024 )) KiB, $n schemas, the example agents"

step "a fresh venv: pip install the wheel"
"$PY" -m venv "$WORK/venv"
i0=$(date +%s)
"$WORK/venv/bin/pip" install --quiet --disable-pip-version-check "$WHEEL" > "$WORK/install.log" 2>&1 \
	|| { cat "$WORK/install.log"; fail "pip install of the wheel"; }
t_install=$(( $(date +%s) - i0 ))
where=$(venv python -c 'import caldera, pathlib; print(pathlib.Path(caldera.__file__).parent)')
case "$where" in "$WORK/venv/"*) ;; *) fail "caldera imported from $where, not the venv" ;; esac
want_v=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$ROOT/caldera/__init__.py")
[ "$(venv caldera --version)" = "caldera $want_v" ] || fail "caldera --version said '$(venv caldera --version)'"
[ ! -L "$where/schemas" ] && [ -f "$where/schemas/manifest.schema.json" ] || fail "no schema files in $where/schemas"
echo "caldera $want_v from $where (installed in $t_install s)"

step "caldera check on the examples"
for ex in task-agent inbox-watcher; do
	cp -r "$ROOT/examples/$ex" "$WORK/$ex"
	venv caldera check --manifest "$WORK/$ex/caldera.agent.yaml" --state-dir "$WORK/check-$ex" > "$WORK/check.log" 2>&1 \
		|| { cat "$WORK/check.log"; fail "caldera check on examples/$ex"; }
	tail -n 1 "$WORK/check.log" | sed "s/^/$ex: /"
done

step "caldera init + report --once against caldera plane serve on 127.0.0.1"
TOKEN=ci-wheel-$RANDOM$RANDOM
"${VENV[@]}" caldera plane serve --host 127.0.0.1 --port 0 --db "$WORK/plane.db" --bootstrap-token "$TOKEN" \
	--instance-id 7 --url-file "$WORK/plane.url" > "$WORK/plane.log" 2>&1 &
PLANE_PID=$!
for _ in $(seq 100); do [ -s "$WORK/plane.url" ] && break; sleep 0.1; done
[ -s "$WORK/plane.url" ] || { cat "$WORK/plane.log"; fail "the plane did not start"; }
venv caldera init "$WORK/task-agent" --name wheel-agent > /dev/null || fail "caldera init"
printf 'CALDERA_AGENT_ENABLED=true\nCALDERA_BASE_URL=%s\nCALDERA_INSTANCE_ID=7\n' "$(cat "$WORK/plane.url")" >> "$WORK/etc/agents/wheel-agent/agent.env"
printf 'CALDERA_TOKEN=%s\n' "$TOKEN" >> "$WORK/etc/agents/wheel-agent/secrets.env"
id=$(venv caldera plane enqueue --db "$WORK/plane.db" --instance 7 collect_system_info)
venv caldera report --once --agent wheel-agent --deadline 20 > "$WORK/report.log" 2>&1 \
	|| { cat "$WORK/report.log"; fail "caldera report --once"; }
venv caldera plane commands --db "$WORK/plane.db" --instance 7 --json | venv python -c '
import json, sys
rows = json.load(sys.stdin)["commands"]
got = {str(r["id"]): r["status"] for r in rows}
assert got.get(sys.argv[1]) == "succeeded", got
print("command", sys.argv[1], "succeeded (its payload validated against the packaged schema)")' "$id" \
	|| fail "the command did not succeed through report --once"
[ -n "$(venv caldera plane reports --db "$WORK/plane.db" --instance 7 --last --json | tr -d '[]{} \n')" ] \
	|| fail "the plane holds no state report"
kill "$PLANE_PID" && wait "$PLANE_PID" 2>/dev/null || true
PLANE_PID=

step "caldera demo from the wheel, until its agents are online, then Ctrl-C"
d0=$(date +%s)
# Its own process group, as a terminal starts it; SIGINT to the group is Ctrl-C.
"${VENV[@]}" setsid caldera demo > "$WORK/demo.log" 2>&1 &
DEMO_PID=$!
sleep 0.2
[ "$(ps -o pgid= -p "$DEMO_PID" | tr -d ' ')" = "$DEMO_PID" ] || fail "caldera demo is not its own process group's leader"
for _ in $(seq 240); do
	grep -q 'running; press Ctrl-C to stop' "$WORK/demo.log" && break
	kill -0 "$DEMO_PID" 2>/dev/null || break
	sleep 0.5
done
grep -q 'running; press Ctrl-C to stop' "$WORK/demo.log" || { cat "$WORK/demo.log"; fail "caldera demo: not running after 120 s"; }
t_online=$(( $(date +%s) - d0 ))
s0=$(date +%s)
kill -INT -- "-$DEMO_PID"
for _ in $(seq 120); do kill -0 "$DEMO_PID" 2>/dev/null || break; sleep 0.5; done
kill -0 "$DEMO_PID" 2>/dev/null && { cat "$WORK/demo.log"; fail "caldera demo still runs 60 s after Ctrl-C"; }
rc=0
wait "$DEMO_PID" || rc=$?
DEMO_PID=
cat "$WORK/demo.log"
case "$rc" in 0 | 130) ;; *) fail "caldera demo ended $rc after Ctrl-C" ;; esac
grep -q '^stopping…' "$WORK/demo.log" || fail "caldera demo: no 'stopping…' after Ctrl-C"
if grep -q 'Traceback' "$WORK/demo.log"; then fail "caldera demo: a traceback (above)"; fi
grep -q 'succeeded' "$WORK/demo.log" || fail "caldera demo: no command succeeded"
echo "caldera demo: online with its commands finished in $t_online s, stopped $(( $(date +%s) - s0 )) s after Ctrl-C (exit $rc)"

printf '\n== wheel: summary\nwheel           %s\ninstall         %s s (its dependencies from PyPI)\ndemo            %s s to online, then Ctrl-C\ntotal           %s s\n' \
	"$(basename "$WHEEL")" "$t_install" "$t_online" "$(( $(date +%s) - t0 ))"
