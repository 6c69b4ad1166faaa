//! CLIF of the fused forward attention ([`AttnKernel`]): one task per `(query tile, head)`, the
//! key tiles walked once with an online softmax (docs/SEMANTICS.md, "attention").
//!
//! A task, phase by phase (one function each, emitted in this order):
//! [`QueryTile::at`] (which rows, which key tiles), [`init_tile`], [`stage_queries`] (scaled Q
//! and `c_i` into scratch), then per key tile [`stage_keys`] (K transposed, V, `c_j`),
//! [`score_block`] (`S = (scale Q) K^T`), [`softmax_rows`] (bias, masks, online softmax) and
//! [`accumulate_pv`] (`O = alpha O + P V`), and last [`finish_rows`] (`out = O / l`, `lse`).

use super::emit::{Fx, F32, F32X4, F64, I32, I64};
use super::kernels::{copy_row, stage_scalar, zero_fill, AttnKernel, AttnScratch, Frame, Helpers};
use super::load_map::Operand;
use super::region::{self, CaptureCode, Lanes};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{InstBuilder, Value};
use foxc_ir::DType;

/// The kernel's buffers: operands in the ABI's order `q, k, v, [c], [c_lo], [start],
/// captures..., out, [lse]` (super::abi).
struct Args {
    q: Value,
    k: Value,
    v: Value,
    c: Option<Value>,
    c_lo: Option<Value>,
    start: Option<Value>,
    caps: Vec<(Value, CaptureCode)>,
    out: Value,
    lse: Option<Value>,
}

impl Args {
    fn load(fx: &mut Fx, a: &AttnKernel, f: &Frame) -> Args {
        let q = fx.arg(f.args, 0);
        let k = fx.arg(f.args, 1);
        let v = fx.arg(f.args, 2);
        let mut next = 3;
        let c = a.c.map(|_| {
            next += 1;
            fx.arg(f.args, next - 1)
        });
        let c_lo = (a.c.is_some() && a.c_lo).then(|| {
            next += 1;
            fx.arg(f.args, next - 1)
        });
        let start = if a.pruned {
            next += 1;
            Some(fx.arg(f.args, next - 1))
        } else {
            None
        };
        let caps: Vec<(Value, CaptureCode)> =
            a.captures.iter().enumerate().map(|(k, cc)| (fx.arg(f.args, next + k), cc.clone())).collect();
        let out = fx.arg(f.args, next + a.captures.len());
        let lse = a.lse.then(|| fx.arg(f.args, next + a.captures.len() + 1));
        Args { q, k, v, c, c_lo, start, caps, out, lse }
    }
}

/// Addresses of the thread's scratch areas ([`AttnScratch`]).
#[derive(Clone, Copy)]
struct Bufs {
    qs: Value,
    kt: Value,
    vp: Value,
    s: Value,
    o: Value,
    ci: Value,
    cj: Value,
    /// `decay(pair)`: lo_i of the tile's rows and lo_j of its columns.
    lo: Option<(Value, Value)>,
    mrow: Value,
    lrow: Value,
    arow: Value,
}

impl Bufs {
    fn at(fx: &mut Fx, sc: &AttnScratch, scr: Value, pair: bool) -> Bufs {
        let qs = fx.b.ins().iadd_imm_s(scr, sc.qs);
        let kt = fx.b.ins().iadd_imm_s(scr, sc.kt);
        let vp = fx.b.ins().iadd_imm_s(scr, sc.vp);
        let s = fx.b.ins().iadd_imm_s(scr, sc.s);
        let o = fx.b.ins().iadd_imm_s(scr, sc.o);
        let ci = fx.b.ins().iadd_imm_s(scr, sc.ci);
        let cj = fx.b.ins().iadd_imm_s(scr, sc.cj);
        let lo = pair.then(|| (fx.b.ins().iadd_imm_s(scr, sc.li), fx.b.ins().iadd_imm_s(scr, sc.lj)));
        let mrow = fx.b.ins().iadd_imm_s(scr, sc.mrow);
        let lrow = fx.b.ins().iadd_imm_s(scr, sc.lrow);
        let arow = fx.b.ins().iadd_imm_s(scr, sc.arow);
        Bufs { qs, kt, vp, s, o, ci, cj, lo, mrow, lrow, arow }
    }
}

