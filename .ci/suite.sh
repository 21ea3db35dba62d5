#!/bin/bash
# Debian 13 (trixie) beside the Debian 12 CI host (issue 25; docs/packaging.md,
# "CI on Debian 13"): in a debootstrapped trixie root, run by systemd-nspawn without
# booting it (the host's network, no private network):
#   1. the test suite with Debian 13's own python3 and its packaged requests, urllib3,
#      jsonschema, PyYAML and pytest (apt-get install there; python3-responses, which no test
#      uses since issue 41, stays in the list so that the cached root keeps its key), warnings
#      as errors (setup.cfg);
#   2. lintian from Debian 13 on the .deb and source that .ci/deb.sh built on Debian 12:
#      0 errors, and each warning explained in docs/packaging.md by its tag;
#   3. README's "Try it" as a new user would: `apt-get install make python3-venv`, then
#      `make demo` until its agents are online and its commands finished, Ctrl-C
#      (SIGINT to its process group) and a clean end, then `make test` to completion.
#
# Usage: .ci/suite.sh [DIR]   DIR holds caldera_*.changes and what it names (.deb,
#   .dsc, tarball): .ci/deb.sh's output, default /tmp/caldera-ci-deb. Without one
#   there, steps 1 and 3 run and lintian is skipped with a word.
# Needs root on the Debian 12 host. The root (debootstrap + the packages above +
# lintian) is cached by .ci/root.sh in $CALDERA_CI_CACHE; each run works on a copy.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEBDIR=${1:-/tmp/caldera-ci-deb}
SUITE=trixie
# Debian 13's python3 and caldera's dependencies, the test tools, what tests call
# (ps, ip, groff for the man page); lintian after "--": installed with apt inside.
PACKAGES=(python3 python3-requests python3-urllib3 python3-jsonschema python3-yaml python3-pytest
	python3-responses procps iproute2 groff-base -- lintian)
TEST_PACKAGES=(python3 python3-requests python3-urllib3 python3-jsonschema python3-yaml python3-pytest python3-responses)
DEMO_TIMEOUT=${CALDERA_CI_DEMO_TIMEOUT:-600}   # a cold venv: pip from PyPI first
WORK=
t0=$(date +%s)

step() { printf '\n== trixie: %s (%ds)\n' "$*" "$(( $(date +%s) - t0 ))"; }
fail() { printf 'trixie: FAILED: %s\n' "$*" >&2; exit 1; }
# systemd-nspawn (252), bounded to 30 min, without the one line it prints at every exit on
# a host whose /run is no tmpfs (it declines to clean up its propagation directory; harmless).
nspawn() {
	timeout 1800 systemd-nspawn "$@" 2> >(grep -v '^Attempted to remove disk file system under "/run/systemd/nspawn/propagate/' >&2)
}
# A command in the root, not booted: its own PID namespace (a stub init as PID 1 reaps
# orphans), /proc, /sys, /dev; the host's network; an environment of its own.
run_in() {
	nspawn -q -D "$C" -M caldera-ci-trixie --register=no --keep-unit --as-pid2 --console=pipe --resolv-conf=copy-host \
		-E LANG=C.UTF-8 -E DEBIAN_FRONTEND=noninteractive "$@"
}
cleanup() {
	local rc=$?
	[ -z "$WORK" ] || rm -rf "$WORK"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ "$(id -u)" -eq 0 ] || fail "needs root (debootstrap, systemd-nspawn)"

