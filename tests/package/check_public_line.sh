#!/usr/bin/env bash
# The public line as the compiler sees it (docs/api.md). An install puts the public headers under
# include/ddp and the internal ones apart, under include/ddp-internal/ddp. Then: no internal header
# among the public ones, every internal one installed apart, and the umbrella header ddp/ddp.hpp and
# every public header alone preprocess against the public headers only: a public header that
# includes an internal one fails here, the compiler naming the chain of includes.
# Usage: check_public_line.sh BUILD_DIR CXX INTERNAL_LIST TORCH_INCLUDE_DIR...
set -euo pipefail
build="$1"; cxx="$2"; list="$3"; shift 3
# shellcheck source=temp_install.sh
source "$(dirname "$0")/temp_install.sh" "$build"
inc="$tmp/prefix/include"
internal=0
while read -r header; do
  [ -n "$header" ] || continue
  if [ -e "$inc/ddp/$header" ]; then echo "internal ddp/$header is installed among the public headers"; exit 1; fi
  if [ ! -e "$inc/ddp-internal/ddp/$header" ]; then echo "internal ddp/$header is not installed under include/ddp-internal"; exit 1; fi
  internal=$((internal + 1))
done <"$list"
torch=()
# The compiler's own directories stay out: -isystem /usr/include breaks libstdc++'s #include_next.
for dir in "$@"; do
  case "$dir" in /usr/include | /usr/local/include) ;; *) torch+=(-isystem "$dir") ;; esac
done
preprocess() {  # the header, as included
  printf '#include <%s>\n' "$1" >"$tmp/one.cpp"
  if ! "$cxx" -std=gnu++17 -E -I"$inc" "${torch[@]}" "$tmp/one.cpp" -o /dev/null 2>"$tmp/err"; then
    sed "s|$inc/||g; s|$tmp/||g" "$tmp/err" | grep -E "included from|fatal error" | head -12
    echo "$1 reaches a header that is not public"
    exit 1
  fi
}
# The umbrella header with libtorch's headers, as a user's compiler reads it (its includes under
# libtorch's macros taken as they come).
preprocess ddp/ddp.hpp
# Every public header, without libtorch's headers: a header the compiler cannot find is taken as
# generated (-MG) and listed as it was named, so an internal ddp/ header that a public one reaches
# stays in the list as "ddp/...". All of them in one translation unit first: what it reaches is what
# they reach one by one (include guards only stop a second read), and one read of the standard
# headers costs ~0.4 s where 80 cost 33 s of the suite. Only when an internal header is among them
# is each public header read alone, to name the one that reaches it.
reaches_internal() {  # the headers, as included: the ddp/ headers they name that are not public
  printf '#include <%s>\n' "$@" >"$tmp/one.cpp"
  "$cxx" -std=gnu++17 -MM -MG -I"$inc" "$tmp/one.cpp" >"$tmp/deps" 2>"$tmp/err" ||
    { cat "$tmp/err"; echo "$* does not preprocess"; exit 1; }
  tr ' \\' '\n\n' <"$tmp/deps" | grep -E '^ddp/' || true
}
headers=()
while read -r header; do headers+=("${header#"$inc/"}"); done < <(find "$inc/ddp" -name '*.hpp' | sort)
if ! missing=$(reaches_internal "${headers[@]}"); then echo "$missing"; exit 1; fi
if [ -n "$missing" ]; then
  together=$missing
  for name in "${headers[@]}"; do
    if ! missing=$(reaches_internal "$name"); then echo "$missing"; exit 1; fi
    if [ -n "$missing" ]; then
      echo "$name reaches a header that is not public: $missing"
      exit 1
    fi
  done
  echo "the public headers together reach a header that is not public, none of them alone: $together"
  exit 1
fi
public=${#headers[@]}
echo "public line: ddp/ddp.hpp and $public public headers include none of the $internal internal ones"
