# Sourced by the CI scripts that boot a Debian root under systemd (.ci/systemd.sh,
# .ci/upgrade.sh): the helpers they share, the boot of a copy of the cached base root and
# the README's admin. The caller sets ROOT, SUITE, CI_NAME (its name in every line), t0,
# AGENT (the unit whose journal a failure prints), NSPAWN_PID= CPID= WORK=, and traps
# cleanup on EXIT. docs/packaging.md, "CI under systemd".

# The base root's packages: systemd as PID 1, sudo for the admin, and caldera's own Debian
# dependencies (so that a cached run installs the .deb without touching the network).
# One list, so that every script boots the same cached root (.ci/root.sh keys on it).
BOOT_PACKAGES=(systemd systemd-sysv dbus sudo adduser python3 python3-requests python3-jsonschema python3-yaml bubblewrap socat ripgrep)

step() { printf '\n== %s %s: %s (%ds)\n' "$CI_NAME" "$SUITE" "$*" "$(( $(date +%s) - t0 ))"; }
fail() {
	printf '%s %s: FAILED: %s\n' "$CI_NAME" "$SUITE" "$*" >&2
	if [ -n "$CPID" ]; then
		local unit
		# FAIL_UNITS: the units whose journals a failure prints (default: the agent's)
		for unit in ${FAIL_UNITS:-caldera@$AGENT}; do
			echo "--- journal of $unit (last 60 lines)" >&2
			inside journalctl -u "$unit" --no-pager -n 60 -o short-precise >&2 || true
		done
	fi
	exit 1
}
# A command inside the container: every namespace of its PID 1, a clean environment.
inside() { nsenter -t "$CPID" -a env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 HOME=/root "$@"; }
as_admin() { inside runuser -l admin -c "$1"; }
plane() { inside caldera plane "$@" --db /var/lib/ci-plane/plane.db; }
unit_prop() { inside systemctl show -P "$1" "caldera@$AGENT"; }
# wait_until SECONDS WHAT COMMAND...: poll every 0.5 s; the elapsed seconds on stdout.
wait_until() {
	local limit=$1 what=$2 start now
	shift 2
	start=$(date +%s%N)
	while :; do
		if "$@" >/dev/null 2>&1; then
			now=$(date +%s%N)
			awk -v a="$start" -v b="$now" 'BEGIN { printf "%.1f\n", (b - a) / 1e9 }'
			return 0
		fi
		now=$(date +%s%N)
		[ $(( (now - start) / 1000000000 )) -lt "$limit" ] || fail "$what: not within $limit s"
		sleep 0.5
	done
}

shutdown_container() {
	[ -n "$NSPAWN_PID" ] || return 0
	if kill -0 "$NSPAWN_PID" 2>/dev/null; then
		# With -b, SIGTERM to systemd-nspawn becomes a clean poweroff of the container
		# (its --kill-signal, SIGRTMIN+3 to the container's systemd).
		kill -TERM "$NSPAWN_PID" 2>/dev/null || true
		for _ in $(seq 60); do kill -0 "$NSPAWN_PID" 2>/dev/null || break; sleep 0.5; done
		if kill -0 "$NSPAWN_PID" 2>/dev/null; then
			echo "systemd: the container did not power off within 30 s; killing it" >&2
			# PID 1 of the container first: its death ends every process of its
			# namespace (killing only nspawn would orphan a running container).
			[ -z "$CPID" ] || kill -KILL "$CPID" 2>/dev/null || true
			kill -KILL "$NSPAWN_PID" 2>/dev/null || true
		fi
	fi
	wait "$NSPAWN_PID" 2>/dev/null || true
	NSPAWN_PID=
	CPID=
}
cleanup() {
	local rc=$?
	shutdown_container
	[ -z "$WORK" ] || rm -rf "$WORK"
	exit "$rc"
}

# the_deb [DEB | DIR]: the path of the .deb to test (DIR: its one caldera_*_all.deb); without
# one, a .deb built now (packaging/build-deb.sh, tests skipped: .ci/deb.sh runs them).
the_deb() {
	local deb=${1:-}
	if [ -d "$deb" ]; then
		deb=$(ls "$deb"/caldera_*_all.deb | head -n 1)
	fi
	if [ -z "$deb" ]; then
		mkdir -p "/tmp/caldera-ci-$CI_NAME-deb"
		deb=$(DEB_BUILD_OPTIONS=nocheck "$ROOT/packaging/build-deb.sh" "/tmp/caldera-ci-$CI_NAME-deb" | tail -n 1)
	fi
	[ -f "$deb" ] || fail "no .deb at '$deb'"
	printf '%s\n' "$deb"
}