step "tools"
need=()
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v systemd-nspawn >/dev/null 2>&1 || need+=(systemd-container)
[ -s /usr/share/keyrings/debian-archive-keyring.gpg ] || need+=(debian-archive-keyring)
if [ ${#need[@]} -gt 0 ]; then
	DEBIAN_FRONTEND=noninteractive apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

step "the root (debootstrap $SUITE, cached)"
# shellcheck source=.ci/root.sh
. "$ROOT/.ci/root.sh"
b0=$(date +%s)
BASE=$(base_root "$SUITE" "${PACKAGES[@]}") || fail "debootstrap $SUITE"
t_base=$(( $(date +%s) - b0 ))
WORK=$(mktemp -d /var/tmp/caldera-ci-trixie.XXXXXX)
C=$WORK/root
cp -a --reflink=auto "$BASE" "$C"
rm -f "$C/.complete" "$C/.used"
codename=$(. "$C/etc/os-release" && echo "${VERSION_CODENAME:-}")
[ "$codename" = "$SUITE" ] || fail "the root is '$codename', not $SUITE"
echo "$(. "$C/etc/os-release" && echo "$PRETTY_NAME") in $C (base ready in $t_base s)"

step "apt-get install ${TEST_PACKAGES[*]}"
# Present in the cached root already (apt says so, offline); otherwise fetched.
if ! run_in apt-get install -y -q --no-install-recommends "${TEST_PACKAGES[@]}" > "$WORK/apt.log" 2>&1; then
	run_in sh -c 'apt-get update -q && apt-get install -y -q --no-install-recommends "$@"' sh "${TEST_PACKAGES[@]}" \
		> "$WORK/apt.log" 2>&1 || { cat "$WORK/apt.log"; fail "apt-get install"; }
fi
run_in dpkg-query -W -f '${Package} ${Version}\n' "${TEST_PACKAGES[@]}" python3-urllib3 | sed 's/^/  /'
run_in python3 --version

step "the test suite with Debian 13's python3 and packages (warnings are errors)"
# The checkout as a clean clone has it: no version control, venvs, caches or outputs.
mkdir -p "$C/src/caldera"
tar -C "$ROOT" --exclude=./.git --exclude='./.venv*' --exclude=./dist --exclude=./build \
	--exclude='*.egg-info' --exclude=__pycache__ --exclude=.pytest_cache --exclude=.caldera-state \
	-cf - . | tar -C "$C/src/caldera" -xf -
s0=$(date +%s)
# The checkout itself, not installed: PYTHONPATH lets the tests' subprocesses
# (`python3 -m caldera.cli …`) import it too. None of the host's CALDERA_* switches: the
# real Codex and chromium are the host runs' business (not in this root; those tests skip).
if ! nspawn -q -D "$C" -M caldera-ci-trixie --register=no --keep-unit --as-pid2 --console=pipe --chdir=/src/caldera \
	-E LANG=C.UTF-8 -E PYTHONPATH=/src/caldera \
	python3 -m pytest -q -ra -p no:cacheprovider tests 2>&1 | tee "$WORK/pytest.log"; then
	fail "the test suite in the $SUITE root (above)"
fi
grep -qE '^[0-9]+ passed' "$WORK/pytest.log" || tail -n 1 "$WORK/pytest.log" | grep -qE '[0-9]+ passed' \
	|| fail "pytest reported no passed test"
t_suite=$(( $(date +%s) - s0 ))

step "lintian from Debian 13"
CHANGES=$(ls "$DEBDIR"/caldera_*.changes 2>/dev/null | head -n 1 || true)
if [ -z "$CHANGES" ]; then
	echo "no caldera_*.changes in $DEBDIR: lintian skipped (run .ci/deb.sh first)"
	lintian_summary=skipped
else
	# As a user ("running with root privileges is not recommended"), on a copy it can read.
	mkdir -p "$C/srv/deb"
	cp "$DEBDIR"/caldera_* "$C/srv/deb/"
	chmod -R a+rX "$C/srv/deb"
	run_in --user=nobody -E HOME=/tmp --chdir=/srv/deb \
		sh -c 'lintian --version; lintian --info --display-level ">=pedantic" --tag-display-limit 0 caldera_*.changes' \
		> "$WORK/lintian" 2>&1 || true
	cat "$WORK/lintian"
	errors=$(grep -c '^E: ' "$WORK/lintian" || true)
	warnings=$(grep -c '^W: ' "$WORK/lintian" || true)
	grep -qi '^lintian v\?[0-9]' "$WORK/lintian" || fail "lintian did not run (above)"
	[ "$errors" -eq 0 ] || fail "lintian (Debian 13): $errors error(s)"
	for tag in $(grep '^W: ' "$WORK/lintian" | awk '{print $3}' | sort -u); do
		grep -qF "\`$tag\`" "$ROOT/docs/packaging.md" || fail "lintian (Debian 13) warning $tag is not explained in docs/packaging.md"
	done
	lintian_summary="$(head -n 1 "$WORK/lintian"): $errors errors, $warnings warnings"
	echo "$lintian_summary"
fi

step "README: apt-get install make python3-venv"
r0=$(date +%s)
# pip in the root reaches PyPI the way the host does: the CAs this machine added to its
# own trust store (/usr/local/share/ca-certificates, e.g. a TLS-inspecting egress) are
# added to the root's (Debian's pip reads the system store). None on a plain machine.
if [ -n "$(find /usr/local/share/ca-certificates -name '*.crt' 2>/dev/null | head -n 1)" ]; then
	mkdir -p "$C/usr/local/share/ca-certificates"
	cp -a /usr/local/share/ca-certificates/. "$C/usr/local/share/ca-certificates/"
	run_in update-ca-certificates > "$WORK/ca.log" 2>&1 || { cat "$WORK/ca.log"; fail "update-ca-certificates in the root"; }
	echo "the host's local CAs added: $(cd /usr/local/share/ca-certificates && find . -name '*.crt' | tr '\n' ' ')"
fi
run_in sh -c 'apt-get update -q && apt-get install -y -q make python3-venv' > "$WORK/apt.log" 2>&1 \
	|| { cat "$WORK/apt.log"; fail "apt-get install make python3-venv"; }
tail -n 3 "$WORK/apt.log"
# A new user with a checkout in their home (0700: login.defs' HOME_MODE on Debian 13;
# minbase has useradd, not adduser).
run_in useradd -m -s /bin/bash dev
mkdir -p "$C/home/dev/caldera"
cp -a "$C/src/caldera/." "$C/home/dev/caldera/"
run_in chown -R dev:dev /home/dev/caldera

step "README: make demo, then Ctrl-C"
# As at a terminal: make in a process group of its own; Ctrl-C is SIGINT to that group.
cat > "$C/home/dev/demo.sh" <<EOF
#!/bin/bash
cd ~/caldera
setsid make demo > ~/demo.log 2>&1 &
pid=\$!
for _ in \$(seq $(( DEMO_TIMEOUT * 2 ))); do
	grep -q 'running; press Ctrl-C to stop' ~/demo.log && break
	kill -0 \$pid 2>/dev/null || break
	sleep 0.5
done
if ! grep -q 'running; press Ctrl-C to stop' ~/demo.log; then
	echo "demo: not running after $DEMO_TIMEOUT s" > ~/demo.result
	kill -KILL -- -\$pid 2>/dev/null
	exit 1
fi
url=\$(sed -n 's/^status page: //p' ~/demo.log | tail -n 1)
python3 -c 'import sys, urllib.request; r = urllib.request.urlopen(sys.argv[1], timeout=10); sys.exit(r.status != 200)' "\$url" \
	|| { echo "demo: its plane's status page \$url did not answer 200" > ~/demo.result; kill -KILL -- -\$pid; exit 1; }
s0=\$(date +%s%N)
kill -INT -- -\$pid
for _ in \$(seq 120); do kill -0 \$pid 2>/dev/null || break; sleep 0.5; done
if kill -0 \$pid 2>/dev/null; then
	echo "demo: still running 60 s after Ctrl-C" > ~/demo.result
	kill -KILL -- -\$pid
	exit 1
fi
wait \$pid; rc=\$?
left=\$(pgrep -u dev -a -f 'caldera|inbox|task-agent' | grep -v pgrep || true)
printf 'rc=%s stop=%s left=%s\n' "\$rc" "\$(awk -v a="\$s0" -v b="\$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')" "\$left" > ~/demo.result
EOF
chmod 0755 "$C/home/dev/demo.sh"
d0=$(date +%s)
run_in --user=dev --chdir=/home/dev /home/dev/demo.sh || true
cat "$C/home/dev/demo.log"
result=$(cat "$C/home/dev/demo.result" 2>/dev/null || echo "demo: no result")
echo "$result"
case "$result" in rc=*) ;; *) fail "make demo: $result" ;; esac
# make itself dies of the SIGINT, as at a terminal (130); caldera demo must have said it
# stopped, printed no traceback and left no process behind.
grep -q '^stopping…' "$C/home/dev/demo.log" || fail "make demo: no 'stopping…' after Ctrl-C"
if grep -q 'Traceback' "$C/home/dev/demo.log"; then fail "make demo: a traceback (above)"; fi
case "$result" in *"left=") ;; *) fail "make demo: processes left after Ctrl-C: ${result#*left=}" ;; esac
# 0, or 130 when make dies of the SIGINT itself; anything else is an error make reported.
case "$result" in "rc=0 "* | "rc=130 "*) ;; *) fail "make demo ended ${result%% *} after Ctrl-C" ;; esac
grep -qE 'succeeded' "$C/home/dev/demo.log" || fail "make demo: no command succeeded"
t_demo=$(( $(date +%s) - d0 ))

