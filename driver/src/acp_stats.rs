//! What pruning kept, measured on real inputs: the kept-tile fraction and the kept work.
//!
//! Only the cheap prefix of the optimized graph runs here (gate cumsum, threshold, block
//! boundary, through the reference interpreter): never the attention itself.

use crate::Error;
use foxc_ir::attention::AttnOperands;
use foxc_ir::interp::region::{Capture, RegionEval};
use foxc_ir::interp::Tensor;
use foxc_ir::shapes::DimBindings;
use foxc_ir::{Attention, Dim, Graph, Mask, Op, Prune, Tiles, ValueId};
use std::collections::BTreeMap;

/// Pruning statistics of one attention node.
#[derive(Clone, Debug)]
pub struct AcpStats {
    pub bm: u32,
    pub bn: u32,
    /// Kept causal key tiles over all causal key tiles.
    pub kept_tile_fraction: f64,
    /// Kept (query, key) pairs over causal pairs.
    pub kept_pair_fraction: f64,
    /// FLOPs of the attention on kept pairs: `4 * D` per pair (QK^T and PV).
    pub kept_flops: f64,
    pub dense_flops: f64,
    /// The first kept key tile per (b, h, query tile), `[B, H, Mt]`.
    pub start: Tensor,
    /// The lengths of the queries and the keys (queries sit at the end of the keys).
    pub queries: u64,
    pub keys: u64,
    /// The first key tile the key bound lets each (b, h, query tile) start at, as `start`.
    key_bound: Option<Vec<u64>>,
}

impl AcpStats {
    /// The key tiles the kernels walk for query tile `m` of the flat batch-head `bh`,
    /// `first..=last`: from the later of the pruned start and the key bound's tile, never past
    /// the tile of the tile's last row's diagonal (its key position `i + keys - queries`).
    pub fn walk(&self, bh: usize, m: usize) -> (u64, u64) {
        let mt = self.queries.div_ceil(self.bm as u64) as usize;
        let at = bh * mt + m;
        let last_row = ((m as u64 + 1) * self.bm as u64).min(self.queries) - 1;
        let diag = (last_row + self.keys.saturating_sub(self.queries)) / self.bn as u64;
        let s = self.start.data[at] as u64;
        let s = self.key_bound.as_ref().map_or(s, |kb| s.max(kb[at]).min(diag));
        (s, diag)
    }
}

/// Why the reference interpreter cannot give the statistics of a run on `inputs`: a tensor of
/// more than its [`foxc_ir::interp::MAX_ELEMENTS`] elements (a decode step of 8 sequences of 32k
/// keys). The kernels run at such sizes all the same; `None` when the interpreter can.
pub fn beyond_reference(inputs: &foxc_runtime::TensorMap) -> Option<String> {
    let elements = |shape: &[usize]| shape.iter().map(|&d| d as u128).product::<u128>();
    inputs.iter().find(|(_, t)| elements(&t.shape) > foxc_ir::interp::MAX_ELEMENTS).map(|(name, t)| {
        format!("input `{name}` {:?} is beyond the reference interpreter's 2^28 elements", t.shape)
    })
}

/// The attention node of an optimized graph: pruned, dense, or none.
pub fn attention_node(g: &Graph) -> Option<ValueId> {
    g.find(|op| matches!(op, Op::Attention(_))).into_iter().next()
}

/// Dense work of an attention node (causal pairs, window applied) when nothing is pruned.
fn pairs_for_row(i: u64, first_key: u64) -> u64 {
    i + 1 - first_key.min(i + 1)
}

/// Per (b, h, query tile), the first key tile the kernels may start at under the attention's
/// key bound `keys_from` (every key `j < E(b, h, i)` of row `i` is masked), `None` without one:
/// the tile of the smallest `E` over the tile's rows, NaN rows left out, clamped to `[0, Tk]`,
/// as the kernels compute it (codegen: cpu/attention.rs, nvptx/attention/key_bound.rs).
fn key_bound_tiles(
    g: &Graph,
    a: &Attention,
    ops: &AttnOperands,
    (inputs, dims): (&BTreeMap<String, Tensor>, &DimBindings),
    [b, h, t, tk]: [u64; 4],
    tiles: Tiles,
) -> Result<Option<Vec<u64>>, Error> {
    let Some(e) = &a.keys_from else { return Ok(None) };
    let vals = foxc_ir::interp::eval(g, inputs, &ops.captures)
        .map_err(|e| Error::user(format!("error: evaluating the key bound's captures: {e}")))?;
    let caps: Vec<Capture> =
        ops.captures.iter().map(|c| Capture { shape: &vals[c].shape, data: &vals[c].data }).collect();
    let dim = |d: &Dim| dims.eval(d);
    let mut ev = RegionEval::new(e, &caps, &dim).map_err(Error::internal)?;
    let (bm, bn) = (tiles.bm as u64, tiles.bn as u64);
    let mut out = Vec::with_capacity((b * h * t.div_ceil(bm)) as usize);
    for bi in 0..b as usize {
        for hi in 0..h as usize {
            for m in 0..t.div_ceil(bm) {
                let rows = m * bm..((m + 1) * bm).min(t);
                let e_min = rows
                    .map(|i| ev.eval(0.0, [bi, hi, i as usize, 0]))
                    .filter(|x| !x.is_nan())
                    .fold(f64::INFINITY, f64::min);
                out.push(e_min.clamp(0.0, tk as f64).floor() as u64 / bn);
            }
        }
    }
    Ok(Some(out))
}

