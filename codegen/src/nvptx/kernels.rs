//! The small NVPTX kernels around attention: the gate cumsum (a scan per (b, h)), RMSNorm over
//! the last axis, and casts (the threshold kernels are in [`super::threshold`]).
//!
//! Every kernel here is written for correctness and reasonable memory access, not peak speed:
//! together they move a few bytes per element while attention does O(T) work per element.
//! Parameter lists are documented on each `build_*` function; the launch geometry that goes
//! with each kernel lives in [`super::module`].

use super::builder::control::Var;
use super::builder::memory::SharedArray;
use super::builder::{KernelBuilder, ParamTy};
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::values::{FloatValue, FunctionValue, IntValue, PointerValue};
use inkwell::{FloatPredicate, IntPredicate};

use foxc_ir::{DType, GateKind, LOG_F_FLOOR};

pub use super::builder::PTX_KERNEL_CC;
/// Threads per block of the scan (one block per (b, h)).
pub const SCAN_THREADS: u32 = 1024;
/// Consecutive elements each scan thread owns per segment of the row (segments of
/// `SCAN_THREADS * SCAN_ELEMS` = 8192 elements, staged in 33 KB of shared memory).
pub const SCAN_ELEMS: u32 = 8;
/// Threads per block of the elementwise kernels (cast, slope cumsum).
pub const ELEM_THREADS: u32 = 256;
/// Consecutive elements each cast thread converts (one 16-byte f32 vector, 8 bytes of bf16).
pub const CAST_ELEMS: u32 = 4;
/// Threads per block of the row kernels (RMSNorm, threshold): 4 warps, one row per warp at a time.
pub const ROW_THREADS: u32 = 128;

type R<T> = Result<T, String>;
type Kb<'a, 'ctx> = KernelBuilder<'a, 'ctx>;

/// Lane and warp of the thread (`tid & 31`, `tid >> 5`).
pub(super) fn lane_warp<'ctx>(k: &Kb<'_, 'ctx>, tid: IntValue<'ctx>) -> (IntValue<'ctx>, IntValue<'ctx>) {
    (k.andc(tid, 31), k.lshrc(tid, 5))
}

/// What a scan adds per element of its input row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanTerm {
    /// `log f` of a gate input, clamped below at `LOG_F_FLOOR` (`gate_cumsum`).
    Gate(GateKind),
    /// The element itself (a generic `cumsum`): only a `-inf` term counts as `LOG_F_FLOOR`,
    /// as in the interpreter; every finite value is summed as it is.
    Plain,
}

/// The term a scan adds for input element `x` ([`ScanTerm`]).
fn scan_term<'ctx>(k: &Kb<'_, 'ctx>, term: ScanTerm, x: FloatValue<'ctx>) -> FloatValue<'ctx> {
    match term {
        ScanTerm::Gate(kind) => log_gate(k, kind, x),
        ScanTerm::Plain => cumsum_term(k, x),
    }
}

/// A generic `cumsum`'s term for element `x`: `x`, but `LOG_F_FLOOR` for `-inf` (the
/// interpreter's `cumsum_term`); the row scan and the generic loop both add this.
pub(crate) fn cumsum_term<'ctx>(k: &Kb<'_, 'ctx>, x: FloatValue<'ctx>) -> FloatValue<'ctx> {
    let reset = k.fcmp(FloatPredicate::OEQ, x, k.f32(f64::NEG_INFINITY));
    k.select_f(reset, k.f32(LOG_F_FLOOR), x)
}

/// `log f` of one gate input element, clamped below at `LOG_F_FLOOR` (SEMANTICS.md).
fn log_gate<'ctx>(k: &Kb<'_, 'ctx>, kind: GateKind, x: FloatValue<'ctx>) -> FloatValue<'ctx> {
    let lf = match kind {
        GateKind::LogGate => x,
        GateKind::Logits => {
            // logsigmoid(z) = min(z, 0) - log1p(exp(-|z|)), with log1p(u) computed as
            // u * log(w) / (w - 1), w = 1 + u (exact where w rounds to 1), so a gate logit
            // of +20 still yields its -2e-9 instead of 0.
            let a = k.fabs(x);
            let na = k.fmul(a, k.f32(-std::f64::consts::LOG2_E));
            let u = k.ex2(na);
            let w = k.fadd(u, k.f32(1.0));
            let lw = k.fmul(k.lg2(w), k.f32(std::f64::consts::LN_2));
            let wm1 = k.fsub(w, k.f32(1.0));
            let ratio = k.fdiv_full(k.fmul(u, lw), wm1);
            let is_one = k.fcmp(FloatPredicate::OEQ, w, k.f32(1.0));
            let l1p = k.select_f(is_one, u, ratio);
            let mz = k.fmin(x, k.f32(0.0));
            k.fsub(mz, l1p)
        }
        GateKind::Slope => {
            k.fail("slope gates are not scanned");
            x
        }
    };
    k.fmax(lf, k.f32(LOG_F_FLOOR))
}