/// One task's query tile and the key tiles it visits, `n_lo..=diag`.
struct QueryTile {
    /// Batch and head of the task (for regions).
    bi: Value,
    hi: Value,
    /// First row and row count of the tile.
    i0: Value,
    rows: Value,
    /// Row index of `(b, h, 0)` in q (and out, lse), of `(b, h, 0)` in c (`[B, H, Tk]`), and of
    /// the kv head's row 0 in k and v.
    row_base: Value,
    c_base: Value,
    kv_base: Value,
    diag: Value,
    n_lo: Value,
}

impl QueryTile {
    fn at(fx: &mut Fx, a: &AttnKernel, args: &Args, task: Value) -> QueryTile {
        let (t, tk, bm, bn) = (a.t, a.tk, a.bm, a.bn);
        // Query row i sits at key position i + off (queries aligned to the end of the keys).
        let off = a.offset() as i64;
        let mt = a.mt();
        let bhn = a.bh;
        // Longest query tiles first: task -> (m = Mt-1 - task / BH, bh = task % BH).
        let mq = fx.b.ins().udiv_imm_s(task, bhn as i64);
        let mlast = fx.ic(mt as i64 - 1);
        let m = fx.b.ins().isub(mlast, mq);
        let bh = fx.b.ins().urem_imm_s(task, bhn as i64);
        let i0 = fx.b.ins().imul_imm_s(m, bm as i64);
        let tv = fx.ic(t as i64);
        let rem = fx.b.ins().isub(tv, i0);
        let bmv = fx.ic(bm as i64);
        let rows = fx.imin(bmv, rem);
        let row_base = fx.b.ins().imul_imm_s(bh, t as i64);
        let c_base = if tk == t { row_base } else { fx.b.ins().imul_imm_s(bh, tk as i64) };
        // k and v rows of the kv head b * hk + h / (H / hk).
        let bi = fx.b.ins().udiv_imm_s(bh, a.h as i64);
        let hi = fx.b.ins().urem_imm_s(bh, a.h as i64);
        let kv_base = if a.hk == a.h {
            c_base
        } else {
            let kvh = fx.b.ins().udiv_imm_s(hi, (a.h / a.hk.max(1)).max(1) as i64);
            let kvb = fx.b.ins().imul_imm_s(bi, a.hk as i64);
            let kvh = fx.b.ins().iadd(kvb, kvh);
            fx.b.ins().imul_imm_s(kvh, tk as i64)
        };
        let ilast = fx.b.ins().iadd(i0, rows);
        let ilast = fx.b.ins().iadd_imm_s(ilast, off - 1);
        // The last key tile: the diagonal one for causal rows, else the last of the sequence.
        let diag =
            if a.causal { fx.b.ins().udiv_imm_s(ilast, bn as i64) } else { fx.ic(((tk - 1) / bn) as i64) };
        let mut n_lo = fx.ic(0);
        if let Some(sp) = args.start {
            let idx = fx.b.ins().imul_imm_s(bh, mt as i64);
            let idx = fx.b.ins().iadd(idx, m);
            let sa = fx.addr(sp, idx, 4);
            let s32 = fx.load(I32, sa, 0);
            let s = fx.b.ins().sextend(I64, s32);
            let zero = fx.ic(0);
            let s = fx.imax(s, zero);
            n_lo = fx.imin(s, diag);
        }
        if let Some(w) = a.window {
            // Tiles whose last column jend satisfies i0 - jend >= window hold no visible key
            // for any row of the tile: first kept n = ceil((i0 + 2 - window - bn) / bn), >= 0.
            let w = w.min(i64::MAX as u64 / 4) as i64;
            let x = fx.b.ins().iadd_imm_s(i0, off + 2 - w - bn as i64 + (bn as i64 - 1));
            let zero = fx.ic(0);
            let x = fx.imax(x, zero);
            let nw = fx.b.ins().sdiv_imm_s(x, bn as i64);
            let nw = fx.imin(nw, diag);
            n_lo = fx.imax(n_lo, nw);
        }
        QueryTile { bi, hi, i0, rows, row_base, c_base, kv_base, diag, n_lo }
    }

    /// The row index of the tile's row `r` in q, out and lse.
    fn row(&self, fx: &mut Fx, r: Value) -> Value {
        let row = fx.b.ins().iadd(self.row_base, self.i0);
        fx.b.ins().iadd(row, r)
    }