/// Statistics for the attention node of `g` on `inputs` (None when there is none), with the
/// interpreter's block starts.
pub fn measure(g: &Graph, inputs: &BTreeMap<String, Tensor>) -> Result<Option<AcpStats>, Error> {
    measure_with(g, inputs, None)
}

/// [`measure`] with the block starts a backend reported (`[B, H, Mt]`): the kept fraction and
/// kept work of what that backend ran.
pub fn measure_with(
    g: &Graph,
    inputs: &BTreeMap<String, Tensor>,
    given: Option<&Tensor>,
) -> Result<Option<AcpStats>, Error> {
    let Some(attn) = attention_node(g) else { return Ok(None) };
    let Op::Attention(a) = g.op(attn) else { unreachable!("attention_node returns attention ops") };
    let ops = Attention::operands(g, attn).map_err(Error::internal)?;
    let tiles = a.tiles.unwrap_or(foxc_ir::Tiles { bm: 64, bn: 64 });
    // q's and k's sizes from their types under the inputs' dims (q may be a load map over a
    // large tensor: evaluated only where the block starts need it).
    let shapes: Vec<(String, Vec<usize>)> =
        inputs.iter().map(|(n, v)| (n.clone(), v.shape.clone())).collect();
    let dims = foxc_ir::shapes::bind_dims_partial(g, &shapes)
        .map_err(|e| Error::user(format!("error: binding the dims of q and k: {e}")))?;
    let size = |v: ValueId, axis: usize| {
        g.ty(v).dims().nth(axis).and_then(|d| dims.eval(d)).ok_or_else(|| {
            Error::internal(format!("the inputs do not bind axis {axis} of the attention's %{}", v.index()))
        })
    };
    let (b, h, t, d) = (size(ops.q, 0)?, size(ops.q, 1)?, size(ops.q, 2)?, size(ops.q, 3)?);
    let tk = size(ops.k, 2)?;
    // Query row i sits at key position i + Tk - Tq.
    let offset = tk.saturating_sub(t);
    // The block starts, from the values they derive from (evaluated together).
    let eval = |vs: &[ValueId]| {
        foxc_ir::interp::eval(g, inputs, vs)
            .map_err(|e| Error::user(format!("error: evaluating the block starts: {e}")))
    };
    let start = match (a.prune, ops.start, ops.delta, ops.decay) {
        (Prune::Dense, ..) => None,
        _ if given.is_some() => given.cloned(),
        (Prune::Start, Some(s), _, _) => eval(&[s])?.remove(&s),
        (Prune::Boundary, _, Some(dl), Some(c)) => {
            let vals = eval(&[c, dl])?;
            let (c, dl) = (&vals[&c], &vals[&dl]);
            let heads = c.shape[0] * c.shape[1];
            let data = foxc_ir::interp::acp::boundary(
                &c.data,
                &dl.data,
                heads,
                t as usize,
                tiles.bm as usize,
                tiles.bn as usize,
            );
            Some(Tensor { shape: dl.shape.clone(), data })
        }
        _ => None,
    };
    let window = match a.mask {
        Mask::Window(w) => Some(w),
        _ => None,
    };
    let mt = t.div_ceil(tiles.bm as u64);
    let key_bound = key_bound_tiles(g, a, &ops, (inputs, &dims), [b, h, t, tk], tiles)?;
    let start = start.unwrap_or_else(|| Tensor {
        shape: vec![b as usize, h as usize, mt as usize],
        data: vec![0.0; (b * h * mt) as usize],
    });
    let mut stats = AcpStats {
        bm: tiles.bm,
        bn: tiles.bn,
        kept_tile_fraction: 0.0,
        kept_pair_fraction: 0.0,
        kept_flops: 0.0,
        dense_flops: 0.0,
        start,
        queries: t,
        keys: tk,
        key_bound,
    };
    let (mut kept_tiles, mut all_tiles, mut kept_pairs, mut all_pairs) = (0u64, 0u64, 0u64, 0u64);
    for bh in 0..b * h {
        for m in 0..mt {
            let i0 = m * tiles.bm as u64;
            let last = (i0 + tiles.bm as u64 - 1).min(t - 1);
            let (s, diag) = stats.walk(bh as usize, m as usize);
            kept_tiles += diag + 1 - s.min(diag + 1);
            all_tiles += diag + 1;
            for i in i0 + offset..=last + offset {
                let window_first = window.map_or(0, |w| (i + 1).saturating_sub(w));
                all_pairs += pairs_for_row(i, window_first);
                kept_pairs += pairs_for_row(i, window_first.max(s * tiles.bn as u64));
            }
        }
    }
    stats.kept_tile_fraction = kept_tiles as f64 / all_tiles.max(1) as f64;
    stats.kept_pair_fraction = kept_pairs as f64 / all_pairs.max(1) as f64;
    stats.kept_flops = 4.0 * d as f64 * kept_pairs as f64;
    stats.dense_flops = 4.0 * d as f64 * all_pairs as f64;
    Ok(Some(stats))
}

