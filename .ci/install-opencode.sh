#!/bin/sh
# Install the pinned OpenCode CLI (npm opencode-ai) into CACHE_DIR (idempotent) and print
# the path of the native binary inside the package (the Node launcher bin/opencode only
# execs it; spawning the binary itself keeps the server the leader of its own group).
# --ignore-scripts: the postinstall step only links the binary and may run a second
# `npm install` of its own; the platform package is a plain optional dependency.
# Usage: .ci/install-opencode.sh CACHE_DIR    (stdout: the binary path, nothing else)
set -eu
VERSION="${CALDERA_OPENCODE_VERSION:-1.18.33}"
CACHE="${1:?usage: install-opencode.sh CACHE_DIR}"

case "$(uname -m)" in
  x86_64|amd64) PKG=opencode-linux-x64 ;;
  aarch64|arm64) PKG=opencode-linux-arm64 ;;
  *) echo "install-opencode: unsupported machine $(uname -m)" >&2; exit 1 ;;
esac

BIN="$CACHE/node_modules/$PKG/bin/opencode"
. "$(dirname "$0")/npm-pinned.sh"
if npm_pinned opencode "$CACHE" "opencode-ai@$VERSION" "$BIN" --ignore-scripts; then
  got=$(HOME="$CACHE/.probe-home" XDG_CONFIG_HOME="$CACHE/.probe-home" XDG_DATA_HOME="$CACHE/.probe-home" \
        XDG_CACHE_HOME="$CACHE/.probe-home" XDG_STATE_HOME="$CACHE/.probe-home" \
        OPENCODE_DISABLE_AUTOUPDATE=1 OPENCODE_DISABLE_MODELS_FETCH=1 "$BIN" --version)
  rm -rf "$CACHE/.probe-home"
  [ "$got" = "$VERSION" ] || { echo "install-opencode: $BIN says $got, not $VERSION" >&2; exit 1; }
  echo "opencode $got" >&2
  npm_pinned_done "$CACHE" "opencode-ai@$VERSION"
fi
printf '%s\n' "$BIN"
