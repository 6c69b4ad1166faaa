#!/usr/bin/env bash
# Feeds foxc the inputs that used to crash it or make its checks lie (issue 26) and more of their
# kind, one line each: case, exit code, wall seconds, first line of what foxc said. foxc may
# refuse (exit 1) or succeed (exit 0); any other exit code, a signal, a timeout (20 s) or a memory
# cap (4 GiB of address space beyond the binary's) fails the script. Run by scripts/test.sh.
#   bench/abuse.sh [FOXC]      (default: target/debug/foxc)
set -uo pipefail
cd "$(dirname "$0")/.."
FOXC="$(realpath "${1:-target/debug/foxc}")"
W="$(mktemp -d)"
trap 'rm -rf "$W"' EXIT
fails=0
open=0
# Cases that still fail and are tracked in an open issue: printed as OPEN, not counted as
# failures, so that CI shows them without going red. Empty when none is left.
KNOWN_OPEN=()

# case NAME EXPECT ARGS...: run `foxc ARGS` under the caps; EXPECT is 0, 1 or `any` (0 or 1).
case_() {
    local name=$1 expect=$2
    shift 2
    local t0 t1 code first
    t0=$(date +%s.%N)
    { (ulimit -v 6000000; exec timeout -s KILL 20 "$FOXC" "$@") >"$W/out" 2>&1; } 2>/dev/null
    code=$?
    t1=$(date +%s.%N)
    # The first error line, else the first line.
    first=$( (grep -m1 -E '^(error|thread|fatal)' "$W/out" || grep -m1 -v '^\s*$' "$W/out") | cut -c1-110)
    local verdict=ok
    if [[ $code -ne 0 && $code -ne 1 ]] || [[ $expect != any && $code -ne $expect ]]; then
        verdict=FAIL
        local k
        for k in "${KNOWN_OPEN[@]}"; do
            [[ $k == "$name" ]] && verdict=OPEN
        done
        if [[ $verdict == OPEN ]]; then open=$((open + 1)); else fails=$((fails + 1)); fi
    fi
    printf '%-4s %-34s exit %3d  %6.2f s  %s\n' "$verdict" "$name" "$code" "$(echo "$t1 - $t0" | bc)" "$first"
}

gen() { python3 - "$@"; }

# ---- programs ----------------------------------------------------------------------------
printf '' >"$W/empty.attn"
printf 'attention' >"$W/truncated.attn"
printf '\xff\xfe\x00garbage' >"$W/binary.attn"
head -c 1100000 /dev/zero | tr '\0' ' ' >"$W/over_1mib.attn"
sed 's|/ sqrt(D)|/ 0|' examples/causal.attn >"$W/div0.attn"
sed 's|/ sqrt(D)|/ 99999999999999999999999999|' examples/causal.attn >"$W/bigint.attn"
sed 's|j, d\]) / sqrt|j - 99999999999999999999, d]) / sqrt|' examples/causal.attn >"$W/bigint_subscript.attn"
printf 'attention r(q: f32[B, H, T, D]) -> f32[B, H, T, D] {\n    return q\n}\n' >"$W/return_param.attn"
gen "$W" <<'EOF'
import sys
w = sys.argv[1]
head = "attention {n}(q: f32[B, H, T, D]) -> f32[B, H, T, D] {{\n"
def write(name, body, ret):
    with open(f"{w}/{name}.attn", "w") as f:
        f.write(head.format(n=name) + body + f"    return {ret}\n}}\n")
# A chain: each statement scales the previous one.
for n in (7000,):
    body = "    x1[b, h, t, d] = q[b, h, t, d] * 1.0001\n" + "".join(
        f"    x{k}[b, h, t, d] = x{k-1}[b, h, t, d] * 1.0001\n" for k in range(2, n + 1))
    write(f"chain{n}", body, f"x{n}")
# A DAG: each statement uses the previous one twice (a tree of 2^n leaves if unshared).
for n in (22, 200):
    body = "    x1[b, h, t, d] = q[b, h, t, d] * 0.5\n" + "".join(
        f"    x{k}[b, h, t, d] = x{k-1}[b, h, t, d] * 0.5 + x{k-1}[b, h, t, d] * 0.25\n"
        for k in range(2, n + 1))
    write(f"dag{n}", body, f"x{n}")
# The same inside an attention's score (the recognizer's score region).
att = "attention {n}(q: f32[B, H, T, D], k: f32[B, H, T, D], v: f32[B, H, T, D]) -> f32[B, H, T, D] {{\n"
tail = ("    p[b, h, i, j] = softmax(j, causal(i, j, s{n}[b, h, i, j]))\n"
        "    out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d])\n    return out\n}}\n")