    /// The index in c of the tile's row `r` (its key position `i0 + r + off`).
    fn c_row(&self, fx: &mut Fx, a: &AttnKernel, r: Value) -> Value {
        let row = fx.b.ins().iadd(self.c_base, self.i0);
        let row = fx.b.ins().iadd(row, r);
        fx.b.ins().iadd_imm_s(row, a.offset() as i64)
    }
}

/// What every phase reads: the kernel, its scratch layout, its buffers and scratch addresses,
/// and how it reads q (through its load map, if any).
struct Cx<'k> {
    a: &'k AttnKernel,
    sc: AttnScratch,
    args: Args,
    bufs: Bufs,
    q: Operand,
}

/// The fused forward attention kernel.
pub(super) fn emit(fx: &mut Fx, a: &AttnKernel, f: &Frame, h: &Helpers) {
    let sc = a.scratch();
    let args = Args::load(fx, a, f);
    let bufs = Bufs::at(fx, &sc, f.scratch, args.c_lo.is_some());
    let q = Operand { dtype: a.q, map: a.q_map.clone() };
    let cx = Cx { a, sc, args, bufs, q };
    fx.for_range(f.begin, f.end, 1, |fx, task| {
        let mut tile = QueryTile::at(fx, a, &cx.args, task);
        if let Some(e) = &a.keys_from {
            tile.n_lo = key_bound_start(fx, &cx, &tile, e);
        }
        init_tile(fx, &cx);
        stage_queries(fx, &cx, &tile);
        let diag1 = fx.b.ins().iadd_imm_s(tile.diag, 1);
        fx.for_range(tile.n_lo, diag1, 1, |fx, n| {
            let (j0, cols) = stage_keys(fx, &cx, &tile, n);
            score_block(fx, &cx);
            softmax_rows(fx, &cx, &tile, j0, cols);
            accumulate_pv(fx, &cx);
        });
        finish_rows(fx, &cx, &tile, h);
    });
}

/// The tile's first key tile raised to the first one that reaches `min E_i` over its rows, `E`
/// the attention's key bound `keys_from` (every key `j < E_i` of row `i` is masked, so a key
/// tile below the minimum holds nothing any row keeps), never past the diagonal tile (the walk
/// visits at least one). The mask is still applied on every visited entry: the kept set is the
/// interpreter's. A NaN `E_i` (`j >= NaN` keeps nothing) is left out of the minimum, as in the
/// GPU kernel (nvptx/attention/key_bound.rs).
fn key_bound_start(fx: &mut Fx, cx: &Cx, tile: &QueryTile, e: &region::RegionCode) -> Value {
    let a = cx.a;
    let e_min = fx.b.declare_var(F32);
    let inf = fx.b.ins().f32const(f32::INFINITY);
    fx.b.def_var(e_min, inf);
    let zero = fx.ic(0);
    fx.for_range(zero, tile.rows, 1, |fx, r| {
        let i = fx.b.ins().iadd(tile.i0, r);
        let ei = region::emit_row(fx, e, &cx.args.caps, (tile.bi, tile.hi, i));
        // `ei < min ? ei : min`: a NaN `ei` keeps the minimum.
        let m = fx.b.use_var(e_min);
        let m = fx.fmin_s(ei, m);
        fx.b.def_var(e_min, m);
    });
    // Clamped to [0, Tk] before the conversion (every row NaN leaves +inf: nothing is kept).
    let m = fx.b.use_var(e_min);
    let zf = fx.b.ins().f32const(0.0);
    let m = fx.fmax_s(m, zf);
    let tk = fx.b.ins().f32const(a.tk as f32);
    let m = fx.fmin_s(m, tk);
    // Key tile floor(floor(E) / bn) (E >= 0: truncation floors).
    let e = fx.b.ins().fcvt_to_sint_sat(I64, m);
    let kt = fx.b.ins().sdiv_imm_s(e, a.bn as i64);
    let n = fx.imax(tile.n_lo, kt);
    fx.imin(n, tile.diag)
}

