//! The largest squared norms of q and k over the rows of one query tile, by one block of
//! [`NORM_THREADS`]: 16-byte loads where the rows allow, element loads otherwise.

use super::q_map::{load_q_row, QMap};
use super::Kb;
use crate::nvptx::block_reduce::block_reduce;
use crate::nvptx::builder::control::Var;
use crate::nvptx::heads::kv_rows;
use crate::nvptx::kernels::load_row;
use foxc_ir::DType;
use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::IntPredicate;

/// Rows each warp of the element-load path loads at once: about 1 KB of q and k rows per lane
/// group (8 rows at D = 128, bf16), between 2 and 16 rows.
fn norm_rows(d: u32) -> u32 {
    (1024 / d.max(1)).clamp(2, 16)
}

/// Threads per block of the norms kernels: 8 warps, so that one step of 16-byte loads covers a
/// tile of 64 or 128 rows at D = 128 (the 128-thread kernel took four steps, 6.5-7.1 us at
/// 1x1x2048x128, longer than the gate scan beside it), at ~90 registers two blocks per SM.
pub const NORM_THREADS: u32 = 256;
const NORM_WARPS: u32 = NORM_THREADS / 32;
/// Rows per lane group and step of [`vector_rows`] at most (64 registers of loads in flight
/// per lane, as [`norm_rows`] has).
const MAX_SLOTS: u32 = 8;

/// The largest squared norms of q and k over the rows of a query tile (every thread gets them).
pub(super) struct TileNorms<'ctx> {
    pub q: FloatValue<'ctx>,
    pub k: FloatValue<'ctx>,
}

/// Where the norms kernels read: q and k (their dtypes), the first query row of the head,
/// the first key row of its kv head, the tile's rows `[i0, last)`, the head dim, and q's load
/// map with the head `bh` it is computed for.
#[derive(Clone, Copy)]
struct Rows<'m, 'ctx> {
    q: PointerValue<'ctx>,
    k: PointerValue<'ctx>,
    dts: (DType, DType),
    q_base: IntValue<'ctx>,
    k_base: IntValue<'ctx>,
    i0: IntValue<'ctx>,
    last: IntValue<'ctx>,
    /// The last query row when queries are fewer than keys (the tiles are the keys'): a row
    /// past it reads it again, whose norm the maxima hold already.
    q_last: Option<IntValue<'ctx>>,
    d: u32,
    q_map: Option<&'m QMap>,
    bh: IntValue<'ctx>,
}

impl<'ctx> Rows<'_, 'ctx> {
    /// The q row read beside key row `row`.
    fn q_row(&self, k: &Kb<'_, 'ctx>, row: IntValue<'ctx>) -> IntValue<'ctx> {
        match self.q_last {
            Some(last) => k.smin(row, last),
            None => row,
        }
    }
}

/// The running maxima of a thread's squared row norms.
#[derive(Clone, Copy)]
struct Maxima<'ctx> {
    q: Var<'ctx>,
    k: Var<'ctx>,
}

impl<'ctx> Maxima<'ctx> {
    fn add(&self, k: &Kb<'_, 'ctx>, sq: FloatValue<'ctx>, sk: FloatValue<'ctx>) {
        k.def_var(self.q, k.fmax(k.use_f(self.q), sq));
        k.def_var(self.k, k.fmax(k.use_f(self.k), sk));
    }
}

/// The lane layout of 16-byte row loads: each lane loads `elems` elements of a row, `lanes`
/// lanes cover a row, a warp covers `rows` rows at once. For q and k of one dtype whose rows
/// split into 16-byte pieces over a power-of-two number of lanes (bf16 D = 8 .. 256).
#[derive(Clone, Copy)]
struct VecRows {
    elems: u32,
    lanes: u32,
    rows: u32,
}

impl VecRows {
    fn of(d: u32, (q_dt, k_dt): (DType, DType)) -> Option<VecRows> {
        if q_dt != k_dt || !q_dt.is_float() {
            return None;
        }
        let elems = (16 / q_dt.size_bytes()) as u32;
        let lanes = d / elems;
        if !d.is_multiple_of(elems) || !(1..=32).contains(&lanes) || !32u32.is_multiple_of(lanes) {
            return None;
        }
        Some(VecRows { elems, lanes, rows: 32 / lanes })
    }
}

