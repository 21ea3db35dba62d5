# Sourced by the .ci/install-*.sh scripts: one pinned npm package in its own cache
# directory, installed once (a stamp per version), its native binary checked.
#   npm_pinned NAME CACHE SPEC BIN [npm install options…]
# NAME names the caller in messages; SPEC is package@version; BIN the binary the package
# must hold afterwards. The caller probes the binary's version itself (each says it
# differently) and then calls npm_pinned_done CACHE SPEC. Optional dependencies carry the
# native binaries: never --omit=optional.
npm_pinned_stamp() { printf '%s/.installed-%s\n' "$1" "${2##*@}"; }

npm_pinned() {
  name=$1 cache=$2 spec=$3 bin=$4
  shift 4
  [ -f "$(npm_pinned_stamp "$cache" "$spec")" ] && [ -x "$bin" ] && return 1  # installed already
  mkdir -p "$cache"
  [ -f "$cache/package.json" ] || printf '{"name":"caldera-%s-cache","private":true}\n' "$name" > "$cache/package.json"
  npm install --prefix "$cache" --no-audit --no-fund --no-save --loglevel=error "$@" "$spec" >&2
  [ -x "$bin" ] || { echo "install-$name: $bin missing after npm install" >&2; exit 1; }
}

npm_pinned_done() { : > "$(npm_pinned_stamp "$1" "$2")"; }