/// A sum carried as an unevaluated f32 pair `h + l` (`|l| <= ulp(h) / 2`): about 48 bits, so a
/// scan of thousands of `log f` stays within rounding of the exact cumsum however large `|c|`
/// grows (a plain f32 scan drifted by ~40 ulp(|c|) at T = 32768 with bursty gates, 0.08 absolute,
/// in an emulation of this kernel; the pair gave round_f32(c) at every position; SEMANTICS.md,
/// gate_cumsum). f32 adds only: LLVM and ptxas keep them as written (no fast-math, no mul to fuse).
pub(super) type Pair<'ctx> = (FloatValue<'ctx>, FloatValue<'ctx>);

/// `a + b` as `(s, e)` with `s = fl(a + b)` and `e` its exact rounding error (TwoSum).
fn two_sum<'ctx>(k: &Kb<'_, 'ctx>, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> Pair<'ctx> {
    let s = k.fadd(a, b);
    let bb = k.fsub(s, a);
    let e = k.fadd(k.fsub(a, k.fsub(s, bb)), k.fsub(b, bb));
    (s, e)
}

/// `(s, e)` renormalized (`|s| >= |e|`, FastTwoSum).
fn renorm<'ctx>(k: &Kb<'_, 'ctx>, s: FloatValue<'ctx>, e: FloatValue<'ctx>) -> Pair<'ctx> {
    let h = k.fadd(s, e);
    (h, k.fsub(e, k.fsub(h, s)))
}

/// `a + b` of two pairs.
fn pair_add<'ctx>(k: &Kb<'_, 'ctx>, a: Pair<'ctx>, b: Pair<'ctx>) -> Pair<'ctx> {
    let (s, e) = two_sum(k, a.0, b.0);
    renorm(k, s, k.fadd(e, k.fadd(a.1, b.1)))
}

/// `a + x` of a pair and an f32.
fn pair_add1<'ctx>(k: &Kb<'_, 'ctx>, a: Pair<'ctx>, x: FloatValue<'ctx>) -> Pair<'ctx> {
    let (s, e) = two_sum(k, a.0, x);
    renorm(k, s, k.fadd(e, a.1))
}

/// Inclusive scan of pairs over the warp with `shfl.up` (lane l gets the sum of lanes 0..=l).
fn warp_scan_pair<'ctx>(k: &Kb<'_, 'ctx>, lane: IntValue<'ctx>, mut x: Pair<'ctx>) -> Pair<'ctx> {
    for d in [1i64, 2, 4, 8, 16] {
        let y = (k.shfl_up(x.0, d), k.shfl_up(x.1, d));
        let ok = k.icmpc(IntPredicate::SGE, lane, d);
        let s = pair_add(k, x, y);
        x = (k.select_f(ok, s.0, x.0), k.select_f(ok, s.1, x.1));
    }
    x
}

/// How a block scans a row of the gate: `threads` threads owning `elems` consecutive elements
/// each in a segment of `threads * elems`. Rows longer than a segment take several.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ScanShape {
    pub threads: u32,
    pub elems: u32,
}

/// The longest chain of dependent compensated adds in a thread's run (longer runs are split
/// into independent chains; the 8-element runs of the scan kernel are one).
const RUN_CHAIN: i64 = 8;

/// The scan kernel's blocks ([`SCAN_THREADS`] x [`SCAN_ELEMS`]).
pub(super) const SCAN_BLOCK: ScanShape = ScanShape { threads: SCAN_THREADS, elems: SCAN_ELEMS };

/// `gate_cumsum` for `Logits` and `LogGate`: params `(gate: [BH, T], c: f32 [BH, T], T: i32)`.
/// Grid `(BH)` (the (b, h) index is `ctaid.x`), block [`SCAN_THREADS`]; one `scan_gate_row`
/// per block.
pub fn build_gate_scan<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    name: &str,
    kind: GateKind,
    in_dt: DType,
) -> R<FunctionValue<'ctx>> {
    let k =
        Kb::kernel(ctx, module, name, &[("gate", ParamTy::Ptr), ("c", ParamTy::Ptr), ("T", ParamTy::I32)])?;
    let row = GateRow {
        gate: k.param_ptr(0),
        c: k.param_ptr(1),
        t_len: k.param_int(2),
        bh: k.sreg("ctaid.x"),
        reverse: false,
    };
    let scratch = ScanScratch::new(&k, name, SCAN_BLOCK);
    scan_gate_row(&k, scratch, (ScanTerm::Gate(kind), in_dt), SCAN_BLOCK, row, None);
    k.finish()
}