/// This lane's part of one row's squared norms of q and of k (its elements in order).
fn squares<'ctx>(
    k: &Kb<'_, 'ctx>,
    qv: &[FloatValue<'ctx>],
    kv: &[FloatValue<'ctx>],
) -> (FloatValue<'ctx>, FloatValue<'ctx>) {
    let (mut sq, mut sk) = (k.f32(0.0), k.f32(0.0));
    for (a, b) in qv.iter().zip(kv) {
        sq = k.fma(*a, *a, sq);
        sk = k.fma(*b, *b, sk);
    }
    (sq, sk)
}

/// Rows of the tile in 16-byte pieces ([`VecRows`]): `slots` rows per lane group and step, all
/// their loads issued before any arithmetic, each row's sum over its lanes by butterflies
/// inside the group. A row past the tile repeats the tile's last row.
fn vector_rows<'ctx>(
    k: &Kb<'_, 'ctx>,
    v: VecRows,
    r: &Rows<'_, 'ctx>,
    acc: Maxima<'ctx>,
    (lane, warp): (IntValue<'ctx>, IntValue<'ctx>),
    (warps, bm): (u32, u32),
) {
    let slots = bm.div_ceil(warps * v.rows).clamp(1, MAX_SLOTS);
    let per_warp = slots * v.rows;
    let (sub, col) = (k.udivc(lane, v.lanes as i64), k.uremc(lane, v.lanes as i64));
    let col_off = k.sext64(k.mulc(col, v.elems as i64));
    let load = |k: &Kb<'_, 'ctx>, dt: DType, p: PointerValue<'ctx>, base: IntValue<'ctx>, row| {
        let at = k.add(k.mul(k.add(base, k.sext64(row)), k.i64(r.d as i64)), col_off);
        let ty = k.elem_type(dt).into_float_type().vec_type(v.elems);
        let x = k.load_aligned(ty.into(), k.gep_dt(dt, p, at), 16).into_vector_value();
        (0..v.elems as i64)
            .map(|e| {
                let x = k.extract_f(x, e);
                if dt == DType::F32 {
                    x
                } else {
                    k.fpext(x)
                }
            })
            .collect::<Vec<_>>()
    };
    // q's elements through its map: column `col * elems + e` of its row.
    let mapped = |k: &Kb<'_, 'ctx>, xs: Vec<FloatValue<'ctx>>, row: IntValue<'ctx>| match r.q_map {
        None => xs,
        Some(m) => m.apply_lanes(k, &xs, (row, k.mulc(col, v.elems as i64), r.bh)),
    };
    let start = k.add(r.i0, k.mulc(warp, per_warp as i64));
    k.for_range(start, r.last, k.i32((warps * per_warp) as i64), |k, i| {
        let rows: Vec<_> = (0..slots)
            .map(|s| {
                let row = k.smin(k.add(k.addc(i, (s * v.rows) as i64), sub), k.addc(r.last, -1));
                let q_row = r.q_row(k, row);
                (load(k, r.dts.0, r.q, r.q_base, q_row), load(k, r.dts.1, r.k, r.k_base, row), q_row)
            })
            .collect();
        let rows: Vec<_> = rows.into_iter().map(|(qv, kv, q_row)| (mapped(k, qv, q_row), kv)).collect();
        for (qv, kv) in &rows {
            let (mut sq, mut sk) = squares(k, qv, kv);
            let mut m = v.lanes / 2;
            while m > 0 {
                sq = k.fadd(sq, k.shfl_xor(sq, m as i64));
                sk = k.fadd(sk, k.shfl_xor(sk, m as i64));
                m /= 2;
            }
            acc.add(k, sq, sk);
        }
    });
}

/// Rows of the tile one per warp at a time, element by element ([`load_row`]; any dtype and
/// head dim): [`norm_rows`] rows per warp and step, all their loads issued before any
/// arithmetic (the kernel is bound by the bytes in flight). A row past the tile repeats the
/// tile's last row (its norms are already in the maxima).
fn scalar_rows<'ctx>(
    k: &Kb<'_, 'ctx>,
    r: &Rows<'_, 'ctx>,
    acc: Maxima<'ctx>,
    (lane, warp): (IntValue<'ctx>, IntValue<'ctx>),
    warps: u32,
) {
    let nrows = norm_rows(r.d);
    let step = k.i32((warps * nrows) as i64);
    k.for_range(k.add(r.i0, warp), r.last, step, |k, i| {
        let rows: Vec<_> = (0..nrows)
            .map(|n| {
                let row = k.smin(k.addc(i, (n * warps) as i64), k.addc(r.last, -1));
                let q_row = r.q_row(k, row);
                let base = k.mul(k.add(r.q_base, k.sext64(q_row)), k.i64(r.d as i64));
                let kbase = k.mul(k.add(r.k_base, k.sext64(row)), k.i64(r.d as i64));
                let at = (q_row, r.bh);
                (
                    load_q_row(k, r.q_map, r.dts.0, r.q, base, lane, r.d, at),
                    load_row(k, r.dts.1, r.k, kbase, lane, r.d),
                )
            })
            .collect();
        for (qv, kv) in &rows {
            let (sq, sk) = squares(k, qv, kv);
            acc.add(k, k.warp_sum(sq), k.warp_sum(sk));
        }
    });
}

