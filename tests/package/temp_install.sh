# Sourced by the package checks: installs the build tree "$1" into a temporary prefix, "$tmp/prefix",
# removed when the check exits.
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cmake --install "$1" --prefix "$tmp/prefix" >/dev/null