/// Per-task init: zero the Q, O, V and `c_i` areas; running max `-inf` and sum 0 per row.
fn init_tile(fx: &mut Fx, cx: &Cx) {
    let (a, sc, bufs) = (cx.a, &cx.sc, &cx.bufs);
    zero_fill(fx, bufs.qs, sc.bmp * a.d * 4);
    zero_fill(fx, bufs.o, sc.bmp * sc.dp);
    zero_fill(fx, bufs.vp, sc.bnp * sc.dp);
    zero_fill(fx, bufs.ci, sc.bmp);
    if let Some((lib, _)) = bufs.lo {
        zero_fill(fx, lib, sc.bmp);
    }
    let ninf = fx.splat_c(f32::NEG_INFINITY);
    let zv = fx.splat_c(0.0);
    for r in (0..sc.bmp.next_multiple_of(4)).step_by(4) {
        fx.store(ninf, bufs.mrow, (r * 4) as i32);
        fx.store(zv, bufs.lrow, (r * 4) as i32);
    }
}

/// The tile's rows of `scale * q` into scratch, each element splatted to an f32x4 (the QK block
/// then loads a ready operand instead of a scalar load and a broadcast per row and column),
/// and their `c_i` (and `lo_i`).
fn stage_queries(fx: &mut Fx, cx: &Cx, tile: &QueryTile) {
    let (a, args, bufs) = (cx.a, &cx.args, &cx.bufs);
    let d = a.d;
    let scale_v = fx.splat_c(a.scale as f32);
    let z0 = fx.ic(0);
    fx.for_range(z0, tile.rows, 1, |fx, r| {
        let row = tile.row(fx, r);
        let src = fx.b.ins().imul_imm_s(row, d as i64);
        let dst = fx.addr(bufs.qs, r, (d * 16) as i64);
        if cx.q.map.is_some() || d.is_multiple_of(4) {
            // Four columns at a time, through q's map if it has one (lanes past d dropped).
            let at = cx.q.map.is_some().then(|| (tile.bi, tile.hi, fx.b.ins().iadd(tile.i0, r)));
            let at = cx.q.row(src, at);
            for j in (0..d).step_by(4) {
                let x = cx.q.lanes(fx, args.q, &args.caps, &at, j, d);
                let x = fx.b.ins().fmul(x, scale_v);
                for l in 0..(d - j).min(4) as u8 {
                    let e = fx.b.ins().extractlane(x, l);
                    let sv = fx.splat(e);
                    fx.store(sv, dst, ((j + l as u64) * 16) as i32);
                }
            }
        } else {
            let sc = fx.f32c(a.scale as f32);
            for j in 0..d {
                let idx = fx.b.ins().iadd_imm_s(src, j as i64);
                let x = fx.load_f32(a.q, args.q, idx);
                let x = fx.b.ins().fmul(x, sc);
                let sv = fx.splat(x);
                fx.store(sv, dst, (j * 16) as i32);
            }
        }
        // c is read at the row's key position (the row itself when queries and keys are one).
        let crow = if a.tk != a.t && args.c.is_some() { tile.c_row(fx, a, r) } else { row };
        if let (Some(cp), Some(ct)) = (args.c, a.c) {
            stage_scalar(fx, ct, cp, crow, bufs.ci, r);
        }
        if let (Some(lp), Some((lib, _))) = (args.c_lo, bufs.lo) {
            stage_scalar(fx, DType::F32, lp, crow, lib, r);
        }
    });
}

