# Sourced by the CI scripts that need a Debian root (systemd.sh, suite.sh):
# base_root SUITE PACKAGE... [-- APT-PACKAGE...] prints the path of a debootstrapped
# root of SUITE (minbase + PACKAGE...; then APT-PACKAGE... installed with apt-get
# inside it, for packages whose maintainer scripts debootstrap's own ordering cannot
# configure, such as lintian's Perl stack), built once and cached in $CALDERA_CI_CACHE
# (default /var/cache/caldera-ci), keyed on suite + mirror + both lists. The caller
# copies it; the cache is never changed after it is complete. Progress goes to stderr.
# Needs root, debootstrap, and systemd-nspawn for APT-PACKAGE.
#
# - Several roots of one suite may be cached side by side (Debian 13 has one
#   booted for systemd and one for the test suite); a root not used for
#   $CALDERA_CI_CACHE_DAYS days (default 14) is removed by the next build.
# - Builds are serialised with flock on $cache/.lock-SUITE-KEY: two CI runs at once never
#   build into the same directory; the second one waits and reuses the result.
# - Signatures: debootstrap checks the suite's Release file against
#   /usr/share/keyrings/debian-archive-keyring.gpg, named explicitly. Debian 12's
#   debian-archive-keyring (2023.3+deb12u2) already holds the Debian 13 (trixie)
#   release and archive keys, so a bookworm host debootstraps trixie verified, with
#   no key fetched from anywhere; a keyring without the suite's key fails loudly.

base_root() {
	local suite=$1 cache=${CALDERA_CI_CACHE:-/var/cache/caldera-ci} mirror key base include b0 lock_fd arg
	local keyring=/usr/share/keyrings/debian-archive-keyring.gpg
	local -a boot=() apt=()
	shift
	for arg in "$@"; do
		if [ "$arg" = -- ] || [ ${#apt[@]} -gt 0 ]; then apt+=("$arg"); else boot+=("$arg"); fi
	done
	[ ${#apt[@]} -eq 0 ] || apt=("${apt[@]:1}")
	# The mirror apt on this machine already uses for the suite, else Debian's own.
	mirror=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 'Created-By: Packages' 2>/dev/null \
		| awk -v s="$suite" '$2 == s { print $1; exit }')
	mirror=${mirror:-http://deb.debian.org/debian/}
	key=$(printf '%s\n' "$suite" "$mirror" "$@" | sha256sum | cut -c1-12)
	base=$cache/$suite-$key
	mkdir -p "$cache"
	exec {lock_fd}>"$cache/.lock-$suite-$key"
	flock "$lock_fd"
	if [ -f "$base/.complete" ]; then
		echo "cached: $base (mirror $mirror)" >&2
	else
		[ -s "$keyring" ] || { echo "no $keyring (apt-get install debian-archive-keyring)" >&2; exec {lock_fd}>&-; return 1; }
		b0=$(date +%s)
		rm -rf "$base" "$base.tmp"
		include=$(IFS=,; echo "${boot[*]}")
		if ! debootstrap --variant=minbase --keyring="$keyring" --include="$include" "$suite" "$base.tmp" "$mirror" \
			> "$cache/debootstrap-$suite.log" 2>&1; then
			tail -n 30 "$cache/debootstrap-$suite.log" >&2
			echo "debootstrap $suite failed (whole log: $cache/debootstrap-$suite.log)" >&2
			exec {lock_fd}>&-
			return 1
		fi
		if [ ${#apt[@]} -gt 0 ] && ! systemd-nspawn -q -D "$base.tmp" --register=no --keep-unit --resolv-conf=copy-host \
			-E DEBIAN_FRONTEND=noninteractive sh -c 'apt-get update -q && apt-get install -y -q --no-install-recommends "$@" && apt-get clean' \
			sh "${apt[@]}" >> "$cache/debootstrap-$suite.log" 2>&1; then
			tail -n 30 "$cache/debootstrap-$suite.log" >&2
			echo "apt-get install ${apt[*]} in the $suite root failed (whole log: $cache/debootstrap-$suite.log)" >&2
			exec {lock_fd}>&-
			return 1
		fi
		# No package caches in the base; every run copies it.
		rm -rf "$base.tmp"/var/cache/apt/archives/*.deb
		printf '%s\n' "$@" > "$base.tmp/.packages"
		mv "$base.tmp" "$base"
		touch "$base/.complete"
		echo "built $base in $(( $(date +%s) - b0 )) s (mirror $mirror; $(du -sh "$base" | cut -f1))" >&2
		# Roots no run has used for a while (an older package list, an old suite) go.
		for old in "$cache"/*/.complete; do
			old=${old%/.complete}
			[ "$old" != "$base" ] || continue
			if [ -z "$(find "$old/.used" "$old/.complete" -mtime -"${CALDERA_CI_CACHE_DAYS:-14}" 2>/dev/null)" ]; then
				echo "removing $old (unused for ${CALDERA_CI_CACHE_DAYS:-14} days)" >&2
				rm -rf "$old"
			fi
		done
	fi
	touch "$base/.used"
	exec {lock_fd}>&-
	printf '%s\n' "$base"
}