#[cfg(test)]
mod tests {
    use super::beyond_reference;
    use foxc_ir::DType;
    use foxc_runtime::{HostTensor, TensorMap};

    /// A prefill's walks end at its queries' diagonal tiles, at the end of the keys (N = 70
    /// queries of M = 256 keys, 16x16 tiles: query tile m ends at key tile (16 m + 15 + 186) /
    /// 16, the last one at tile 15), never begin past it, and begin at or after the key bound's
    /// tile (a padded start: `bench/fox_pad_window_prefill.attn`'s window of 256 reaches back
    /// past key 0 here, so its start decides). Shown failing with `foxc mask` drawing a prefill's
    /// diagonal at its rows (`last = 16 m + 15`, key tiles 0..=4).
    #[test]
    fn a_prefill_walks_to_its_queries_key_positions() {
        for (file, bounded) in [("fox_prefill.attn", false), ("fox_pad_window_prefill.attn", true)] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench").join(file);
            let c = crate::pipeline::Source::read(&path).unwrap().compile().unwrap();
            let args = crate::PruneOptions {
                tiles: Some(foxc_ir::Tiles { bm: 16, bn: 16 }),
                ..crate::PruneOptions::default()
            };
            let opts = crate::pipeline::pass_options(&args, crate::Target::Cpu, false).unwrap();
            let (g, _) = crate::pipeline::optimize(&c.graph, &opts).unwrap();
            let dims = crate::pipeline::parse_shape("B=2,H=2,N=70,M=256,D=16").unwrap();
            let x = crate::tensors::generate(&c.graph, &dims, 5).unwrap();
            let x = crate::tensors::to_interp(&x);
            let s = super::measure(&g, &x).unwrap().unwrap();
            assert_eq!((s.queries, s.keys), (70, 256));
            for bh in 0..4 {
                for m in 0..5 {
                    let (first, last) = s.walk(bh, m);
                    assert_eq!(last, ((16 * m as u64 + 15).min(69) + 186) / 16, "{file} bh {bh} m {m}");
                    assert!(first <= last, "{file}");
                    if bounded {
                        let start = x["start"].data[bh / 2] as u64;
                        assert!(
                            first >= (start / 16).min(last),
                            "{file} bh {bh} m {m}: {first} < start {start}"
                        );
                    }
                }
            }
        }
    }

    /// A decode step of 8 sequences of 32k keys (k and v of 2^29 elements) is beyond the
    /// interpreter; a tensor at its limit is not. (The zeros are never read: only shapes count.)
    #[test]
    fn a_tensor_beyond_the_interpreter_is_named() {
        let mut m = TensorMap::new();
        m.insert("q".into(), HostTensor::zeros(DType::BF16, &[8, 16, 1, 128]));
        m.insert("c".into(), HostTensor::zeros(DType::F32, &[1 << 14, 1 << 14]));
        assert_eq!(beyond_reference(&m), None);
        m.insert("k".into(), HostTensor::zeros(DType::BF16, &[8, 16, 32768, 128]));
        let why = beyond_reference(&m).expect("k is beyond 2^28 elements");
        assert!(why.contains("input `k` [8, 16, 32768, 128]"), "{why}");
    }
}