/// Key tile `n` into scratch: K transposed (`[d][bnp]`) and V (`[bnp][dp]`) as f32, and `c_j`
/// (and `lo_j`); a short last tile's padding columns zeroed so that they stay finite. Returns
/// the tile's first key and its column count.
fn stage_keys(fx: &mut Fx, cx: &Cx, tile: &QueryTile, n: Value) -> (Value, Value) {
    let (a, sc, args, bufs) = (cx.a, &cx.sc, &cx.args, &cx.bufs);
    let (tk, d, bn, bnp, dp) = (a.tk, a.d, a.bn, sc.bnp, sc.dp);
    let j0 = fx.b.ins().imul_imm_s(n, bn as i64);
    let tv = fx.ic(tk as i64);
    let remj = fx.b.ins().isub(tv, j0);
    let bnv = fx.ic(bn as i64);
    let cols = fx.imin(bnv, remj);
    let z0 = fx.ic(0);
    fx.for_range(z0, cols, 1, |fx, cc| {
        let row = fx.b.ins().iadd(tile.c_base, j0);
        let row = fx.b.ins().iadd(row, cc);
        let kvrow = fx.b.ins().iadd(tile.kv_base, j0);
        let kvrow = fx.b.ins().iadd(kvrow, cc);
        let src = fx.b.ins().imul_imm_s(kvrow, d as i64);
        let ktc = fx.addr(bufs.kt, cc, 4);
        if d.is_multiple_of(4) {
            for j in (0..d).step_by(4) {
                let idx = fx.b.ins().iadd_imm_s(src, j as i64);
                let x = fx.load4_f32(a.k, args.k, idx);
                for l in 0..4u8 {
                    let e = fx.b.ins().extractlane(x, l);
                    fx.store(e, ktc, ((j + l as u64) * bnp * 4) as i32);
                }
            }
        } else {
            for j in 0..d {
                let idx = fx.b.ins().iadd_imm_s(src, j as i64);
                let e = fx.load_f32(a.k, args.k, idx);
                fx.store(e, ktc, (j * bnp * 4) as i32);
            }
        }
        let vdst = fx.addr(bufs.vp, cc, (dp * 4) as i64);
        copy_row(fx, a.v, args.v, src, vdst, d, None);
        if let (Some(cp), Some(ct)) = (args.c, a.c) {
            stage_scalar(fx, ct, cp, row, bufs.cj, cc);
        }
        if let (Some(lp), Some((_, ljb))) = (args.c_lo, bufs.lo) {
            stage_scalar(fx, DType::F32, lp, row, ljb, cc);
        }
    });
    let short = fx.b.ins().icmp_imm_s(IntCC::SignedLessThan, cols, bnp as i64);
    fx.if_then(short, |fx| {
        let hi = fx.ic(bnp as i64);
        fx.for_range(cols, hi, 1, |fx, cc| {
            let ktc = fx.addr(bufs.kt, cc, 4);
            let z = fx.f32c(0.0);
            for j in 0..d {
                fx.store(z, ktc, (j * bnp * 4) as i32);
            }
            let vdst = fx.addr(bufs.vp, cc, (dp * 4) as i64);
            zero_fill(fx, vdst, dp);
            let ca = fx.addr(bufs.cj, cc, 4);
            fx.store(z, ca, 0);
            if let Some((_, ljb)) = bufs.lo {
                let la = fx.addr(ljb, cc, 4);
                fx.store(z, la, 0);
            }
        });
    });
    (j0, cols)
}

/// `S = (scale Q) K^T` into scratch, register blocks of 4 rows x 8 columns.
fn score_block(fx: &mut Fx, cx: &Cx) {
    let (a, sc, bufs) = (cx.a, &cx.sc, &cx.bufs);
    let (d, rb, bnp) = (a.d, sc.rb, sc.bnp);
    fx.for_n(0, sc.bmp as i64, rb as i64, |fx, rblk| {
        let qrow = fx.addr(bufs.qs, rblk, (d * 16) as i64);
        let srow = fx.addr(bufs.s, rblk, (bnp * 4) as i64);
        fx.for_n(0, bnp as i64, 8, |fx, cb| {
            let ktc = fx.addr(bufs.kt, cb, 4);
            let mut acc = vec![fx.splat_c(0.0); 2 * rb as usize];
            for j in 0..d {
                let k0 = fx.load(F32X4, ktc, (j * bnp * 4) as i32);
                let k1 = fx.load(F32X4, ktc, (j * bnp * 4 + 16) as i32);
                for r in 0..rb {
                    let qv = fx.load(F32X4, qrow, ((r * d + j) * 16) as i32);
                    acc[2 * r as usize] = fx.fmadd(qv, k0, acc[2 * r as usize]);
                    acc[2 * r as usize + 1] = fx.fmadd(qv, k1, acc[2 * r as usize + 1]);
                }
            }
            let sdst = fx.addr(srow, cb, 4);
            for r in 0..rb {
                fx.store(acc[2 * r as usize], sdst, (r * bnp * 4) as i32);
                fx.store(acc[2 * r as usize + 1], sdst, (r * bnp * 4 + 16) as i32);
            }
        });
    });
}