for name, n, rhs in (("score_dag22", 22, "s{p}[b, h, i, j] * 0.5 + s{p}[b, h, i, j] * 0.25"),
                     ("score_chain2000", 2000, "s{p}[b, h, i, j] * 1.0001")):
    body = "    s1[b, h, i, j] = sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D)\n" + "".join(
        f"    s{k}[b, h, i, j] = " + rhs.format(p=k - 1) + "\n" for k in range(2, n + 1))
    with open(f"{w}/{name}.attn", "w") as f:
        f.write(att.format(n=name) + body + tail.format(n=n))
# Deep nesting inside one expression.
for depth in (90, 100000):
    e = "(" * depth + "q[b, h, t, d]" + ")" * depth
    write(f"nest{depth}", f"    x[b, h, t, d] = {e}\n", "x")
EOF
SMALL=(--shape B=1,H=1,T=8,D=4)
case_ "empty file" 1 check "$W/empty.attn"
case_ "truncated program" 1 check "$W/truncated.attn"
case_ "binary bytes" 1 check "$W/binary.attn"
case_ "source over 1 MiB" 1 check "$W/over_1mib.attn"
case_ "division by constant 0" 1 check "$W/div0.attn"
case_ "huge float literal" any check "$W/bigint.attn"
case_ "huge integer in a subscript" 1 check "$W/bigint_subscript.attn"
case_ "return a parameter (check)" 1 check "$W/return_param.attn"
case_ "return a parameter (run)" 1 run "$W/return_param.attn" "${SMALL[@]}"
for p in chain7000 dag22 dag200 nest90 score_dag22 score_chain2000; do
    case_ "$p check" 0 check "$W/$p.attn"
    case_ "$p compile --emit opt" 0 compile "$W/$p.attn" --emit opt -o "$W/$p.opt"
    case_ "$p run (cpu)" 0 run "$W/$p.attn" "${SMALL[@]}"
done
case_ "nest100000 (past the limit)" 1 check "$W/nest100000.attn"

# ---- shapes, options, targets -------------------------------------------------------------
case_ "T = 0" 1 run examples/fox.attn --shape B=1,H=1,T=0,D=16
case_ "T = 0 (reference)" 1 run examples/fox.attn --backend reference --shape B=1,H=1,T=0,D=16
case_ "inputs of 36 GiB" 1 inputs examples/fox.attn --shape B=1,H=1,T=33554432,D=64 -o "$W/big.safetensors"
case_ "run at 36 GiB" 1 run examples/fox.attn --shape B=1,H=1,T=33554432,D=64
case_ "dims overflowing u64" 1 run examples/fox.attn --shape B=4294967296,H=4294967296,T=4294967296,D=64
case_ "--log-eps -800" 1 run examples/fox.attn "${SMALL[@]}" --log-eps -800
case_ "--log-eps nan" 1 run examples/fox.attn "${SMALL[@]}" --log-eps nan
case_ "--log-eps 0" 1 run examples/fox.attn "${SMALL[@]}" --log-eps 0
case_ "--tiles 0x64" 1 run examples/fox.attn "${SMALL[@]}" --tiles 0x64
case_ "--emit ptx --target cpu" 1 compile examples/fox.attn --emit ptx --target cpu
case_ "--emit clif --target sm_90a" 1 compile examples/fox.attn --emit clif --target sm_90a
case_ "--ws-loads on the cpu" 1 run examples/fox.attn "${SMALL[@]}" --ws-loads tma
case_ "--check-starts on the cpu" 1 run examples/fox.attn "${SMALL[@]}" --check-starts
case_ "cuda without a GPU" any run examples/fox.attn --backend cuda "${SMALL[@]}"
case_ "-o into a missing directory" 1 run examples/fox.attn "${SMALL[@]}" -o "$W/no/such/dir/out.safetensors"

# ---- safetensors --------------------------------------------------------------------------
"$FOXC" inputs examples/fox.attn --shape B=1,H=2,T=64,D=16 -o "$W/good.safetensors" >/dev/null
head -c 100 "$W/good.safetensors" >"$W/truncated.safetensors"
printf '\xff\xff\xff\xff\xff\xff\xff\x7f{' >"$W/huge_header.safetensors"
printf '\x10\x00\x00\x00\x00\x00\x00\x00{"q": 1}        ' >"$W/bad_header.safetensors"
for f in truncated huge_header bad_header; do
    case_ "inputs: $f" 1 run examples/fox.attn --inputs "$W/$f.safetensors"
    case_ "verify output: $f" 1 verify examples/fox.attn --inputs "$W/good.safetensors" --output "$W/$f.safetensors"
done
case_ "inputs of another program" 1 run examples/alibi.attn --inputs "$W/good.safetensors"
case_ "good inputs (control)" 0 run examples/fox.attn --inputs "$W/good.safetensors" --check

echo "abuse: $fails failing case(s), $open known open (issue 26)"
[[ $fails -eq 0 ]]
