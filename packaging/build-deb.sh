#!/bin/sh
# Build caldera's .deb on Debian 12 (bookworm) from this checkout.
#
# Usage: packaging/build-deb.sh [OUTDIR]     (default OUTDIR: ./dist/deb)
#
# - Installs the build dependencies with apt when they are missing (needs root;
#   runs `apt-get update` first only then). With every dependency present it
#   needs no network at all.
# - Builds in a copy of the tree (the checkout stays clean), source and binary:
#   dpkg-buildpackage -us -uc. The test suite runs during the build
#   (DEB_BUILD_OPTIONS=nocheck skips it).
# - Leaves caldera_VERSION_all.deb, the .changes, .buildinfo, .dsc and source
#   tarball in OUTDIR and prints the .deb's path as its last line.
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-$ROOT/dist/deb}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

log() { printf 'build-deb: %s\n' "$*" >&2; }

apt_install() {
	if [ "$(id -u)" -ne 0 ]; then
		log "missing build dependencies and not root: install them with: apt-get install $*"
		exit 1
	fi
	log "installing with apt: $*"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q >&2
	apt-get install -y -q --no-install-recommends "$@" >&2
}

# dpkg-checkbuilddeps lives in dpkg-dev; a fresh machine may lack it.
command -v dpkg-checkbuilddeps >/dev/null 2>&1 || apt_install dpkg-dev build-essential
if ! dpkg-checkbuilddeps "$ROOT/debian/control" >/dev/null 2>&1; then
	if [ "$(id -u)" -ne 0 ]; then
		dpkg-checkbuilddeps "$ROOT/debian/control" || true
		log "missing build dependencies (above) and not root"
		exit 1
	fi
	log "installing the build dependencies of debian/control"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q >&2
	# apt reads the Build-Depends of a source tree given as a path.
	apt-get build-dep -y -q --no-install-recommends "$ROOT" >&2
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/caldera-deb.XXXXXX")
trap 'rm -rf "$WORK"' EXIT INT TERM
SRC="$WORK/caldera"
mkdir "$SRC"
# The tree without version control, virtualenvs, caches and earlier outputs.
tar -C "$ROOT" \
	--exclude=./.git --exclude='./.venv*' --exclude='./venv*' --exclude=./dist \
	--exclude=./examples/task-agent/data \
	--exclude=./build --exclude=./.pybuild --exclude='*.egg-info' \
	--exclude=__pycache__ --exclude=.pytest_cache --exclude='*.pyc' \
	--exclude=.caldera-state --exclude=./debian/caldera --exclude=./debian/.debhelper \
	--exclude='./debian/*.substvars' --exclude='./debian/*.log' --exclude=./debian/files \
	--exclude=./debian/tmp --exclude=./debian/caldera.1 \
	-cf - . | tar -C "$SRC" -xf -

# The build's test run must not see CI's switches (CALDERA_REQUIRE_CODEX=1 and
# the like would make it want a Codex binary and the network) nor a caller's agent.
for var in $(env | sed -n 's/^\(CALDERA_[A-Za-z0-9_]*\|CLAWMANAGER_[A-Za-z0-9_]*\)=.*/\1/p'); do
	unset "$var"
done

log "building in $SRC"
start=$(date +%s)
# Debian's own tools and python3 only: a pyenv or venv earlier on PATH is not ours.
(cd "$SRC" && env PATH=/usr/sbin:/usr/bin:/sbin:/bin dpkg-buildpackage -us -uc) >"$WORK/build.log" 2>&1 || {
	tail -n 80 "$WORK/build.log" >&2
	cp "$WORK/build.log" "$OUT/build.log"
	log "dpkg-buildpackage failed; the whole log is $OUT/build.log"
	exit 1
}
cp "$WORK/build.log" "$OUT/build.log"
log "built in $(( $(date +%s) - start )) s"

for f in "$WORK"/caldera_*; do
	[ -f "$f" ] && cp "$f" "$OUT/"
done
VERSION=$(cd "$SRC" && dpkg-parsechangelog -S Version)
DEB="$OUT/caldera_${VERSION}_all.deb"
[ -f "$DEB" ] || { log "no .deb was produced"; exit 1; }
printf '%s\n' "$DEB"