/// Per row of the tile: the region, the decay bias and the masks applied to its scores, then
/// one step of the online softmax (new running max, `P = exp(S - m)`, running sum, and the
/// factor `alpha` that rescales the row's accumulated output).
fn softmax_rows(fx: &mut Fx, cx: &Cx, tile: &QueryTile, j0: Value, cols: Value) {
    let (a, sc, args, bufs) = (cx.a, &cx.sc, &cx.args, &cx.bufs);
    let bnp = sc.bnp;
    fx.for_n(0, sc.bmp as i64, 1, |fx, r| {
        let i = fx.b.ins().iadd(tile.i0, r);
        // Visible columns of row i (key position i + off) in this tile: [c_lo, c_hi).
        let pos = if a.tk == a.t { i } else { fx.b.ins().iadd_imm_s(i, a.offset() as i64) };
        let rel = fx.b.ins().isub(pos, j0);
        let rel1 = fx.b.ins().iadd_imm_s(rel, 1);
        let chi = if a.causal { fx.imin(cols, rel1) } else { cols };
        let in_rows = fx.b.ins().icmp(IntCC::SignedLessThan, r, tile.rows);
        let zero = fx.ic(0);
        let chi = fx.b.ins().select(in_rows, chi, zero);
        let chi_f = fx.b.ins().fcvt_from_sint(F32, chi);
        let chi_v = fx.splat(chi_f);
        let clo_v = a.window.map(|w| {
            let w = w.min(i64::MAX as u64 / 4) as i64;
            let lo = fx.b.ins().iadd_imm_s(rel, 1 - w);
            let zero = fx.ic(0);
            let lo = fx.imax(lo, zero);
            let lo = fx.b.ins().fcvt_from_sint(F32, lo);
            fx.splat(lo)
        });
        let srow = fx.addr(bufs.s, r, (bnp * 4) as i64);
        let civ = if a.c.is_some() {
            let ca = fx.addr(bufs.ci, r, 4);
            let ci = fx.load(F32, ca, 0);
            Some(fx.splat(ci))
        } else {
            None
        };
        let liv = bufs.lo.map(|(lib, _)| {
            let la = fx.addr(lib, r, 4);
            let li = fx.load(F32, la, 0);
            fx.splat(li)
        });
        let mut vmx = fx.splat_c(f32::NEG_INFINITY);
        let ninf = vmx;
        for cc in (0..bnp).step_by(4) {
            let mut s = fx.load(F32X4, srow, (cc * 4) as i32);
            let jc = fx.b.ins().iadd_imm_s(j0, cc as i64);
            let at = Lanes { b: tile.bi, h: tile.hi, i, j0: jc, aligned: a.bn % 4 == 0 };
            if let Some(rc) = &a.score {
                s = region::emit(fx, rc, &args.caps, &at, s);
            }
            if let Some(civ) = civ {
                let cj = fx.load(F32X4, bufs.cj, (cc * 4) as i32);
                let mut bias = fx.b.ins().fsub(civ, cj);
                if let (Some(liv), Some((_, ljb))) = (liv, bufs.lo) {
                    // decay(pair): (c_i - c_j) + (lo_i - lo_j), the f64 cumsum's difference.
                    let lj = fx.load(F32X4, ljb, (cc * 4) as i32);
                    let dl = fx.b.ins().fsub(liv, lj);
                    bias = fx.b.ins().fadd(bias, dl);
                }
                s = fx.b.ins().fadd(s, bias);
            }
            let cf = cc as f32;
            let idx = fx.vconst4([cf, cf + 1.0, cf + 2.0, cf + 3.0]);
            let mut ok = fx.b.ins().fcmp(FloatCC::LessThan, idx, chi_v);
            if let Some(clo_v) = clo_v {
                let ok2 = fx.b.ins().fcmp(FloatCC::GreaterThanOrEqual, idx, clo_v);
                ok = fx.b.ins().band(ok, ok2);
            }
            if let Some(mc) = &a.mask {
                let x0 = fx.splat_c(0.0);
                let keep = region::emit(fx, mc, &args.caps, &at, x0);
                let ok2 = fx.b.ins().fcmp(FloatCC::NotEqual, keep, x0);
                ok = fx.b.ins().band(ok, ok2);
            }
            s = fx.vsel(ok, s, ninf);
            fx.store(s, srow, (cc * 4) as i32);
            vmx = fx.vmax(vmx, s);
        }
        online_softmax_step(fx, bufs, r, srow, bnp, vmx);
    });
}

