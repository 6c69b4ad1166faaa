//! The kept set proven on the CPU: the block starts the CPU kernels compute equal the reference
//! interpreter's exactly, for every rule of the table (`foxc_passes::rules::RULES`), on fresh random inputs and
//! tiles, including adversarial ones (large norms, hard resets, no decay). `--check`, `run` and
//! `bench` report from the CPU's starts (`cpu_backend::block_starts`), so this is what makes
//! their kept fraction and pruned mass the reference's too.

use foxc_driver::{acp_stats, cpu_backend, pipeline, tensors};
use foxc_driver::{PruneOptions, Target};
use foxc_passes::rules::RULES;
use foxc_runtime::{HostTensor, TensorMap};
use proptest::prelude::*;
use std::path::Path;

fn compile(name: &str) -> foxc_ir::Graph {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples").join(format!("{name}.attn"));
    pipeline::Source::read(&path).unwrap().compile().unwrap().graph
}

/// Make the inputs adversarial: `kind` 1 scales q and k by 8 (large norms), 2 puts hard resets
/// into the gates, 3 removes all decay; 0 leaves the standard workload.
fn perturb(inputs: &mut TensorMap, kind: u32) {
    let map = |t: &HostTensor, f: &dyn Fn(usize, f32) -> f32| {
        let v: Vec<f32> = t.to_f32_vec().iter().enumerate().map(|(i, x)| f(i, *x)).collect();
        HostTensor::from_f32_as(t.dtype, &t.shape, &v)
    };
    let names: Vec<String> = inputs.keys().cloned().collect();
    for n in names {
        let t = inputs[&n].clone();
        let new = match (kind, n.as_str()) {
            (1, "q" | "k") => map(&t, &|_, x| 8.0 * x),
            (2, "fgate") => map(&t, &|i, x| if i % 37 == 36 { -1e4 } else { x }),
            (2, "logf") => map(&t, &|i, x| if i % 37 == 36 { f32::NEG_INFINITY } else { x }),
            (3, "fgate") => map(&t, &|_, _| 40.0),
            (3, "logf") => map(&t, &|_, _| 0.0),
            _ => continue,
        };
        inputs.insert(n, new);
    }
}

#[allow(clippy::too_many_arguments)]
fn case(
    name: &str,
    rule: foxc_ir::PruneRule,
    bm: u32,
    bn: u32,
    h: u64,
    t: u64,
    seed: u64,
    kind: u32,
) -> Vec<f64> {
    let src = compile(name);
    let args = PruneOptions {
        log_eps: -6.0,
        prune_rule: rule.clone(),
        tiles: Some(foxc_ir::Tiles { bm, bn }),
        ..PruneOptions::default()
    };
    let (opt, _) =
        pipeline::optimize(&src, &pipeline::pass_options(&args, Target::Cpu, false).unwrap()).unwrap();
    let dims = pipeline::parse_shape(&format!("B=1,H={h},T={t},D=16")).unwrap();
    let mut inputs = tensors::generate(&src, &dims, seed).unwrap();
    perturb(&mut inputs, kind);
    let what = format!("{name} {} {bm}x{bn} H={h} T={t} seed {seed} kind {kind}", rule.name);
    let cpu =
        cpu_backend::block_starts(&opt, &inputs).unwrap().unwrap_or_else(|| panic!("{what}: not pruned"));
    let reference = acp_stats::measure(&opt, &tensors::to_interp(&inputs)).unwrap().unwrap().start;
    assert_eq!(cpu.shape, reference.shape, "{what}");
    assert_eq!(cpu.data, reference.data, "{what}: the CPU kept a different set of tiles");
    cpu.data
}

/// On the standard workload at T = 2048 the starts are far from trivial, and still equal.
#[test]
fn starts_agree_where_pruning_is_heavy() {
    for r in RULES {
        let st = case("fox", r.rule(), 64, 64, 4, 2048, 1, 0);
        assert!(st.iter().any(|&s| s >= 4.0), "{}: nothing pruned: {st:?}", r.name);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn cpu_block_starts_equal_the_interpreters(
        ex in 0usize..3,
        rule in 0..RULES.len(),
        bm in prop::sample::select(vec![8u32, 16, 32]),
        bn in prop::sample::select(vec![8u32, 16, 64]),
        h in 1u64..4,
        t in 1u64..300,
        seed in any::<u64>(),
        kind in 0u32..4,
    ) {
        let name = ["fox", "fox_loggate", "fox_qknorm"][ex];
        case(name, RULES[rule].rule(), bm, bn, h, t, seed, kind);
    }
}
