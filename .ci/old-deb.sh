#!/bin/bash
# The .deb of an earlier release, built from its commit (issue 35): prints its path.
#
# Usage: .ci/old-deb.sh [VERSION]     (default: the first row of docs/packaging.md's release table)
# The commit is the one docs/packaging.md's "Releases" table names for VERSION (a tag may not
# travel with every clone; the commit is in main's history). Built from `git archive COMMIT`
# with that commit's own packaging/build-deb.sh and DEB_BUILD_OPTIONS=nocheck (its tests ran
# when it was released), once: cached in $CALDERA_CI_CACHE/deb-VERSION-COMMIT/.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${CALDERA_CI_CACHE:-/var/cache/caldera-ci}
# | 0.1.0 | `f583354` | … : version and commit of each released row
row=$(awk -F'|' '/^## Releases/ { t = 1 } t && /^\| [0-9]+\.[0-9]+\.[0-9]+ +\| `[0-9a-f]+`/ { gsub(/[` ]/, "", $2); gsub(/[` ]/, "", $3); print $2, $3 }' \
	"$ROOT/docs/packaging.md" | awk -v v="${1:-}" 'v == "" || $1 == v { print; exit }')
read -r VERSION COMMIT <<< "$row" || true
[ -n "${COMMIT:-}" ] || { echo "old-deb: docs/packaging.md's release table names no commit for '${1:-the first release}'" >&2; exit 1; }
if ! git -C "$ROOT" cat-file -e "$COMMIT^{commit}" 2>/dev/null; then
	# A shallow clone (CI's checkout may be one): fetch the history, or just that commit.
	echo "old-deb: commit $COMMIT ($VERSION) is not in this clone; fetching it" >&2
	git -C "$ROOT" fetch -q --unshallow 2>/dev/null || git -C "$ROOT" fetch -q origin "$COMMIT" 2>/dev/null || true
	git -C "$ROOT" cat-file -e "$COMMIT^{commit}" 2>/dev/null \
		|| { echo "old-deb: commit $COMMIT ($VERSION) is not in this clone's history, and fetching it failed" >&2; exit 1; }
fi
out=$CACHE/deb-$VERSION-$COMMIT
deb=$out/caldera_${VERSION}_all.deb
mkdir -p "$CACHE"
exec {lock}>"$CACHE/.lock-deb-$VERSION"
flock "$lock"
if [ ! -f "$deb" ]; then
	b0=$(date +%s)
	src=$(mktemp -d "${TMPDIR:-/tmp}/caldera-old-src.XXXXXX")
	trap 'rm -rf "$src"' EXIT
	git -C "$ROOT" archive "$COMMIT" | tar -x -C "$src"
	rm -rf "$out.tmp"
	mkdir -p "$out.tmp"
	DEB_BUILD_OPTIONS=nocheck bash "$src/packaging/build-deb.sh" "$out.tmp" > "$CACHE/deb-$VERSION.log" 2>&1 \
		|| { tail -n 30 "$CACHE/deb-$VERSION.log" >&2; echo "old-deb: building $VERSION failed" >&2; exit 1; }
	[ "$(dpkg-deb -f "$out.tmp/caldera_${VERSION}_all.deb" Version)" = "$VERSION" ] \
		|| { echo "old-deb: $COMMIT did not build caldera $VERSION" >&2; exit 1; }
	rm -rf "$out"
	mv "$out.tmp" "$out"
	echo "old-deb: built caldera $VERSION from $COMMIT in $(( $(date +%s) - b0 )) s" >&2
else
	echo "old-deb: cached $deb" >&2
fi
printf '%s\n' "$deb"
