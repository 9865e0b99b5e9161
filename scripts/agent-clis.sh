#!/usr/bin/env bash
# Installs the real agent CLIs the end-to-end suite runs (test/e2e agent
# tests), at pinned versions, into a cache outside the repository:
#   ${IOP_AGENT_CLIS:-${XDG_CACHE_HOME:-$HOME/.cache}/iop/agent-clis}/<name>-<version>/
# Each directory holds node_modules/.bin/<command>. An installed version is
# not fetched again. Needs npm (and node >= 20 to run them).
set -euo pipefail

root="${IOP_AGENT_CLIS:-${XDG_CACHE_HOME:-$HOME/.cache}/iop/agent-clis}"
# "package version command" lines; the Go tests read the same file.
mapfile -t clis < <(grep -v '^#' "$(dirname "$0")/../test/agentcli/versions" | grep .)

if ! command -v npm >/dev/null 2>&1; then
	echo "agent-clis: npm not found; the real-CLI tests will skip (apt-get install -y nodejs npm)" >&2
	exit 1
fi

mkdir -p "$root"
for entry in "${clis[@]}"; do
	read -r pkg version cmd <<<"$entry"
	dir="$root/${pkg##*/}-$version"
	if [ -x "$dir/node_modules/.bin/$cmd" ]; then
		echo "agent-clis: $pkg@$version already in $dir"
		continue
	fi
	echo "agent-clis: installing $pkg@$version into $dir"
	tmp="$dir.tmp.$$"
	rm -rf "$tmp"
	mkdir -p "$tmp"
	trap 'rm -rf "$tmp"' EXIT # a failed install leaves nothing behind
	# --ignore-scripts is not used: the CLIs' postinstall picks the native binary.
	npm install --prefix "$tmp" --no-save --no-audit --no-fund --loglevel=error "$pkg@$version" >&2
	rm -rf "$dir"
	mv "$tmp" "$dir"
	trap - EXIT
done
