#!/bin/sh
# Install the pinned Codex CLI from npm into CACHE_DIR (idempotent) and print the
# path of the native binary inside the package (SPEC section 10: spawn the native
# binary, not the Node wrapper, which leaves orphans on Node < 22.15).
# Usage: .ci/install-codex.sh CACHE_DIR    (stdout: the binary path, nothing else)
set -eu
VERSION="${CALDERA_CODEX_VERSION:-0.169.0}"
CACHE="${1:?usage: install-codex.sh CACHE_DIR}"

case "$(uname -m)" in
  x86_64|amd64) PKG=codex-linux-x64; TRIPLE=x86_64-unknown-linux-musl ;;
  aarch64|arm64) PKG=codex-linux-arm64; TRIPLE=aarch64-unknown-linux-musl ;;
  *) echo "install-codex: unsupported machine $(uname -m)" >&2; exit 1 ;;
esac

BIN="$CACHE/node_modules/@openai/$PKG/vendor/$TRIPLE/bin/codex"
. "$(dirname "$0")/npm-pinned.sh"
if npm_pinned codex "$CACHE" "@openai/codex@$VERSION" "$BIN"; then
  "$BIN" --version >&2
  npm_pinned_done "$CACHE" "@openai/codex@$VERSION"
fi
printf '%s\n' "$BIN"
