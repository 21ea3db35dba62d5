#!/bin/bash
# piuparts, Debian's package tester, on the one .deb (issue 35; /work's piuparts notes,
# docs/packaging.md "piuparts"): install and purge, and the upgrade from 0.1.0 (a local
# repository holding 0.1.0's .deb, .ci/old-deb.sh) to this .deb, then purge.
#
# Usage: .ci/piuparts.sh SUITE [DEB | DIR-with-one-caldera_*.deb]   (SUITE: trixie or bookworm)
# The chroot is a copy of the cached root .ci/systemd.sh and .ci/upgrade.sh boot
# (`piuparts --existing-chroot`: no debootstrap of its own; caldera's dependencies are in it,
# so only piuparts' own `apt-get update` reaches the mirror). Needs root.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SUITE=${1:-}
case "$SUITE" in
	trixie | bookworm) shift ;;
	*) echo "usage: .ci/piuparts.sh trixie|bookworm [DEB | DIR]" >&2; exit 2 ;;
esac
t0=$(date +%s)
fail() { printf 'piuparts %s: FAILED: %s\n' "$SUITE" "$*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || fail "needs root"
command -v piuparts >/dev/null 2>&1 || { DEBIAN_FRONTEND=noninteractive apt-get update -qq \
	&& DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends piuparts debootstrap dpkg-dev >/dev/null; }
NEW=${1:-/tmp/caldera-ci-deb}
[ -d "$NEW" ] && NEW=$(ls "$NEW"/caldera_*_all.deb | head -n 1)
[ -f "$NEW" ] || fail "no .deb at '$NEW'"
OLD=$(bash "$ROOT/.ci/old-deb.sh" 0.1.0) || fail "the 0.1.0 .deb (.ci/old-deb.sh)"
# shellcheck source=.ci/boot.sh
. "$ROOT/.ci/boot.sh"   # BOOT_PACKAGES: the same cached root as the booted runs
# shellcheck source=.ci/root.sh
. "$ROOT/.ci/root.sh"
BASE=$(base_root "$SUITE" "${BOOT_PACKAGES[@]}") || fail "debootstrap $SUITE"
mirror=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 'Created-By: Packages' 2>/dev/null \
	| awk -v s="$SUITE" '$2 == s { print $1; exit }')
mirror=${mirror:-http://deb.debian.org/debian/}

WORK=$(mktemp -d /var/tmp/caldera-piuparts.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
# The local repository piuparts installs 0.1.0 from, before it installs the .deb over it.
mkdir "$WORK/repo"
cp "$OLD" "$WORK/repo/"
(cd "$WORK/repo" && dpkg-scanpackages --multiversion . /dev/null > Packages 2>/dev/null)
args=(--existing-chroot="$BASE" --distribution="$SUITE" --mirror="$mirror"
	--bindmount="$WORK/repo" --extra-repo="deb [trusted=yes] file://$WORK/repo ./"
	--log-level=info)
if [ "$SUITE" = trixie ]; then
	# piuparts 1.1.7 (Debian 12's) against trixie's debconf: the same leftover for Debian's
	# own uuid-runtime in the same set-up; not the package's (docs/packaging.md, "piuparts").
	args+=(--ignore=/var/cache/debconf/tmp.ci/)
fi
p0=$(date +%s)
piuparts "${args[@]}" "$NEW" > "$WORK/piuparts.log" 2>&1 || { cp "$WORK/piuparts.log" "/tmp/caldera-piuparts-$SUITE.log"; tail -n 60 "$WORK/piuparts.log"; fail "piuparts (above; whole log: /tmp/caldera-piuparts-$SUITE.log)"; }
t_run=$(( $(date +%s) - p0 ))
cp "$WORK/piuparts.log" "/tmp/caldera-piuparts-$SUITE.log"
grep -E 'Installation of .* ok|apt-cache knows|PASS' "$WORK/piuparts.log" || true
grep -q "PASS: All tests." "$WORK/piuparts.log" || fail "no 'PASS: All tests.' in piuparts' log"
# The upgrade test runs only when apt knows an earlier caldera (the local repository's 0.1.0).
grep -q "apt-cache knows about the following packages: caldera" "$WORK/piuparts.log" \
	&& grep -q "PASS: Installation, upgrade and purging tests." "$WORK/piuparts.log" \
	|| { tail -n 40 "$WORK/piuparts.log"; fail "piuparts ran no upgrade test from 0.1.0"; }
printf '\n== piuparts %s: PASS (install/purge, upgrade 0.1.0 -> %s) in %s s, %s s in all\n' \
	"$SUITE" "$(dpkg-deb -f "$NEW" Version)" "$t_run" "$(( $(date +%s) - t0 ))"