/// Row `r`'s online-softmax update from its masked scores at `srow` (`vmx`: their lane maxima):
/// `P = exp(S - m_new)` in place, `l = alpha l + sum P`, and `alpha = exp(m_old - m_new)` stored
/// for [`accumulate_pv`]. A row whose max is still `-inf` exponentiates against 0 (no NaN).
fn online_softmax_step(fx: &mut Fx, bufs: &Bufs, r: Value, srow: Value, bnp: u64, vmx: Value) {
    let tmax = fx.hmax(vmx);
    let ma = fx.addr(bufs.mrow, r, 4);
    let m_old = fx.load(F32, ma, 0);
    let m_new = fx.fmax_s(m_old, tmax);
    let ninf_s = fx.f32c(f32::NEG_INFINITY);
    let none = fx.b.ins().fcmp(FloatCC::Equal, m_new, ninf_s);
    let zf = fx.f32c(0.0);
    let m_use = fx.b.ins().select(none, zf, m_new);
    let dm = fx.b.ins().fsub(m_old, m_use);
    let alpha = fx.exp_s(dm);
    let mu = fx.splat(m_use);
    let mut vs = fx.splat_c(0.0);
    for cc in (0..bnp).step_by(4) {
        let s = fx.load(F32X4, srow, (cc * 4) as i32);
        let x = fx.b.ins().fsub(s, mu);
        let p = fx.vexp(x);
        fx.store(p, srow, (cc * 4) as i32);
        vs = fx.b.ins().fadd(vs, p);
    }
    let la = fx.addr(bufs.lrow, r, 4);
    let l_old = fx.load(F32, la, 0);
    let psum = fx.hsum(vs);
    let l_new = fx.fmadd(l_old, alpha, psum);
    fx.store(l_new, la, 0);
    fx.store(m_new, ma, 0);
    let aa = fx.addr(bufs.arow, r, 4);
    fx.store(alpha, aa, 0);
}

/// `O = alpha O + P V`, register blocks of [`AttnScratch::rb`] rows x 8 head dims.
fn accumulate_pv(fx: &mut Fx, cx: &Cx) {
    let (sc, bufs) = (&cx.sc, &cx.bufs);
    let (rb, bnp, dp) = (sc.rb, sc.bnp, sc.dp);
    fx.for_n(0, sc.bmp as i64, rb as i64, |fx, rblk| {
        let prow = fx.addr(bufs.s, rblk, (bnp * 4) as i64);
        let orow = fx.addr(bufs.o, rblk, (dp * 4) as i64);
        let arb = fx.addr(bufs.arow, rblk, 4);
        let al: Vec<Value> = (0..rb)
            .map(|r| {
                let s = fx.load(F32, arb, (r * 4) as i32);
                fx.splat(s)
            })
            .collect();
        fx.for_n(0, dp as i64, 8, |fx, db| {
            let oc = fx.addr(orow, db, 4);
            let vc = fx.addr(bufs.vp, db, 4);
            let mut acc = vec![al[0]; 2 * rb as usize];
            for r in 0..rb {
                for hh in 0..2u64 {
                    let o = fx.load(F32X4, oc, (r * dp * 4 + hh * 16) as i32);
                    acc[(2 * r + hh) as usize] = fx.b.ins().fmul(o, al[r as usize]);
                }
            }
            for cc in 0..bnp {
                let v0 = fx.load(F32X4, vc, (cc * dp * 4) as i32);
                let v1 = fx.load(F32X4, vc, (cc * dp * 4 + 16) as i32);
                for r in 0..rb {
                    let p = fx.load(F32, prow, ((r * bnp + cc) * 4) as i32);
                    let p = fx.splat(p);
                    acc[2 * r as usize] = fx.fmadd(p, v0, acc[2 * r as usize]);
                    acc[2 * r as usize + 1] = fx.fmadd(p, v1, acc[2 * r as usize + 1]);
                }
            }
            for r in 0..rb {
                for hh in 0..2u64 {
                    fx.store(acc[(2 * r + hh) as usize], oc, (r * dp * 4 + hh * 16) as i32);
                }
            }
        });
    });
}

