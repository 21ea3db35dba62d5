#!/bin/bash
# The packaging part of CI (issue 7; docs/packaging.md): build the .deb from this
# checkout, lintian, systemd-analyze verify + security, install it with apt, run
# the installed caldera with Debian's /usr/bin/python3 and system packages
# (--version, check on the example agent, report --once against an embedded
# plane on 127.0.0.1), purge it and check what is left. Needs root, Debian 12.
#
# Usage: .ci/deb.sh [OUTDIR]      (default /tmp/caldera-ci-deb)
# Ends with a summary: package size, install time, security score.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-/tmp/caldera-ci-deb}
WORK=$(mktemp -d /tmp/caldera-ci.XXXXXX)
chmod 0755 "$WORK"
PLANE_PID=
SYS_PATH=/usr/sbin:/usr/bin:/sbin:/bin
MAX_SCORE=${CALDERA_MAX_EXPOSURE:-4.5}

step() { printf '\n== deb: %s\n' "$*"; }
fail() { printf 'deb: FAILED: %s\n' "$*" >&2; exit 1; }
# Debian's own python3 and packages: no venv, no pyenv, no inherited proxies.
sys_env() { env -i -C / PATH=$SYS_PATH HOME=/root LANG=C.UTF-8 "$@"; }
as_caldera() { runuser -u caldera -- env -i -C / PATH=$SYS_PATH HOME=/var/lib/caldera LANG=C.UTF-8 "$@"; }

cleanup() {
	if [ -n "$PLANE_PID" ] && kill -0 "$PLANE_PID" 2>/dev/null; then
		kill "$PLANE_PID" 2>/dev/null || true
		wait "$PLANE_PID" 2>/dev/null || true
	fi
	rm -rf "$WORK"
}
trap cleanup EXIT

[ "$(id -u)" -eq 0 ] || fail "needs root (apt-get install, runuser)"
t0=$(date +%s)