step "README: make test"
m0=$(date +%s)
if ! nspawn -q -D "$C" -M caldera-ci-trixie --register=no --keep-unit --as-pid2 --console=pipe --resolv-conf=copy-host \
	--user=dev --chdir=/home/dev/caldera -E LANG=C.UTF-8 make test 2>&1 | tee "$WORK/make-test.log"; then
	fail "make test in the $SUITE root (above)"
fi
t_make_test=$(( $(date +%s) - m0 ))
t_readme=$(( $(date +%s) - r0 ))

printf '\n== trixie: summary\n'
printf 'root             %s s (base; cached when 0-2)\n' "$t_base"
printf 'python3 suite    %s s: %s\n' "$t_suite" "$(grep -E '[0-9]+ passed' "$WORK/pytest.log" | tail -n 1)"
printf 'lintian          %s\n' "$lintian_summary"
printf 'make demo        %s s to Ctrl-C and a clean stop (%s)\n' "$t_demo" "$result"
printf 'make test        %s s: %s\n' "$t_make_test" "$(grep -E '[0-9]+ passed' "$WORK/make-test.log" | tail -n 1)"
printf 'README in all    %s s (apt-get, demo, test)\n' "$t_readme"
printf 'total            %s s\n' "$(( $(date +%s) - t0 ))"
