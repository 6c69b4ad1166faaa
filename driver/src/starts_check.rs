//! A backend's block starts against the reference's (`foxc run --check-starts`): the kept set
//! proven on the GPU, whose attention kernel searches its starts in-kernel and, in a debug
//! build (`NvptxSpec::debug_starts`), writes them out.
//!
//! Equal starts are the rule. The GPU computes `delta` in f32 where the reference computes it in
//! f64, so a tile whose `c[i0] - c[jend(n)]` lies within rounding of `delta` may be decided the
//! other way: such a mismatch is counted as a near tie (every tile decided differently is within
//! `1e-3 * max(1, |delta|)` of the threshold) and does not fail the check; any other is an error.

use crate::Error;
use foxc_ir::interp::{acp, Tensor};
use foxc_ir::{Attention, Graph, Op, Prune, ValueId};
use std::collections::BTreeMap;

/// What the comparison found.
#[derive(Debug)]
pub struct StartsReport {
    pub tiles: usize,
    pub equal: usize,
    pub near_ties: usize,
    /// The mismatches that are not near ties, described (at most 10).
    pub bad: Vec<String>,
    pub bad_count: usize,
}

/// How close to the threshold a differently decided tile must be to count as a near tie.
fn tie_tolerance(delta: f64) -> f64 {
    1e-3 * delta.abs().max(1.0)
}

/// Compare `got` (`[B, H, Mt]`) with the reference starts of `g`'s pruned attention.
pub fn compare(g: &Graph, inputs: &BTreeMap<String, Tensor>, got: &Tensor) -> Result<StartsReport, Error> {
    let attn = crate::acp_stats::attention_node(g)
        .ok_or_else(|| Error::user("error: --check-starts: no attention in the program"))?;
    let Op::Attention(a) = g.op(attn) else {
        return Err(Error::internal("internal error: not an attention"));
    };
    let ops = Attention::operands(g, attn).map_err(Error::internal)?;
    let tiles = a.tiles.ok_or_else(|| Error::internal("internal error: a pruned attention without tiles"))?;
    // c and delta: the attention's operands (boundary fused) or the block_boundary's.
    let (c, delta): (ValueId, ValueId) = match (a.prune, ops.decay, ops.delta, ops.start) {
        (Prune::Boundary, Some(c), Some(d), _) => (c, d),
        (Prune::Start, _, _, Some(s)) => {
            let o = g.operands(s);
            (o[0], o[1])
        }
        _ => return Err(Error::user("error: --check-starts: the attention is not pruned")),
    };
    let vals = foxc_ir::interp::eval(g, inputs, &[c, delta])
        .map_err(|e| Error::user(format!("error: computing the reference starts: {e}")))?;
    let (c, delta) = (&vals[&c], &vals[&delta]);
    // Keys `t` (c's length) and query rows `tq` (q's; fewer than the keys in a prefill, whose
    // query row i sits at key position i + t - tq).
    let (heads, t) = (c.shape[0] * c.shape[1], c.shape[2]);
    let shapes: Vec<(String, Vec<usize>)> =
        inputs.iter().map(|(k, v)| (k.clone(), v.shape.clone())).collect();
    let q_rows = foxc_ir::shapes::bind_dims(g, &shapes)
        .and_then(|dims| foxc_ir::shapes::concrete_shape(g.ty(ops.q), &dims))
        .map_err(|e| Error::user(format!("error: --check-starts: {e}")))?;
    let tq = q_rows[q_rows.len() - 2];
    let offset = t - tq.min(t);
    let (bm, bn) = (tiles.bm as usize, tiles.bn as usize);
    let mt = tq.div_ceil(bm);
    if got.shape != delta.shape {
        return Err(Error::internal(format!(
            "internal error: the backend's starts are {:?}, the threshold {:?}",
            got.shape, delta.shape
        )));
    }
    let want = acp::boundary(&c.data, &delta.data, heads, tq, bm, bn);
    let mut r = StartsReport { tiles: want.len(), equal: 0, near_ties: 0, bad: vec![], bad_count: 0 };
    for bh in 0..heads {
        let cr = &c.data[bh * t..(bh + 1) * t];
        for m in 0..mt {
            let k = bh * mt + m;
            let (sr, sg) = (want[k], got.data[k]);
            if sr == sg {
                r.equal += 1;
                continue;
            }
            let dl = delta.data[k];
            let i0 = m * bm + offset;
            // The tiles decided differently: the lower start's tile, and for a later backend start
            // every tile in between that the reference keeps.
            let near = |n: usize| {
                let jend = (n * bn + bn - 1).min(t - 1);
                (cr[i0] - cr[jend] - dl).abs() <= tie_tolerance(dl)
            };
            let ok = sg.is_finite()
                && sg >= 0.0
                && sg.fract() == 0.0
                && if sg < sr { near(sg as usize) } else { (sr as usize..sg as usize).all(near) };
            if ok {
                r.near_ties += 1;
            } else {
                r.bad_count += 1;
                if r.bad.len() < 10 {
                    r.bad.push(format!("head {bh} tile {m}: start {sg}, reference {sr} (delta {dl:.6})"));
                }
            }
        }
    }
    Ok(r)
}