/// `out_i = O_i / l_i` and `lse_i = m_i + ln l_i` (m_i as the exponents used it: 0 for a row
/// without kept keys, whose l_i = 0 gives -inf).
fn finish_rows(fx: &mut Fx, cx: &Cx, tile: &QueryTile, h: &Helpers) {
    let (a, sc, args, bufs) = (cx.a, &cx.sc, &cx.args, &cx.bufs);
    let (d, dp) = (a.d, sc.dp);
    let z0 = fx.ic(0);
    fx.for_range(z0, tile.rows, 1, |fx, r| {
        let la = fx.addr(bufs.lrow, r, 4);
        let l = fx.load(F32, la, 0);
        if let Some(lp) = args.lse {
            let ma = fx.addr(bufs.mrow, r, 4);
            let m = fx.load(F32, ma, 0);
            let ninf = fx.f32c(f32::NEG_INFINITY);
            let none = fx.b.ins().fcmp(FloatCC::Equal, m, ninf);
            let zf = fx.f32c(0.0);
            let m = fx.b.ins().select(none, zf, m);
            let m = fx.b.ins().fpromote(F64, m);
            let l64 = fx.b.ins().fpromote(F64, l);
            let call = fx.b.ins().call(h.ln.expect("ln imported when lse is written"), &[l64]);
            let lnl = fx.b.inst_results(call)[0];
            let x = fx.b.ins().fadd(m, lnl);
            let x = fx.b.ins().fdemote(F32, x);
            let row = tile.row(fx, r);
            fx.store_f32(DType::F32, lp, row, x);
        }
        // A row without kept keys has l = 0 and O = 0: its output is 0 (docs/SEMANTICS.md,
        // empty rows), not 0 * (1 / 0) = NaN.
        let one = fx.f32c(1.0);
        let zf = fx.f32c(0.0);
        let inv = fx.b.ins().fdiv(one, l);
        // (l = 0 exactly: a NaN l keeps its NaN, as the contract wants.)
        let empty = fx.b.ins().fcmp(FloatCC::Equal, l, zf);
        let inv = fx.b.ins().select(empty, zf, inv);
        let invv = fx.splat(inv);
        let row = tile.row(fx, r);
        let dst = fx.b.ins().imul_imm_s(row, (d * 4) as i64);
        let dst = fx.b.ins().iadd(args.out, dst);
        let src = fx.addr(bufs.o, r, (dp * 4) as i64);
        if let Some(ep) = &a.epilogue {
            // F(o, b, h, i, d) four columns at a time (the accumulator row is padded to dp, a
            // multiple of 4); lanes past d are computed and dropped.
            let base = fx.b.ins().imul_imm_s(row, d as i64);
            let i = fx.b.ins().iadd(tile.i0, r);
            for j in (0..d).step_by(4) {
                let x = fx.load(F32X4, src, (j * 4) as i32);
                let o = fx.b.ins().fmul(x, invv);
                let j0 = fx.ic(j as i64);
                let at = Lanes { b: tile.bi, h: tile.hi, i, j0, aligned: true };
                let y = region::emit(fx, ep, &args.caps, &at, o);
                for lane in 0..(d - j).min(4) {
                    let yl = fx.b.ins().extractlane(y, lane as u8);
                    let idx = fx.b.ins().iadd_imm_s(base, (j + lane) as i64);
                    fx.store_f32(a.out, args.out, idx, yl);
                }
            }
        } else if a.out != DType::F32 {
            let base = fx.b.ins().imul_imm_s(row, d as i64);
            for j in 0..d {
                let x = fx.load(F32, src, (j * 4) as i32);
                let y = fx.b.ins().fmul(x, inv);
                let idx = fx.b.ins().iadd_imm_s(base, j as i64);
                fx.store_f32(a.out, args.out, idx, y);
            }
        } else if d.is_multiple_of(4) {
            for j in (0..d).step_by(4) {
                let x = fx.load(F32X4, src, (j * 4) as i32);
                let y = fx.b.ins().fmul(x, invv);
                fx.store(y, dst, (j * 4) as i32);
            }
        } else {
            for j in 0..d {
                let x = fx.load(F32, src, (j * 4) as i32);
                let y = fx.b.ins().fmul(x, inv);
                fx.store(y, dst, (j * 4) as i32);
            }
        }
    });
}