step "tools"
need=()
command -v lintian >/dev/null 2>&1 || need+=(lintian)
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
command -v dpkg-buildpackage >/dev/null 2>&1 || need+=(dpkg-dev)
command -v groff >/dev/null 2>&1 || need+=(groff-base)
if [ ${#need[@]} -gt 0 ]; then
	DEBIAN_FRONTEND=noninteractive apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
fi
echo "lintian $(lintian --version | awk '{print $2}'), $(systemd-analyze --version | head -n 1)"

step "build"
rm -rf "$OUT"
DEB=$("$ROOT/packaging/build-deb.sh" "$OUT" | tail -n 1)
CHANGES=$(ls "$OUT"/caldera_*.changes | head -n 1)
VERSION=$(dpkg-deb -f "$DEB" Version)
grep -E '[0-9]+ passed' "$OUT/build.log" | tail -n 1 | sed 's/^/tests during the build: /' || true
t_build=$(( $(date +%s) - t0 ))

step "package contents"
dpkg-deb -c "$DEB" | awk '{print $6}' | sed 's|^\./|/|' > "$WORK/contents"
for path in /usr/bin/caldera /usr/lib/systemd/system/caldera@.service /etc/cron.d/caldera \
		/usr/share/man/man1/caldera.1.gz /usr/share/caldera/schemas/ \
		/usr/share/caldera/schemas/manifest.schema.json \
		/usr/share/caldera/schemas/protocol/register.schema.json \
		/usr/lib/python3/dist-packages/caldera/schemas /usr/lib/python3/dist-packages/caldera/examples \
		/usr/share/caldera/examples/task-agent/caldera.agent.yaml \
		/usr/share/doc/caldera/packaging.md.gz /etc/caldera/agents/ /var/lib/caldera/; do
	grep -qxF "$path" "$WORK/contents" || fail "$path is not in the package"
done
# Every Python package of the tree must be in the .deb (setuptools' find:
# skips a directory without __init__.py without a word).
missing=0
while read -r dir; do
	rel=${dir#"$ROOT"/}
	if ! grep -q "^/usr/lib/python3/dist-packages/$rel/" "$WORK/contents"; then
		echo "deb: not packaged: $rel (a directory of .py files; has it an __init__.py?)" >&2
		missing=1
	fi
done < <(find "$ROOT/caldera" -name '*.py' -not -path '*/__pycache__/*' -printf '%h\n' | sort -u)
[ "$missing" -eq 0 ] || fail "Python packages missing from the .deb"
# One copy of the schemas and of the examples: /usr/share/caldera's; the package's names link there.
twice=$(grep -E '^/usr/lib/python3/dist-packages/caldera/(schemas|examples)/' "$WORK/contents" | head -n 3 || true)
[ -z "$twice" ] || fail "the .deb ships package data twice: $twice …"
echo "contents ok: $(wc -l < "$WORK/contents") entries"

step "lintian"
lintian --info --display-level '>=pedantic' --tag-display-limit 0 "$CHANGES" > "$WORK/lintian" 2>&1 || true
cat "$WORK/lintian"
errors=$(grep -c '^E: ' "$WORK/lintian" || true)
warnings=$(grep -c '^W: ' "$WORK/lintian" || true)
[ "$errors" -eq 0 ] || fail "lintian: $errors error(s)"
# Each remaining warning must be explained in docs/packaging.md by its tag.
for tag in $(grep '^W: ' "$WORK/lintian" | awk '{print $3}' | sort -u); do
	grep -qF "\`$tag\`" "$ROOT/docs/packaging.md" || fail "lintian warning $tag is not explained in docs/packaging.md"
done
echo "lintian: $errors errors, $warnings warnings (each explained in docs/packaging.md)"

step "apt-get install ./$(basename "$DEB")"
if dpkg -s caldera >/dev/null 2>&1; then
	echo "an earlier caldera is installed: purging it first"
	DEBIAN_FRONTEND=noninteractive apt-get purge -y -q caldera
fi
cp "$DEB" "$WORK/"
i0=$(date +%s%N)
(cd "$WORK" && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "./$(basename "$DEB")")
t_install=$(awk -v a="$i0" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')

step "user, group and modes"
getent passwd caldera | grep -q ':/var/lib/caldera:/usr/sbin/nologin$' || fail "caldera user: $(getent passwd caldera)"
getent group caldera >/dev/null || fail "no caldera group"
check_mode() {  # PATH OWNER:GROUP MODE
	got=$(stat -c '%U:%G %a' "$1")
	[ "$got" = "$2 $3" ] || fail "$1 is $got, want $2 $3"
	echo "$1 $got"
}
check_mode /etc/caldera root:root 755
check_mode /etc/caldera/agents root:root 755
check_mode /var/lib/caldera caldera:caldera 711  # others reach an agent's status.json by name

step "systemd-analyze verify"
mkdir "$WORK/unit"
cp /usr/lib/systemd/system/caldera@.service "$WORK/unit/"
systemd-analyze verify "$WORK/unit/caldera@.service" > "$WORK/verify" 2>&1 || { cat "$WORK/verify"; fail "systemd-analyze verify exited non-zero"; }
if [ -s "$WORK/verify" ]; then
	cat "$WORK/verify"
	fail "systemd-analyze verify printed warnings"
fi
echo "verify: no warnings"

step "systemd-analyze security --offline=yes"
systemd-analyze security --offline=yes --no-pager "$WORK/unit/caldera@.service" > "$WORK/security" 2>&1 || true
grep -E '✗|Overall' "$WORK/security" || cat "$WORK/security"
SCORE=$(sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p' "$WORK/security")
[ -n "$SCORE" ] || fail "no exposure score in the security output"
awk -v s="$SCORE" -v m="$MAX_SCORE" 'BEGIN { exit !(s <= m) }' || fail "exposure $SCORE is above $MAX_SCORE"

step "the installed caldera, with /usr/bin/python3"
head -n 1 /usr/bin/caldera | grep -qx '#! */usr/bin/python3' || fail "/usr/bin/caldera starts with $(head -n 1 /usr/bin/caldera)"
where=$(sys_env /usr/bin/python3 -c 'import caldera; print(caldera.__file__)')
case "$where" in /usr/lib/python3/dist-packages/caldera/*) ;; *) fail "caldera imported from $where" ;; esac
got=$(sys_env caldera --version)
[ "$got" = "caldera $VERSION" ] || fail "caldera --version said '$got', want 'caldera $VERSION'"
echo "$got (from $where)"
# The schemas the installed caldera reads: its package's own (importlib.resources), which is
# the one copy in /usr/share/caldera; the examples `caldera demo` finds, the same.
schemas=$(sys_env /usr/bin/python3 -c 'from caldera.protocol import schemas; print(schemas.schema_dir())')
[ "$schemas" = /usr/lib/python3/dist-packages/caldera/schemas ] && [ "$(realpath "$schemas")" = /usr/share/caldera/schemas ] \
	&& [ -f "$schemas/manifest.schema.json" ] || fail "the installed caldera reads its schemas from $schemas ($(realpath "$schemas"))"
[ "$(realpath /usr/lib/python3/dist-packages/caldera/examples)" = /usr/share/caldera/examples ] \
	|| fail "the package's examples are not /usr/share/caldera/examples"

step "caldera check --manifest (the example agent, as user caldera)"
EXAMPLE=/usr/share/caldera/examples/task-agent/caldera.agent.yaml
install -d -o caldera -g caldera -m 0700 "$WORK/check-state"
as_caldera caldera check --manifest "$EXAMPLE" --state-dir "$WORK/check-state" || fail "caldera check on $EXAMPLE"

step "caldera init + report --once against caldera plane serve on 127.0.0.1"
TOKEN=ci-boot-$RANDOM$RANDOM
install -d -o caldera -g caldera -m 0700 "$WORK/plane"
# setpriv execs (runuser would stay as the parent): $! is the plane itself.
setpriv --reuid=caldera --regid=caldera --init-groups env -i -C / PATH=$SYS_PATH HOME=/var/lib/caldera \
	LANG=C.UTF-8 caldera plane serve --host 127.0.0.1 --port 0 --db "$WORK/plane/plane.db" \
	--bootstrap-token "$TOKEN" --instance-id 7 --url-file "$WORK/plane/url" > "$WORK/plane.log" 2>&1 &
PLANE_PID=$!
for _ in $(seq 100); do [ -s "$WORK/plane/url" ] && break; sleep 0.1; done
[ -s "$WORK/plane/url" ] || { cat "$WORK/plane.log"; fail "the plane did not start"; }
URL=$(cat "$WORK/plane/url")
echo "plane at $URL"
sys_env caldera init /usr/share/caldera/examples/task-agent --name ci-agent || fail "caldera init"
AGENT=/etc/caldera/agents/ci-agent
printf 'CALDERA_AGENT_ENABLED=true\nCALDERA_BASE_URL=%s\nCALDERA_INSTANCE_ID=7\n' "$URL" >> "$AGENT/agent.env"
( umask 077; printf 'CALDERA_TOKEN=%s\n' "$TOKEN" > "$AGENT/secrets.env" )
chown caldera:caldera "$AGENT/secrets.env"
chgrp caldera "$AGENT/agent.env" && chmod 0640 "$AGENT/agent.env"
as_caldera caldera report --once --agent ci-agent --deadline 20 > "$WORK/report.out" 2>&1 || {
	cat "$WORK/report.out"; fail "caldera report --once exited non-zero"; }
cat "$WORK/report.out"
grep -qF "$TOKEN" "$WORK/report.out" && fail "the bootstrap token appeared in report --once output"
as_caldera caldera plane reports --db "$WORK/plane/plane.db" --instance 7 --last --json > "$WORK/last.json" \
	|| fail "caldera plane reports"
sys_env /usr/bin/python3 - "$WORK/last.json" <<'EOF' || fail "the plane holds no state report from the agent"
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc, "empty answer"
print("plane's last report:", ", ".join(sorted(doc))[:200])
EOF
kill "$PLANE_PID"; wait "$PLANE_PID" 2>/dev/null || true; PLANE_PID=

step "apt-get purge -y caldera"
DEBIAN_FRONTEND=noninteractive apt-get purge -y -q caldera
left=$(ps -eo pid=,user=,args= | awk '$2 == "caldera" || $0 ~ /\/usr\/bin\/caldera/' | grep -v awk || true)
[ -z "$left" ] || fail "still running after purge: $left"
for path in /etc/caldera /var/lib/caldera /usr/bin/caldera /usr/lib/systemd/system/caldera@.service \
		/etc/cron.d/caldera /usr/share/caldera /usr/lib/python3/dist-packages/caldera; do
	[ ! -e "$path" ] || fail "$path is left after purge"
done
getent passwd caldera >/dev/null || fail "the caldera user is gone; docs/packaging.md says purge keeps it"
echo "purged: nothing running, trees gone, the caldera user and group kept (as documented)"

size=$(stat -c %s "$DEB")
installed=$(dpkg-deb -f "$DEB" Installed-Size)
printf '\n== deb: summary\n'
printf 'package         %s (%s KiB .deb, Installed-Size %s KiB)\n' "$(basename "$DEB")" "$(( (size + 1023) / 1024 ))" "$installed"
printf 'build           %s s (tests included)\n' "$t_build"
printf 'install time    %s s (apt-get install ./…deb)\n' "$t_install"
printf 'security score  %s (systemd-analyze security --offline=yes; lower is better, max %s)\n' "$SCORE" "$MAX_SCORE"
printf 'lintian         %s errors, %s warnings\n' "$errors" "$warnings"
printf 'total           %s s\n' "$(( $(date +%s) - t0 ))"
