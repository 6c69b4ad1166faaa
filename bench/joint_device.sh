#!/usr/bin/env bash
# Issue 11 item 3, run 17 (docs/GPU_KERNEL.md): two builds of the joint prelude (B, C: the gate
# scan as blocks of the one-kernel threshold, `prelude = joint`) against the build before it
# (OLD: the scan and the threshold as two launches on two lanes), in one call:
#   checks of C (`run --check-starts`, scan segments: T = 24577, 8193, 16384, 4099), C against
#   OLD on the same inputs at 1x16x32768x128 (bitwise), `foxc bench` (100 runs, pruned and
#   dense rows) of OLD, B, C interleaved at one head and the standard shapes, ncu durations of
#   the threshold kernels; last, a table: pruned ms and pruned - dense (us) per build and shape.
# Usage (GPU machine, repository root): OLD=... B=... C=... OUT=$OUT bash bench/joint_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source bench/device_lib.sh
O=$(unpack "${OLD:?}"); B=$(unpack "${B:?}"); C=$(unpack "${C:?}")
for s in B=1,H=1,T=24577,D=64 B=2,H=2,T=8193,D=64 B=1,H=1,T=16384,D=128 B=1,H=2,T=4099,D=64; do check_cuda $C run fox $s --check-starts | cut -c1-100; done
compare_runs fox B=1,H=16,T=32768,D=128 $O "" $C "" | cut -c1-150
for s in B=1,H=1,T=2048,D=128 B=1,H=1,T=4096,D=64 B=1,H=1,T=8192,D=128 B=1,H=1,T=16384,D=128 B=8,H=16,T=4096,D=128 B=4,H=16,T=8192,D=128 B=2,H=16,T=16384,D=128 B=1,H=16,T=32768,D=128 B=1,H=16,T=32768,D=64; do
 for b in old b c; do x=$O; [ $b = b ] && x=$B; [ $b = c ] && x=$C; ITERS=100 bench_rows "$b" $x $s; done; done > $OUT/t.csv
for s in B=1,H=1,T=2048,D=128 B=1,H=1,T=16384,D=128 B=1,H=16,T=32768,D=128; do for b in b c; do x=$B; [ $b = c ] && x=$C; echo "# $b $s $(kernel_durations $x $s threshold | tr '\n' ' ')"; done; done
python3 - <<'P'
import csv,os
d={}
for r in csv.reader(open(os.environ['OUT']+'/t.csv')):
    if len(r)>7: d[(r[4],r[0],r[5])]=float(r[6])
for s in dict.fromkeys(k[0] for k in d):
    print(s, ' '.join(f"{b}: {d[(s,b,'pruned')]:.4f} {1000*(d[(s,b,'pruned')]-d[(s,b,'dense')]):+.1f}us" for b in ['old','b','c']))
P