/// Threads per block of the split scan ([`build_gate_segment_sums`],
/// [`build_gate_scan_segments`]): 512, so that a thread may hold up to 128 registers (a scan of
/// one segment from a carry took 72 at 1024 threads, whose cap is 64: the launch was refused,
/// and capped it spilled).
pub const SPLIT_SCAN_THREADS: u32 = 512;
/// The split scan's blocks: 16 consecutive elements a thread, the segment of [`SCAN_BLOCK`].
const SPLIT_SCAN: ScanShape = ScanShape { threads: SPLIT_SCAN_THREADS, elems: 16 };
/// Elements of a row per block of the split scan: 8192, as the whole-row scan's segments.
pub const SCAN_SEGMENT: u32 = SPLIT_SCAN_THREADS * 16;

/// `gate_cumsum` with split rows, the first of two launches: params `(gate: [BH, T], totals: f32
/// [BH, S, 2], T: i32)`, grid `(S, BH)` with `S = ceil(T / SCAN_SEGMENT)`, block
/// [`SPLIT_SCAN_THREADS`]: block `(s, bh)` sums segment `s` of row `bh` into `totals[bh, s]` (a
/// compensated pair: hi, lo). The last segment's block has nothing to do: no segment after it
/// needs its sum (and it may be partial, which [`row_prefix`] does not read).
pub fn build_gate_segment_sums<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    name: &str,
    (term, in_dt): (ScanTerm, DType),
    reverse: bool,
) -> R<FunctionValue<'ctx>> {
    let params = [("gate", ParamTy::Ptr), ("totals", ParamTy::Ptr), ("T", ParamTy::I32)];
    let (k, s, bh, scratch) = split_scan_block(ctx, module, name, &params)?;
    let (gate, totals, t_len) = (k.param_ptr(0), k.param_ptr(1), k.param_int(2));
    let row = GateRow { gate, c: totals, t_len, bh, reverse };
    let last = k.addc(k.sreg("nctaid.x"), -1);
    k.if_then(k.icmp(IntPredicate::SLT, s, last), |k| {
        let (hi, lo) = row_prefix(k, scratch, (term, in_dt), SPLIT_SCAN, row, (s, k.addc(s, 1)));
        k.if_then(k.icmpc(IntPredicate::EQ, k.sreg("tid.x"), 0), |k| {
            let at = k.mulc(k.sext64(k.add(k.mul(bh, k.sreg("nctaid.x")), s)), 2);
            k.store_f(DType::F32, totals, at, hi);
            k.store_f(DType::F32, totals, k.addc(at, 1), lo);
        });
    });
    k.finish()
}

/// `gate_cumsum` with split rows, the second launch: params `(gate: [BH, T], totals: f32
/// [BH, S, 2], c: f32 [BH, T], T: i32)`, the grid and block of [`build_gate_segment_sums`]:
/// block `(s, bh)` adds the totals of the segments before `s` in order (pairs) and scans
/// segment `s` from that carry, as one block would scan the whole row from there.
pub fn build_gate_scan_segments<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    name: &str,
    (term, in_dt): (ScanTerm, DType),
    reverse: bool,
) -> R<FunctionValue<'ctx>> {
    let params = [("gate", ParamTy::Ptr), ("totals", ParamTy::Ptr), ("c", ParamTy::Ptr), ("T", ParamTy::I32)];
    let (k, s, bh, scratch) = split_scan_block(ctx, module, name, &params)?;
    let (gate, totals, c, t_len) = (k.param_ptr(0), k.param_ptr(1), k.param_ptr(2), k.param_int(3));
    let zero = k.f32(0.0);
    let row0 = k.mulc(k.sext64(k.mul(bh, k.sreg("nctaid.x"))), 2);
    let carried = [("u", k.i32(0).into()), ("hi", zero.into()), ("lo", zero.into())];
    let out = k.while_loop(
        ("earlier", "earlier_step", "earlier_done"),
        &carried,
        |k, v| k.icmp(IntPredicate::SLT, v[0].into_int_value(), s),
        |k, v| {
            let u = v[0].into_int_value();
            let at = k.add(row0, k.mulc(k.sext64(u), 2));
            let t = (k.load_f(DType::F32, totals, at), k.load_f(DType::F32, totals, k.addc(at, 1)));
            let sum = pair_add(k, (v[1].into_float_value(), v[2].into_float_value()), t);
            vec![k.addc(u, 1).into(), sum.0.into(), sum.1.into()]
        },
    );
    let carry = (out[1].into_float_value(), out[2].into_float_value());
    let row = GateRow { gate, c, t_len, bh, reverse };
    let part = RowPart { first: s, end: k.addc(s, 1), carry };
    scan_gate_row(&k, scratch, (term, in_dt), SPLIT_SCAN, row, Some(part));
    k.finish()
}