# The tools the host needs: debootstrap, systemd-nspawn, nsenter.
ci_tools() {
	need=()
	command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
	command -v systemd-nspawn >/dev/null 2>&1 || need+=(systemd-container)
	command -v nsenter >/dev/null 2>&1 || need+=(util-linux)
	if [ ${#need[@]} -gt 0 ]; then
		DEBIAN_FRONTEND=noninteractive apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
	fi
	echo "$(systemd-nspawn --version | head -n 1), debootstrap $(dpkg-query -W -f '${Version}' debootstrap)"

}

# boot_container BASE: a copy of BASE in $WORK/root ($C), booted; sets NSPAWN_PID, CPID, os_release.
boot_container() {
	local base=$1 b0 state codename
	WORK=$(mktemp -d "/var/tmp/caldera-ci-$CI_NAME-$SUITE.XXXXXX")
	C=$WORK/root
	cp -a --reflink=auto "$base" "$C"
	rm -f "$C/.complete"
	echo caldera-ci > "$C/etc/hostname"
	printf '127.0.0.1\tlocalhost\n127.0.1.1\tcaldera-ci\n::1\tlocalhost ip6-localhost\n' > "$C/etc/hosts"
	b0=$(date +%s)
	systemd-nspawn -D "$C" -M caldera-ci -b --register=no --keep-unit --console=passive \
		--resolv-conf=copy-host > "$WORK/console.log" 2>&1 &
	NSPAWN_PID=$!
	# Its PID 1: the child of systemd-nspawn that has become systemd (at first
	# that child is still nspawn's own helper).
	for _ in $(seq 300); do
		CPID=$(ps -o pid=,comm= --ppid "$NSPAWN_PID" 2>/dev/null | awk '$2 == "systemd" { print $1; exit }' || true)
		[ -n "$CPID" ] && break
		kill -0 "$NSPAWN_PID" 2>/dev/null || break
		sleep 0.1
	done
	[ -n "$CPID" ] || { cat "$WORK/console.log"; fail "no PID 1 under systemd-nspawn"; }
	# systemctl answers once PID 1 has its private bus up; then wait for the boot.
	state=
	for _ in $(seq 120); do
		state=$(inside systemctl is-system-running --wait 2>/dev/null || true)
		[ -n "$state" ] && break
		sleep 0.25
	done
	[ "$state" = running ] || { inside systemctl --failed --no-pager || true; fail "system state '$state' (want running)"; }
	echo "PID 1 is host pid $CPID; system running after $(( $(date +%s) - b0 )) s"
	codename=$(. "$C/etc/os-release" && echo "${VERSION_CODENAME:-}")
	[ "$codename" = "$SUITE" ] || fail "the root is '$codename', not $SUITE"
	os_release="$(. "$C/etc/os-release" && echo "$PRETTY_NAME"), $(inside systemctl --version | head -n 1), $(inside python3 --version)"
	echo "$os_release"
}

# ci_editor URL INSTANCE TOKEN: the editor the sudoedit steps run (the admin's EDITOR),
# appending these values to agent.env and secrets.env as an operator would type them.
ci_editor() {
	cat > "$C/usr/local/bin/ci-editor" <<EOF
#!/bin/sh
set -e
for f in "\$@"; do
	case "\$(basename "\$f")" in
		agent*) printf 'CALDERA_AGENT_ENABLED=true\nCALDERA_BASE_URL=%s\nCALDERA_INSTANCE_ID=%s\n' '$1' '$2' >> "\$f" ;;
		secrets*) printf 'CALDERA_TOKEN=%s\n' '$3' >> "\$f" ;;
		*) echo "ci-editor: what is \$f?" >&2; exit 1 ;;
	esac
done
EOF
	chmod 0755 "$C/usr/local/bin/ci-editor"
}

# make_admin URL INSTANCE TOKEN: the admin with sudo, and the editor sudoedit runs, which
# fills agent.env and secrets.env with these values as an operator would type them.
make_admin() {
	local URL=$1 INSTANCE=$2 TOKEN=$3
# As Debian's installer makes the first user: adduser, so the home is 0700 (adduser's
# DIR_MODE on 12 and 13; the README's .deb sits there, out of reach of apt's _apt user).
inside adduser --quiet --disabled-password --comment '' --shell /bin/bash admin
inside adduser --quiet admin sudo
[ "$(inside stat -c %a /home/admin)" = 700 ] || fail "the admin's home is $(inside stat -c %a /home/admin), want adduser's 0700"
printf 'admin ALL=(ALL:ALL) NOPASSWD: ALL\n' > "$C/etc/sudoers.d/ci-admin"
chmod 0440 "$C/etc/sudoers.d/ci-admin"
# sudoedit copies the file to /var/tmp/<base>XXXXXXXX.env and runs the editor
# as the admin; this editor sets the values as an operator would type them.
ci_editor "$URL" "$INSTANCE" "$TOKEN"
printf 'export EDITOR=/usr/local/bin/ci-editor\n' >> "$C/home/admin/.profile"
inside chown -R admin:admin /home/admin
}

# readme_install: README.md's "Install on a host" block, as the admin; sets r0 (its start) and t_readme.
readme_install() {
	# r0 (its start) stays set: the caller measures from it
	# The first ```sh block after the heading, exactly as README.md has it now.
	awk '/^## Install on a host/ { sect = 1; next }
		sect && /^## / { exit }
		sect && !inblock && /^```sh/ { inblock = 1; next }
		inblock && /^```/ { exit }
		inblock { print }' "$ROOT/README.md" > "$C/home/admin/install.sh"
	[ -s "$C/home/admin/install.sh" ] || fail "README.md has no sh block under \"## Install on a host\""
	sed 's/^/  | /' "$C/home/admin/install.sh"
	grep -q "init .*--name $AGENT" "$C/home/admin/install.sh" || fail "the README block does not install an agent named $AGENT"
	grep -q "caldera status --agent $AGENT" "$C/home/admin/install.sh" || fail "the README block has no 'caldera status --agent $AGENT' line"
	r0=$(date +%s%N)
	# Each line as written, in the admin's login shell, stopping at the first failing one.
	as_admin 'bash -e -x ./install.sh' > "$WORK/readme.log" 2>&1 || { cat "$WORK/readme.log"; fail "the README block failed (above)"; }
	cat "$WORK/readme.log"
	t_readme=$(awk -v a="$r0" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')

}
