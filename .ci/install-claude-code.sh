#!/bin/sh
# Install the pinned Claude Code CLI from npm into CACHE_DIR (idempotent) and print the
# path of the native binary inside the platform package (docs/backends.md: the program
# is a native binary; npm's bin/claude.exe is only linked to it by a postinstall script,
# so the platform package's own `claude` is what is spawned, scripts or not).
# Usage: .ci/install-claude-code.sh CACHE_DIR    (stdout: the binary path, nothing else)
set -eu
VERSION="${CALDERA_CLAUDE_CODE_VERSION:-2.1.332}"
CACHE="${1:?usage: install-claude-code.sh CACHE_DIR}"

case "$(uname -m)" in
  x86_64|amd64) PKG=claude-code-linux-x64 ;;
  aarch64|arm64) PKG=claude-code-linux-arm64 ;;
  *) echo "install-claude-code: unsupported machine $(uname -m)" >&2; exit 1 ;;
esac

BIN="$CACHE/node_modules/@anthropic-ai/$PKG/claude"
. "$(dirname "$0")/npm-pinned.sh"
# --ignore-scripts: the postinstall only links the platform binary over bin/claude.exe
# (and runs on Node >= 22); the binary is spawned from the platform package directly.
if npm_pinned claude-code "$CACHE" "@anthropic-ai/claude-code@$VERSION" "$BIN" --ignore-scripts; then
  "$BIN" --version >&2
  npm_pinned_done "$CACHE" "@anthropic-ai/claude-code@$VERSION"
fi
printf '%s\n' "$BIN"