/// A split-scan kernel with `params`: its builder, its block's segment (`ctaid.x`) and row
/// (`ctaid.y`), and the scan's shared memory.
#[allow(clippy::type_complexity)]
fn split_scan_block<'a, 'ctx>(
    ctx: &'ctx Context,
    module: &'a Module<'ctx>,
    name: &str,
    params: &[(&str, ParamTy)],
) -> R<(Kb<'a, 'ctx>, IntValue<'ctx>, IntValue<'ctx>, ScanScratch<'ctx>)> {
    let k = Kb::kernel(ctx, module, name, params)?;
    k.launch_bounds(SPLIT_SCAN_THREADS, 1);
    let (s, bh) = (k.sreg("ctaid.x"), k.sreg("ctaid.y"));
    let scratch = ScanScratch::new(&k, name, SPLIT_SCAN);
    Ok((k, s, bh, scratch))
}

/// One (b, h) row of a gate scan: the gate input, the cumsum `c`, their row length and index.
/// `reverse` walks the row from its end (position `t` of the scan is element `T - 1 - t` of
/// both arrays): the scan is then the suffix sum.
#[derive(Clone, Copy)]
pub(super) struct GateRow<'ctx> {
    pub gate: PointerValue<'ctx>,
    pub c: PointerValue<'ctx>,
    pub t_len: IntValue<'ctx>,
    pub bh: IntValue<'ctx>,
    pub reverse: bool,
}

impl<'ctx> GateRow<'ctx> {
    /// The flat index (i64) of the row's element at scan position `t` (i32).
    fn at(&self, k: &Kb<'_, 'ctx>, t: IntValue<'ctx>) -> IntValue<'ctx> {
        let t = if self.reverse { k.sub(k.addc(self.t_len, -1), t) } else { t };
        k.add(k.mul(k.sext64(self.bh), k.sext64(self.t_len)), k.sext64(t))
    }
}

/// The shared memory of a block's gate scan: the segment's stage and the warps' totals. One
/// kernel's scans of several shapes share one, sized for the largest.
#[derive(Clone, Copy)]
pub(super) struct ScanScratch<'ctx> {
    stage: SharedArray<'ctx>,
    warp_totals: [SharedArray<'ctx>; 2],
}

impl<'ctx> ScanScratch<'ctx> {
    /// The scratch of scans up to `largest` (arrays named after `name`).
    pub fn new(k: &Kb<'_, 'ctx>, name: &str, largest: ScanShape) -> Self {
        let seg = largest.threads * largest.elems;
        let nwarps = largest.threads / 32;
        Self {
            stage: k.shared_f32(&format!("{name}_stage"), stage_words(seg as i64) as u32),
            warp_totals: [
                k.shared_f32(&format!("{name}_warp_totals"), nwarps),
                k.shared_f32(&format!("{name}_warp_totals_lo"), nwarps),
            ],
        }
    }

    fn fits(&self, shape: ScanShape) -> bool {
        stage_words((shape.threads * shape.elems) as i64) <= self.stage.len() as i64
            && shape.threads / 32 <= self.warp_totals[0].len()
    }
}

/// Words of the stage of a `seg`-element segment: element e sits at e + e / 32 (one pad word per
/// 32 makes both the coalesced accesses, e = j * threads + tid, and a thread's own run,
/// e = tid * elems + j, free of bank conflicts).
fn stage_words(seg: i64) -> i64 {
    seg + seg / 32
}

/// The segments of a row one block scans when several blocks share the row: `first..end`
/// (segments of the block's [`ScanShape`]), and the row's sum before `first` ([`row_prefix`]).
#[derive(Clone, Copy)]
pub(super) struct RowPart<'ctx> {
    pub first: IntValue<'ctx>,
    pub end: IntValue<'ctx>,
    pub carry: Pair<'ctx>,
}