/// The block starts the GPU attention kernel of `opt` finds in-kernel on `inputs` (a debug
/// build, one more run), and their comparison with the reference's.
pub fn gpu_starts(
    opt: &Graph,
    inputs: &foxc_runtime::TensorMap,
    interp_inputs: &BTreeMap<String, Tensor>,
) -> Result<(Tensor, StartsReport), Error> {
    let out = opt.output.ok_or_else(|| Error::user("error: the program has no output"))?;
    let outs = [("out".to_string(), foxc_ir::Value::of(out))];
    let mut m = crate::cuda_backend::run_debug_starts(opt, &outs, inputs, Default::default())?;
    let t = m.remove("debug_starts").ok_or_else(|| Error::internal("internal error: no debug starts"))?;
    let got = Tensor { shape: t.shape.clone(), data: t.to_f64_vec() };
    let r = compare(opt, interp_inputs, &got)?;
    Ok((got, r))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pruned_fox() -> (Graph, BTreeMap<String, Tensor>) {
        pruned(crate::pipeline::Source::embedded_default(), "B=1,H=4,T=256,D=16")
    }

    /// `src` optimized for sm_90a with 16x16 tiles, and seeded inputs at `shape`.
    fn pruned(src: crate::pipeline::Source, shape: &str) -> (Graph, BTreeMap<String, Tensor>) {
        let c = src.compile().unwrap();
        let args = crate::PruneOptions {
            tiles: Some(foxc_ir::Tiles { bm: 16, bn: 16 }),
            ..crate::PruneOptions::default()
        };
        let opts = crate::pipeline::pass_options(&args, crate::Target::Sm90a, false).unwrap();
        let (opt, _) = crate::pipeline::optimize(&c.graph, &opts).unwrap();
        let dims = crate::pipeline::parse_shape(shape).unwrap();
        let x = crate::tensors::generate(&c.graph, &dims, 3).unwrap();
        (opt, crate::tensors::to_interp(&x))
    }

    #[test]
    fn the_reference_agrees_with_itself_and_a_shifted_start_fails() {
        let (g, x) = pruned_fox();
        let st = crate::acp_stats::measure(&g, &x).unwrap().unwrap().start;
        let r = compare(&g, &x, &st).unwrap();
        assert_eq!((r.equal, r.near_ties, r.bad_count), (r.tiles, 0, 0), "{r:?}");
        // A start moved by one tile where that is far from a tie is an error.
        let mut moved = st.clone();
        let k = (0..st.data.len()).find(|&k| st.data[k] >= 2.0).expect("some tile prunes");
        moved.data[k] -= 2.0;
        let r = compare(&g, &x, &moved).unwrap();
        assert_eq!(r.bad_count, 1, "{r:?}");
        // An unwritten (poisoned) start is an error too.
        let mut poisoned = st.clone();
        poisoned.data[0] = -1.0;
        assert_eq!(compare(&g, &x, &poisoned).unwrap().bad_count, 1);
    }

    /// Queries fewer than keys: the starts are per query tile, each at its key position (this
    /// panicked, reading 70 / 16 query tiles as 256 / 16).
    #[test]
    fn a_prefill_compares_per_query_tile() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/fox_prefill.attn");
        let (g, x) = pruned(crate::pipeline::Source::read(&path).unwrap(), "B=1,H=4,N=70,M=256,D=16");
        let st = crate::acp_stats::measure(&g, &x).unwrap().unwrap().start;
        assert_eq!(st.shape, [1, 4, 5]);
        let r = compare(&g, &x, &st).unwrap();
        assert_eq!((r.equal, r.bad_count), (20, 0), "{r:?}");
        let mut moved = st.clone();
        let k = (0..st.data.len()).find(|&k| st.data[k] >= 2.0).expect("some tile prunes");
        moved.data[k] -= 2.0;
        assert_eq!(compare(&g, &x, &moved).unwrap().bad_count, 1);
    }
}
