#!/usr/bin/env bash
# Two foxc builds against each other, for refactors that must not change what foxc computes:
#   scripts/compare_builds.sh OLD_FOXC NEW_FOXC
# - CPU: every example and bench program at two shapes, on the same inputs (NEW's `foxc
#   inputs`), output files compared byte for byte;
# - GPU code: `--emit ptx` and `--emit grad-ptx` (when OLD has it) of every example for sm_90a
#   and sm_80 at D = 64 and 128, compared byte for byte with the score regions' name hashes
#   (`_r` and 16 hex digits) masked.
# A program OLD cannot run is listed, not counted. Exit 1 when anything differs.
set -uo pipefail
cd "$(dirname "$0")/.."
old=$1 new=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
same=0 differ=0 skipped=0
# The shape of `f`: the dims it uses, from a superset.
shape_of() {
  local f=$1 all=$2 dims
  dims=$("$new" inputs "$f" --shape "$all" -o /dev/null 2>&1 | sed -n 's/.*its dims are \(.*\))/\1/p' | tr -d ' ')
  [ -z "$dims" ] && { echo "$all"; return; }
  tr ',' '\n' <<<"$all" | grep -E "^($(tr ',' '|' <<<"$dims"))=" | paste -sd,
}
for f in examples/*.attn bench/*.attn; do
  for all in B=2,H=4,T=300,D=64,G=2,N=37,M=300 B=1,H=2,T=1100,D=32,G=1,N=100,M=1100; do
    shape=$(shape_of "$f" "$all")
    "$new" inputs "$f" --shape "$shape" --seed 7 -o "$tmp/in.st" >/dev/null 2>&1 || continue
    if ! "$old" run "$f" --backend cpu --inputs "$tmp/in.st" -o "$tmp/a.st" >/dev/null 2>&1; then
      echo "skip: OLD cannot run $f [$shape]"; skipped=$((skipped + 1)); continue
    fi
    "$new" run "$f" --backend cpu --inputs "$tmp/in.st" -o "$tmp/b.st" >/dev/null 2>&1 || { echo "FAIL: NEW cannot run $f [$shape]"; differ=$((differ + 1)); continue; }
    if cmp -s "$tmp/a.st" "$tmp/b.st"; then same=$((same + 1)); else differ=$((differ + 1)); echo "DIFF cpu $f [$shape]"; fi
  done
done
grad=(ptx); "$old" compile examples/fox.attn --emit grad-ptx --shape D=64 >/dev/null 2>&1 && grad+=(grad-ptx)
for f in examples/*.attn; do
  for emit in "${grad[@]}"; do
    for target in sm_90a sm_80; do
      for d in 64 128; do
        shape="D=$d"; case "$f" in *gqa*) shape="$shape,H=4,G=2";; esac
        if ! "$old" compile "$f" --emit "$emit" --target "$target" --shape "$shape" -o "$tmp/a.ptx" 2>/dev/null; then
          skipped=$((skipped + 1)); continue
        fi
        "$new" compile "$f" --emit "$emit" --target "$target" --shape "$shape" -o "$tmp/b.ptx" 2>/dev/null
        if cmp -s <(sed -E 's/_r[0-9a-f]{16}/_rHASH/g' "$tmp/a.ptx") <(sed -E 's/_r[0-9a-f]{16}/_rHASH/g' "$tmp/b.ptx"); then
          same=$((same + 1))
        else
          differ=$((differ + 1)); echo "DIFF $emit $f $target D=$d"
        fi
      done
    done
  done
done
echo "compare_builds: $same identical, $differ differ, $skipped not comparable (OLD cannot build or run them)"
[ "$differ" -eq 0 ]