/// The whole block scans row `r.bh` of the gate into `c` (block of `shape.threads` threads; the
/// shared arrays in `scratch`, which must fit `shape`), or only the segments of `part`. The row
/// goes through shared memory in segments of `threads * elems` elements: coalesced loads (each
/// warp reads consecutive elements, all `elems` loads of a thread in flight at once) store `log f`
/// in the stage; each thread then scans its own `elems` consecutive elements, the block scans
/// the threads' totals, and the running sums go back through the stage to coalesced stores; a
/// pair carries the row's sum from one segment to the next (from `part`'s carry when given).
/// Every sum is a compensated f32 pair ([`Pair`]), so `c` is within rounding of the exact cumsum
/// whatever the grouping.
pub(super) fn scan_gate_row<'ctx>(
    k: &Kb<'_, 'ctx>,
    scratch: ScanScratch<'ctx>,
    (term, in_dt): (ScanTerm, DType),
    shape: ScanShape,
    r: GateRow<'ctx>,
    part: Option<RowPart<'ctx>>,
) {
    assert!(scratch.fits(shape), "scan scratch smaller than a {shape:?} segment");
    let GateRow { gate, c: out, t_len, .. } = r;
    let carry0 = part.map_or((k.f32(0.0), k.f32(0.0)), |p| p.carry);
    let carry = [k.declare_var(carry0.0.into()), k.declare_var(carry0.1.into())];
    let tid = k.sreg("tid.x");
    let (lane, warp) = lane_warp(k, tid);
    let (nthreads, elems) = (shape.threads as i64, shape.elems as i64);
    let seg = nthreads * elems;
    let stage = scratch.stage;
    let staged = |k: &Kb<'_, 'ctx>, e: IntValue<'ctx>| k.shared_at(stage, k.add(e, k.lshrc(e, 5)));
    let nwarps = shape.threads / 32;
    let sh = scratch.warp_totals;
    let (first, end) = match part {
        Some(p) => (p.first, p.end),
        None => (k.i32(0), k.sdivc(k.addc(t_len, seg - 1), seg)),
    };
    let zero = k.f32(0.0);
    k.for_range(first, end, k.i32(1), |k, s| {
        let seg0 = k.mulc(s, seg);
        // 1. Coalesced loads of the segment (all in flight), log f into the stage; 0 past T.
        // A whole segment's loads are one address plus constant offsets; only the row's last
        // segment clamps each index (per-element addresses would hold two registers per load
        // in flight).
        let element = |j: i64| {
            let e = k.addc(tid, j * nthreads);
            (e, k.icmp(IntPredicate::SLT, k.add(seg0, e), t_len))
        };
        let load_stage = |k: &Kb<'_, 'ctx>, clamp: bool| {
            let loaded: Vec<_> = (0..elems)
                .map(|j| {
                    let (e, inb) = element(j);
                    let t = k.add(seg0, e);
                    let t = if clamp { k.smin(t, k.addc(t_len, -1)) } else { t };
                    (e, inb, k.load_f(in_dt, gate, r.at(k, t)))
                })
                .collect();
            for (e, inb, x) in loaded {
                let lf = scan_term(k, term, x);
                k.store(staged(k, e), if clamp { k.select_f(inb, lf, zero) } else { lf });
            }
        };
        let whole = k.icmp(IntPredicate::SLE, k.addc(seg0, seg), t_len);
        k.if_else(
            whole,
            "stage",
            |k| {
                load_stage(k, false);
                vec![]
            },
            |k| {
                load_stage(k, true);
                vec![]
            },
        );
        k.barrier();
        // 2. This thread's run of consecutive elements: its total, then the block's scan of
        // the totals. The run is summed as independent chains of at most RUN_CHAIN elements
        // (for the joint prelude's 32-element runs; it did not measurably shorten them, run
        // 17), and read from the stage twice, here and for the running sums, rather than held
        // in registers across the block scan.
        let own0 = k.mulc(tid, elems);
        let own = |k: &Kb<'_, 'ctx>, j: i64| k.load_f32(staged(k, k.addc(own0, j)));
        let chains = (elems + RUN_CHAIN - 1) / RUN_CHAIN;
        let part: Vec<Pair<'ctx>> = (0..chains)
            .map(|c| {
                let mut t = (zero, zero);
                for j in (c * RUN_CHAIN)..((c + 1) * RUN_CHAIN).min(elems) {
                    t = pair_add1(k, t, own(k, j));
                }
                t
            })
            .collect();
        let total = part[1..].iter().fold(part[0], |t, &p| pair_add(k, t, p));
        let x = warp_scan_pair(k, lane, total);
        let is_last = k.icmpc(IntPredicate::EQ, lane, 31);
        k.if_then(is_last, |k| {
            k.store(k.shared_at(sh[0], warp), x.0);
            k.store(k.shared_at(sh[1], warp), x.1);
        });
        k.barrier();
        // Warp 0 scans the warps' totals (lanes past the block's warps hold zeros).
        let is_w0 = k.icmpc(IntPredicate::EQ, warp, 0);
        k.if_then(is_w0, |k| {
            // Only lanes of a warp read and write its entry: a lane that read another's would
            // race with that lane's store (no warp barrier orders them).
            let has = k.icmpc(IntPredicate::SLT, lane, nwarps as i64);
            let p = (k.shared_at(sh[0], lane), k.shared_at(sh[1], lane));
            let t = [k.declare_var(zero.into()), k.declare_var(zero.into())];
            k.if_then(has, |k| {
                k.def_var(t[0], k.load_f32(p.0));
                k.def_var(t[1], k.load_f32(p.1));
            });
            let y = warp_scan_pair(k, lane, (k.use_f(t[0]), k.use_f(t[1])));
            k.if_then(has, |k| {
                k.store(p.0, y.0);
                k.store(p.1, y.1);
            });
        });
        k.barrier();
        // Offset of this run: the carry, the inclusive total of earlier warps and the
        // exclusive warp prefix (the previous lane's inclusive sum: no subtraction, which
        // would cancel digits).
        let wprev = k.sub(warp, k.i32(1));
        let has_prev = k.icmpc(IntPredicate::SGT, warp, 0);
        let wprev_c = k.select_i(has_prev, wprev, k.i32(0));
        let prev_tot = (k.load_f32(k.shared_at(sh[0], wprev_c)), k.load_f32(k.shared_at(sh[1], wprev_c)));
        let warp_off = (k.select_f(has_prev, prev_tot.0, zero), k.select_f(has_prev, prev_tot.1, zero));
        let lane_prev = (k.shfl_up(x.0, 1), k.shfl_up(x.1, 1));
        let not_first = k.icmpc(IntPredicate::SGT, lane, 0);
        let excl = (k.select_f(not_first, lane_prev.0, zero), k.select_f(not_first, lane_prev.1, zero));
        let c0 = (k.use_f(carry[0]), k.use_f(carry[1]));
        // Each chain starts from the offset plus the totals of the chains before it.
        let mut start = pair_add(k, c0, pair_add(k, warp_off, excl));
        for (c, &p) in part.iter().enumerate() {
            let mut run = start;
            for j in (c as i64 * RUN_CHAIN)..((c as i64 + 1) * RUN_CHAIN).min(elems) {
                run = pair_add1(k, run, own(k, j));
                k.store(staged(k, k.addc(own0, j)), run.0);
            }
            start = pair_add(k, start, p);
        }
        // The row's sum so far: the carry plus the block's total (the last warp's inclusive).
        let last = k.i32(nwarps as i64 - 1);
        let block_tot = (k.load_f32(k.shared_at(sh[0], last)), k.load_f32(k.shared_at(sh[1], last)));
        let c1 = pair_add(k, c0, block_tot);
        k.def_var(carry[0], c1.0);
        k.def_var(carry[1], c1.1);
        k.barrier();
        // 3. Coalesced stores of the running sums; the barrier keeps the next segment's
        // stage and warp totals from overwriting what is still read here.
        for (e, inb) in (0..elems).map(element) {
            let t = k.add(seg0, e);
            k.if_then(inb, |k| {
                k.store_f(DType::F32, out, r.at(k, t), k.load_f32(staged(k, e)));
            });
        }
        k.barrier();
    });
}