/// The norms of tile `m` of head `bh`, over a block of [`NORM_THREADS`]: 16-byte loads
/// ([`vector_rows`]) where the layout allows and q and k are 16-byte aligned (a runtime test:
/// a torch view may start anywhere), element loads ([`scalar_rows`]) otherwise. `t_len` rows of
/// k (and of q, unless `tq` gives fewer queries: then the tiles are the keys', and q's norms of
/// a tile past the queries repeat its last row). q's elements go through `q_map` if given.
#[allow(clippy::too_many_arguments)]
pub(super) fn tile_norms<'ctx>(
    k: &Kb<'_, 'ctx>,
    name: &str,
    (q, kk, q_map): (PointerValue<'ctx>, PointerValue<'ctx>, Option<&QMap>),
    dts: (DType, DType),
    (d, kv_group, bm): (u32, u32, u32),
    (m, bh, t_len): (IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>),
    tq: Option<IntValue<'ctx>>,
    lw: (IntValue<'ctx>, IntValue<'ctx>),
) -> TileNorms<'ctx> {
    let acc = Maxima { q: k.declare_var(k.f32(0.0).into()), k: k.declare_var(k.f32(0.0).into()) };
    let i0 = k.mulc(m, bm as i64);
    let r = Rows {
        q,
        k: kk,
        dts,
        q_base: k.mul(k.sext64(bh), k.sext64(tq.unwrap_or(t_len))),
        k_base: kv_rows(k, bh, t_len, kv_group),
        i0,
        last: k.smin(k.addc(i0, bm as i64), t_len),
        q_last: tq.map(|tq| k.addc(tq, -1)),
        d,
        q_map,
        bh,
    };
    match VecRows::of(d, dts) {
        Some(v) => {
            let addr_bits = k.or(k.ptr_to_i64(q), k.ptr_to_i64(kk));
            let aligned = k.icmpc(IntPredicate::EQ, k.andc(addr_bits, 15), 0);
            k.if_then(aligned, |k| vector_rows(k, v, &r, acc, lw, (NORM_WARPS, bm)));
            k.if_then(k.not(aligned), |k| scalar_rows(k, &r, acc, lw, NORM_WARPS));
        }
        None => scalar_rows(k, &r, acc, lw, NORM_WARPS),
    }
    let vals = [k.use_f(acc.q), k.use_f(acc.k)];
    let r = block_reduce(k, &format!("{name}_max"), &vals, lw, NORM_WARPS, false);
    TileNorms { q: r[0], k: r[1] }
}

/// Tile `m`'s entry of the norms buffer `[BH, Mt, 2]`.
pub(super) fn store_norms<'ctx>(
    k: &Kb<'_, 'ctx>,
    norms: PointerValue<'ctx>,
    (m, bh, mt): (IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>),
    n: &TileNorms<'ctx>,
) {
    let tile = k.add(k.mul(k.sext64(bh), k.sext64(mt)), k.sext64(m));
    k.store_f(DType::F32, norms, k.mulc(tile, 2), n.q);
    k.store_f(DType::F32, norms, k.addc(k.mulc(tile, 2), 1), n.k);
}
#[cfg(test)]
mod tests {
    use super::VecRows;
    use foxc_ir::DType;

    /// 16-byte pieces over a power-of-two number of lanes, for q and k of one dtype only.
    #[test]
    fn vector_rows_cover_a_row_with_whole_16_byte_pieces() {
        let of = |d, dts| VecRows::of(d, dts).map(|v| (v.elems, v.lanes, v.rows));
        let bf = (DType::BF16, DType::BF16);
        assert_eq!(of(128, bf), Some((8, 16, 2)));
        assert_eq!(of(64, bf), Some((8, 8, 4)));
        assert_eq!(of(256, bf), Some((8, 32, 1)));
        assert_eq!(of(64, (DType::F32, DType::F32)), Some((4, 16, 2)));
        assert_eq!(of(96, bf), None, "12 lanes do not divide a warp");
        assert_eq!(of(512, bf), None, "64 lanes per row");
        assert_eq!(of(36, bf), None, "72-byte rows");
        assert_eq!(of(128, (DType::BF16, DType::F32)), None, "two dtypes");
    }
}
