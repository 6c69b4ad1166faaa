# Shared by the device scripts (bench/*_device.sh): source it after `cd` to the repository root.
# unpack BIN: a .gz binary is unpacked into a temporary folder (the path is printed); a plain
#   binary is printed as it is.
# t SECONDS CMD...: CMD under `timeout` (a deadlocked kernel must not eat the device lease).
# compare_outputs A B LABEL [--rel-tol X]: bench/compare_outputs.py under a minute's timeout.
unpack() {
  case "$1" in
    *.gz) local d; d=$(mktemp -d); gunzip -c "$1" >"$d/foxc" && chmod +x "$d/foxc" && echo "$d/foxc" ;;
    *) echo "$1" ;;
  esac
}
t() { local s=$1; shift; timeout "$s" "$@"; }
compare_outputs() { t 60 python3 bench/compare_outputs.py "$@"; }
# log_to FILE: the script's lines also go to $OUT/FILE as they come ($OUT, /tmp/out unless set,
#   is made), so a call cut off by its limit still returns them.
log_to() {
  OUT=${OUT:-/tmp/out}
  mkdir -p "$OUT"
  exec > >(tee -a "$OUT/$1") 2>&1
}
# check_cuda BIN run|grad FILE SHAPE [FLAGS...]: `BIN run|grad FILE --backend cuda --check --shape
#   SHAPE FLAGS` under 120 s (FILE a path ending in .attn, or an example's name), summarised on one
#   line; returns its exit status.
check_cuda() {
  local bin=$1 what=$2 file=$3 shape=$4 out rc
  shift 4
  case "$file" in *.attn) ;; *) file="examples/$file.attn" ;; esac
  out=$(t 120 "$bin" "$what" "$file" --backend cuda --check --shape "$shape" "$@" 2>&1)
  rc=$?
  echo "check $what $file [$shape] ${*:-pruned} rc=$rc $(grep -iE 'check|error|rel' <<<"$out" | tail -6 | tr '\n' ' ' | cut -c1-400)"
  return $rc
}
# sanitize TOOL BIN SHAPE [FLAGS...]: compute-sanitizer TOOL on `BIN run examples/fox.attn` at
#   SHAPE, its log under $OUT, one summary line (and the log's tail on a failure); returns its status.
sanitize() {
  local tool=$1 bin=$2 shape=$3 rc
  shift 3
  local log="$OUT/san_${tool}_${shape//[,=]/_}.log"
  t 100 compute-sanitizer --tool "$tool" --error-exitcode 3 "$bin" run examples/fox.attn --backend cuda \
    --shape "$shape" "$@" >"$log" 2>&1
  rc=$?
  echo "san $tool [$shape] $* rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | head -2 | tr '\n' ' ')"
  [ $rc -eq 0 ] || tail -20 "$log"
  return $rc
}
# bench_rows TAG BIN SHAPE [FLAGS...]: `BIN bench examples/fox.attn` at SHAPE (${ITERS:-50} runs;
#   a pruned and a dense row), CSV rows prefixed with TAG.
bench_rows() {
  local tag=$1 bin=$2 shape=$3
  shift 3
  t 60 "$bin" bench examples/fox.attn --backend cuda --shape "$shape" --seed 0 --iters "${ITERS:-50}" "$@" \
    --format csv 2>&1 | grep -v '^program' | sed "s|^|$tag,|"
}
# bench_interleaved NEW OLD SHAPE ITERS SPEC...: `foxc bench` of each SPEC ("FILE", or "FILE DIMS"
#   with DIMS appended to SHAPE) with both builds, in two rounds (NEW first in the first, OLD
#   first in the second); CSV rows prefixed `round,new|old,`.
bench_interleaved() {
  local new=$1 old=$2 shape=$3 iters=$4 rep order spec f dims tag bin
  shift 4
  for rep in 1 2; do
    order="new old"; [ "$rep" = 2 ] && order="old new"
    for spec in "$@"; do
      read -r f dims <<<"$spec"
      for tag in $order; do
        bin=$new; [ "$tag" = old ] && bin=$old
        t 120 "$bin" bench "$f" --backend cuda --shape "$shape${dims:+,$dims}" --seed 0 --iters "$iters" \
          --format csv 2>&1 | grep -v '^program' | sed "s|^|$rep,$tag,|"
      done
    done
  done
}
# bench_table CSV TAGS...: from bench_rows output, per shape each tag's pruned and dense medians
#   (ms) and pruned - dense (us).
bench_table() {
  python3 - "$@" <<'P'
import csv, sys
path, tags = sys.argv[1], sys.argv[2:]
d = {}
for r in csv.reader(open(path)):
    if len(r) > 7: d[(r[4], r[0], r[5])] = float(r[6])
for s in dict.fromkeys(k[0] for k in d):
    print(s, '  '.join(f"{t}: {d[(s,t,'pruned')]:.4f} / {d[(s,t,'dense')]:.4f} ({1000*(d[(s,t,'pruned')]-d[(s,t,'dense')]):+.1f}us)"
                       for t in tags if (s, t, 'pruned') in d))
P
}

# kernel_durations BIN SHAPE REGEX [FLAGS...]: ncu's gpu__time_duration of every kernel whose
#   name matches REGEX in one `BIN run examples/fox.attn` at SHAPE (ncu serializes the launches),
#   a line "kernel unit value" each; $NCU_FLAGS go to ncu (e.g. "--cache-control none").
kernel_durations() {
  local bin=$1 shape=$2 re=$3
  shift 3
  # shellcheck disable=SC2086  # a word list
  t 120 ncu --clock-control none ${NCU_FLAGS:-} --metrics gpu__time_duration.sum -k "regex:$re" \
    "$bin" run examples/fox.attn --backend cuda --shape "$shape" --seed 0 "$@" 2>&1 |
    grep -E "^\s+foxc_|gpu__time_duration" | paste - - | awk '{print $1, $(NF-1), $NF}'
}
# compare_runs FILE SHAPE BIN_A "FLAGS_A" BIN_B "FLAGS_B" [--rel-tol X]: both binaries run
#   examples/FILE.attn on the same fresh inputs (seed 3) with their flags, then compare_outputs
#   (bitwise unless --rel-tol); returns non-zero when a run or the comparison fails.
compare_runs() {
  local file=$1 shape=$2 bin_a=$3 flags_a=$4 bin_b=$5 flags_b=$6 d rc
  shift 6
  d=$(mktemp -d)
  # shellcheck disable=SC2086  # the flags are word lists
  t 60 "$bin_a" inputs "examples/$file.attn" --shape "$shape" --seed 3 -o "$d/in.safetensors" >/dev/null &&
    t 60 "$bin_a" run "examples/$file.attn" --backend cuda --inputs "$d/in.safetensors" $flags_a \
      -o "$d/a.safetensors" >/dev/null &&
    t 60 "$bin_b" run "examples/$file.attn" --backend cuda --inputs "$d/in.safetensors" $flags_b \
      -o "$d/b.safetensors" >/dev/null
  rc=$?
  if [ $rc -eq 0 ]; then
    compare_outputs "$d/a.safetensors" "$d/b.safetensors" "$file [$shape] ${flags_b:-pruned}" "$@"
    rc=$?
  else
    echo "runs of $file [$shape] failed (rc=$rc)"
  fi
  rm -rf "$d"
  return $rc
}