/// The sum of `log f` over segments `first..end` of row `r.bh` (`shape`'s segments, all within
/// the row), for every thread of the block: the carry of a block that scans a later part of the
/// row ([`RowPart`]), or one segment's total ([`build_gate_segment_sums`]). A reduction, not a
/// scan: coalesced loads, `shape.elems` in flight per thread, summed in chains of [`RUN_CHAIN`]
/// compensated adds, then over the warps through `scratch`'s warp totals. The sum's grouping differs from the scan's; both are pairs, within
/// rounding of the exact sum.
pub(super) fn row_prefix<'ctx>(
    k: &Kb<'_, 'ctx>,
    scratch: ScanScratch<'ctx>,
    (term, in_dt): (ScanTerm, DType),
    shape: ScanShape,
    r: GateRow<'ctx>,
    (first, end): (IntValue<'ctx>, IntValue<'ctx>),
) -> Pair<'ctx> {
    assert!(scratch.fits(shape), "scan scratch smaller than a {shape:?} segment");
    let tid = k.sreg("tid.x");
    let (lane, warp) = lane_warp(k, tid);
    let (nthreads, elems) = (shape.threads as i64, shape.elems as i64);
    let zero = k.f32(0.0);
    let chains = (elems + RUN_CHAIN - 1) / RUN_CHAIN;
    let acc: Vec<[Var<'ctx>; 2]> =
        (0..chains).map(|_| [k.declare_var(zero.into()), k.declare_var(zero.into())]).collect();
    k.for_range(first, end, k.i32(1), |k, s| {
        let at = k.add(k.mulc(s, nthreads * elems), tid);
        let xs: Vec<_> =
            (0..elems).map(|j| k.load_f(in_dt, r.gate, r.at(k, k.addc(at, j * nthreads)))).collect();
        for (c, a) in acc.iter().enumerate() {
            let mut t = (k.use_f(a[0]), k.use_f(a[1]));
            for &x in &xs[c * RUN_CHAIN as usize..((c + 1) * RUN_CHAIN as usize).min(xs.len())] {
                t = pair_add1(k, t, scan_term(k, term, x));
            }
            k.def_var(a[0], t.0);
            k.def_var(a[1], t.1);
        }
    });
    let own = acc.iter().map(|a| (k.use_f(a[0]), k.use_f(a[1]))).reduce(|t, p| pair_add(k, t, p)).unwrap();
    let x = warp_scan_pair(k, lane, own);
    let sh = scratch.warp_totals;
    k.if_then(k.icmpc(IntPredicate::EQ, lane, 31), |k| {
        k.store(k.shared_at(sh[0], warp), x.0);
        k.store(k.shared_at(sh[1], warp), x.1);
    });
    k.barrier();
    let sum = (0..shape.threads as i64 / 32).fold((zero, zero), |t, w| {
        let w = k.i32(w);
        pair_add(k, t, (k.load_f32(k.shared_at(sh[0], w)), k.load_f32(k.shared_at(sh[1], w))))
    });
    // The scan that follows writes the warp totals again.
    k.barrier();
    sum
}

