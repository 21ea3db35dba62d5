# Sourced by the CI scripts that need a Debian root (systemd.sh, and the Debian 13
# and container steps): base_root SUITE PACKAGE... prints the path of a debootstrapped
# root of SUITE (minbase + PACKAGE...), built once and cached in $CALDERA_CI_CACHE
# (default /var/cache/caldera-ci), keyed on suite + mirror + package list. The caller
# copies it; the cache is never changed after it is complete. Progress goes to stderr.
# Needs root and debootstrap.

base_root() {
	local suite=$1 cache=${CALDERA_CI_CACHE:-/var/cache/caldera-ci} mirror key base include b0
	shift
	# The mirror apt on this machine already uses for the suite, else Debian's own.
	mirror=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 'Created-By: Packages' 2>/dev/null \
		| awk -v s="$suite" '$2 == s { print $1; exit }')
	mirror=${mirror:-http://deb.debian.org/debian/}
	key=$(printf '%s\n' "$suite" "$mirror" "$@" | sha256sum | cut -c1-12)
	base=$cache/$suite-$key
	mkdir -p "$cache"
	if [ -f "$base/.complete" ]; then
		echo "cached: $base (mirror $mirror)" >&2
	else
		b0=$(date +%s)
		rm -rf "$base" "$base.tmp"
		include=$(IFS=,; echo "$*")
		if ! debootstrap --variant=minbase --include="$include" "$suite" "$base.tmp" "$mirror" \
			> "$cache/debootstrap-$suite.log" 2>&1; then
			tail -n 30 "$cache/debootstrap-$suite.log" >&2
			echo "debootstrap $suite failed" >&2
			return 1
		fi
		# No package caches in the base; every run copies it.
		rm -rf "$base.tmp"/var/cache/apt/archives/*.deb
		mv "$base.tmp" "$base"
		touch "$base/.complete"
		echo "built $base in $(( $(date +%s) - b0 )) s (mirror $mirror; $(du -sh "$base" | cut -f1))" >&2
		# Older roots of this suite under another key are of no use any more.
		find "$cache" -maxdepth 1 -name "$suite-*" ! -name "$suite-$key" -exec rm -rf {} +
	fi
	printf '%s\n' "$base"
}
