//! The GPU plan's launch dependencies (what the runtime may run concurrently) are complete: in
//! the forward and the gradient program of every example the GPU compiles, two launches that
//! share a buffer one of them may write (its node's result, or scratch) are ordered through
//! their dependencies; FoX's gate scan runs in the threshold's launch (paper) or beside its
//! kernels (tight).

use foxc_codegen::nvptx::{BufferKind, KernelArg, NvptxArtifact};
use foxc_driver::grad::grad_program;
use foxc_driver::{cuda_backend, pipeline};
use foxc_driver::{PruneOptions, Target};
use std::collections::BTreeMap;
use std::path::Path;

fn prune(no_prune: bool) -> PruneOptions {
    PruneOptions { no_prune, ..PruneOptions::default() }
}

/// The forward and (when it compiles) gradient artifacts of `example` on sm_90a at D = 64.
fn artifacts(example: &str, no_prune: bool) -> Vec<(String, NvptxArtifact)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples").join(format!("{example}.attn"));
    let src = pipeline::Source::read(&path).unwrap();
    let Ok(c) = src.compile() else { return vec![] };
    let opts = pipeline::pass_options(&prune(no_prune), Target::Sm90a, false).unwrap();
    let Ok((opt, _)) = pipeline::optimize(&c.graph, &opts) else { return vec![] };
    let dims = BTreeMap::from([("D".to_string(), 64), ("H".to_string(), 4), ("G".to_string(), 2)]);
    let mut out = vec![];
    if let Ok(a) = cuda_backend::compile(&opt, &dims, Target::Sm90a) {
        out.push((format!("{example} forward"), a));
    }
    if let Ok(p) = grad_program(&opt, Target::Sm90a) {
        let outs: Vec<_> = p.outputs.iter().map(|(_, v)| *v).collect();
        if let Ok(a) = cuda_backend::compile_outputs(&p.graph, &outs, &dims, Target::Sm90a) {
            out.push((format!("{example} gradient"), a));
        }
    }
    out
}

/// after[i][j]: launch i starts only after launch j (its dependencies, transitively).
fn order(a: &NvptxArtifact) -> Vec<Vec<bool>> {
    let n = a.kernels.len();
    let mut after = vec![vec![false; n]; n];
    for (i, k) in a.kernels.iter().enumerate() {
        for &j in &k.deps {
            assert!(j < i, "{}: launch {i} depends on a later launch {j}", k.name);
            after[i][j] = true;
            let prior = after[j].clone();
            for (x, y) in after[i].iter_mut().zip(prior) {
                *x |= y;
            }
        }
    }
    after
}

/// The buffers launch `k` touches (arguments and zeroed buffers), inputs left out.
fn touched(a: &NvptxArtifact, k: &foxc_codegen::nvptx::KernelInfo) -> Vec<usize> {
    let mut b: Vec<usize> = k
        .args
        .iter()
        .filter_map(|x| match x {
            KernelArg::Buffer(n) => Some(*n),
            _ => None,
        })
        .chain(k.zero_first.iter().copied())
        .filter(|&n| !matches!(a.buffers[n].kind, BufferKind::Param { .. }))
        .collect();
    b.sort_unstable();
    b.dedup();
    b
}

#[test]
fn launches_sharing_a_buffer_are_ordered_by_their_dependencies() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|f| f.strip_suffix(".attn").map(str::to_string))
        .collect();
    names.sort();
    let mut plans = 0;
    for ex in &names {
        for no_prune in [false, true] {
            for (what, a) in artifacts(ex, no_prune) {
                plans += 1;
                let after = order(&a);
                let touched: Vec<Vec<usize>> = a.kernels.iter().map(|k| touched(&a, k)).collect();
                for i in 0..a.kernels.len() {
                    for j in 0..i {
                        // A conflict: a shared buffer that one of them may write (a result of
                        // its node, or scratch); two readers of a value need no order.
                        let writes = |k: usize, b: usize| match &a.buffers[b].kind {
                            BufferKind::Value(v) => v.node == a.kernels[k].node,
                            _ => true,
                        };
                        let shared = touched[i]
                            .iter()
                            .find(|&&b| touched[j].contains(&b) && (writes(i, b) || writes(j, b)));
                        if let Some(b) = shared {
                            assert!(
                                after[i][j],
                                "{what} (no_prune {no_prune}): {} and {} both use buffer {b} but are not ordered",
                                a.kernels[j].name, a.kernels[i].name
                            );
                        }
                    }
                }
            }
        }
    }
    assert!(plans >= 20, "only {plans} plans compiled");
}

#[test]
fn fox_scans_the_gate_in_the_threshold_launch() {
    let (_, a) = artifacts("fox", false).into_iter().next().expect("fox compiles");
    // The default (paper) rule: the threshold is one kernel of tile norms, and the fuse-prelude
    // pass gives it the gate scan too: one launch, then the attention.
    let names: Vec<&str> = a.kernels.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names[0].contains("threshold_with_scan") && names[1].contains("attn_fwd"), "{names:?}");
    assert_eq!(a.kernels[1].deps, [0]);
}

#[test]
fn fox_tight_scans_the_gate_beside_the_threshold() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/fox.attn");
    let c = pipeline::Source::read(&path).unwrap().compile().unwrap();
    let args =
        PruneOptions { prune_rule: foxc_passes::rules::by_name("tight").unwrap(), ..PruneOptions::default() };
    let (opt, _) =
        pipeline::optimize(&c.graph, &pipeline::pass_options(&args, Target::Sm90a, false).unwrap()).unwrap();
    let a = cuda_backend::compile(&opt, &BTreeMap::from([("D".to_string(), 64)]), Target::Sm90a).unwrap();
    let at = |part: &str| a.kernels.iter().position(|k| k.name.contains(part)).unwrap();
    // Row statistics: norms, then deltas, beside the scan.
    let (scan, norms, delta, attn) =
        (at("gate_cumsum"), at("threshold_norms_n"), at("threshold_delta"), at("attn_fwd"));
    let after = order(&a);
    assert!(after[delta][norms]);
    for t in [norms, delta] {
        assert!(!after[t][scan] && !after[scan][t], "the scan and the threshold are independent");
    }
    assert!(after[attn][scan] && after[attn][delta], "the attention reads the scan and the threshold");
    assert_eq!(a.kernels[attn].deps.len(), 2, "{:?}", a.kernels[attn].deps);
}
