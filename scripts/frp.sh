#!/usr/bin/env bash
# Builds frps and frpc (github.com/fatedier/frp, the load tool's comparison
# relay: make bench-compare) from the Go module proxy at a pinned version, in
# a throwaway module outside the repository, into a cache:
#   ${IOP_FRP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/iop/frp-<version>}/{frps,frpc}
# No frp code is vendored and frp is not in iop's go.mod. An existing build is
# not rebuilt. `go install github.com/fatedier/frp/cmd/frps@version` does not
# work (the module's deprecation lookup fails it), hence the temp module.
set -euo pipefail

version="${FRP_VERSION:-v0.61.0}"
dir="${IOP_FRP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/iop/frp-$version}"
go="${GO:-go}"

if [ -x "$dir/frps" ] && [ -x "$dir/frpc" ]; then
	echo "frp: frps and frpc $version already in $dir"
	exit 0
fi
echo "frp: building frps and frpc $version into $dir (first time: downloads and compiles frp, a few minutes)"
mod="$(mktemp -d)"
trap 'rm -rf "$mod"' EXIT # a failed build leaves nothing behind
cd "$mod"
"$go" mod init frpbuild >/dev/null 2>&1
cat >tools.go <<'GO'
//go:build tools

package tools

import (
	_ "github.com/fatedier/frp/cmd/frpc"
	_ "github.com/fatedier/frp/cmd/frps"
)
GO
"$go" mod edit -require "github.com/fatedier/frp@$version"
"$go" mod tidy >&2
mkdir -p "$dir.tmp.$$"
trap 'rm -rf "$mod" "$dir.tmp.$$"' EXIT
CGO_ENABLED=0 GOBIN="$dir.tmp.$$" "$go" install -trimpath github.com/fatedier/frp/cmd/frps github.com/fatedier/frp/cmd/frpc
rm -rf "$dir"
mv "$dir.tmp.$$" "$dir"
echo "frp: $("$dir/frps" --version) installed in $dir"