/// `gate_cumsum` for `Slope`: params `(m: [H], c: f32 [BH, T], T: i32, H: i32)`.
/// Grid `(ceil(T / ELEM_THREADS), BH)`: `c[t] = (t + 1) * max(-m[h], LOG_F_FLOOR)`.
pub fn build_gate_slope<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    name: &str,
    in_dt: DType,
) -> R<FunctionValue<'ctx>> {
    let params = [("m", ParamTy::Ptr), ("c", ParamTy::Ptr), ("T", ParamTy::I32), ("H", ParamTy::I32)];
    let k = Kb::kernel(ctx, module, name, &params)?;
    let (m, out, t_len, h_len) = (k.param_ptr(0), k.param_ptr(1), k.param_int(2), k.param_int(3));
    let bx = k.sreg("ctaid.x");
    let tid = k.sreg("tid.x");
    let bh = k.sreg("ctaid.y");
    let t = k.add(k.mulc(bx, ELEM_THREADS as i64), tid);
    let inb = k.icmp(IntPredicate::SLT, t, t_len);
    k.if_then(inb, |k| {
        let h = k.srem(bh, h_len);
        let mv = k.load_f(in_dt, m, k.sext64(h));
        let lf = k.fmax(k.fneg(mv), k.f32(LOG_F_FLOOR));
        let tp1 = k.sitofp(k.addc(t, 1));
        let idx = k.add(k.mul(k.sext64(bh), k.sext64(t_len)), k.sext64(t));
        k.store_f(DType::F32, out, idx, k.fmul(tp1, lf));
    });
    k.finish()
}

/// Loads one row of `d` elements spread over the warp: lane l holds elements l, l + 32, ...
/// Elements past `d` read as 0 (the index is clamped so no load goes out of bounds).
pub(super) fn load_row<'ctx>(
    k: &Kb<'_, 'ctx>,
    dt: DType,
    p: PointerValue<'ctx>,
    row_base: IntValue<'ctx>,
    lane: IntValue<'ctx>,
    d: u32,
) -> Vec<FloatValue<'ctx>> {
    let mut out = Vec::new();
    for r in 0..d.div_ceil(32) {
        let e = k.addc(lane, 32 * r as i64);
        if (r + 1) * 32 <= d {
            out.push(k.load_f(dt, p, k.add(row_base, k.sext64(e))));
        } else {
            let inb = k.icmpc(IntPredicate::SLT, e, d as i64);
            let ec = k.smin(e, k.i32(d as i64 - 1));
            let v = k.load_f(dt, p, k.add(row_base, k.sext64(ec)));
            out.push(k.select_f(inb, v, k.f32(0.0)));
        }
    }
    out
}

/// `rmsnorm` over the last axis: params `(x: [rows, D], w: [D], y: [rows, D], rows: i32)`.
/// Grid `(ceil(rows / 4))`, block [`ROW_THREADS`]: one warp per row.
pub fn build_rmsnorm<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    name: &str,
    d: u32,
    eps: f64,
    (x_dt, w_dt, y_dt): (DType, DType, DType),
) -> R<FunctionValue<'ctx>> {
    let params = [("x", ParamTy::Ptr), ("w", ParamTy::Ptr), ("y", ParamTy::Ptr), ("rows", ParamTy::I32)];
    let k = Kb::kernel(ctx, module, name, &params)?;
    let (x, w, y, rows) = (k.param_ptr(0), k.param_ptr(1), k.param_ptr(2), k.param_int(3));
    let tid = k.sreg("tid.x");
    let (lane, warp) = lane_warp(&k, tid);
    let bx = k.sreg("ctaid.x");
    let row = k.add(k.mulc(bx, (ROW_THREADS / 32) as i64), warp);
    let inb = k.icmp(IntPredicate::SLT, row, rows);
    k.if_then(inb, |k| {
        let base = k.mul(k.sext64(row), k.i64(d as i64));
        let vals = load_row(k, x_dt, x, base, lane, d);
        let mut ss = k.f32(0.0);
        for v in &vals {
            ss = k.fma(*v, *v, ss);
        }
        let ss = k.warp_sum(ss);
        let mean = k.fdiv(ss, k.f32(d as f64));
        let r = k.fdiv(k.f32(1.0), k.sqrt(k.fadd(mean, k.f32(eps))));
        for (j, v) in vals.iter().enumerate() {
            let e = k.addc(lane, 32 * j as i64);
            let store = |k: &Kb<'_, 'ctx>| {
                let wv = k.load_f(w_dt, w, k.sext64(e));
                let o = k.fmul(k.fmul(*v, r), wv);
                k.store_f(y_dt, y, k.add(base, k.sext64(e)), o);
            };
            if (j as u32 + 1) * 32 <= d {
                store(k);
            } else {
                let ok = k.icmpc(IntPredicate::SLT, e, d as i64);
                k.if_then(ok, store);
            }
        }
    });
    k.finish()
}

/// `cast` (and `x * s` for a compile-time scalar `s`): params `(x, y, n: i64)`;
/// grid `(ceil(n / (ELEM_THREADS * CAST_ELEMS)))`. A thread converts [`CAST_ELEMS`] consecutive
/// elements: with one vector load and one vector store where the group is whole and both
/// pointers are aligned to it (a buffer's base always is; a view into one may not be), else one
/// element at a time.
pub fn build_cast<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    name: &str,
    from: DType,
    to: DType,
    mul: Option<f64>,
) -> R<FunctionValue<'ctx>> {
    for dt in [from, to] {
        if !dt.is_float() {
            return Err(format!("GPU cast supports float dtypes only, got {dt}"));
        }
    }
    let k = Kb::kernel(ctx, module, name, &[("x", ParamTy::Ptr), ("y", ParamTy::Ptr), ("n", ParamTy::I64)])?;
    let (x, y, n) = (k.param_ptr(0), k.param_ptr(1), k.param_int(2));
    let elems = CAST_ELEMS as i64;
    let bx = k.sext64(k.sreg("ctaid.x"));
    let tid = k.sext64(k.sreg("tid.x"));
    let first = k.mulc(k.add(k.mulc(bx, ELEM_THREADS as i64), tid), elems);
    let convert = |k: &Kb<'_, 'ctx>, v: FloatValue<'ctx>| match mul {
        Some(m) => k.fmul(v, k.f32(m)),
        None => v,
    };
    let aligned = |p: PointerValue<'ctx>, dt: DType| {
        k.icmpc(IntPredicate::EQ, k.andc(k.ptr_to_i64(p), elems * dt.size_bytes() as i64 - 1), 0)
    };
    let whole = k.icmp(IntPredicate::SLE, k.addc(first, elems), n);
    let vector = k.and(whole, k.and(aligned(x, from), aligned(y, to)));
    k.if_else(
        vector,
        "cast",
        |k| {
            let vals: Vec<_> =
                k.load_vec_f(from, x, first, CAST_ELEMS).into_iter().map(|v| convert(k, v)).collect();
            k.store_vec_f(to, y, first, &vals);
            vec![]
        },
        |k| {
            for e in 0..elems {
                let i = k.addc(first, e);
                k.if_then(k.icmp(IntPredicate::SLT, i, n), |k| {
                    let v = convert(k, k.load_f(from, x, i));
                    k.store_f(to, y, i, v);
                });
            }
            vec![]
        },
    );
    k.finish()
}
