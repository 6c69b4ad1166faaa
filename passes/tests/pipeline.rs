//! The pass pipeline on the examples and the FoX spellings: IR snapshots after every pass,
//! spellings that must all reach the same pruned node, refusals with explanations, options.

mod common;

use common::{all_passes, compile, root, run};
use foxc_ir::print::print_graph;
use foxc_ir::{Attention, Graph, NormBound, Op, Prelude, Prune, ScoreBound, ThresholdPlan};
use foxc_passes::rules::{by_name, RULES};
use foxc_passes::{tiles_for, PassOptions, Target};
use std::collections::BTreeMap;

const EXAMPLES: &[&str] = &[
    "fox",
    "fox_loggate",
    "fox_qknorm",
    "fox_softcap",
    "fox_gqa",
    "fox_alibi",
    "fox_keybias",
    "fox_handwritten",
    "fox_cache",
    "fox_sinks",
    "alibi",
    "alibi_m",
    "causal",
    "window",
    "local_bidir",
    "refuse_growing_bias",
    "refuse_growing_cumsum",
    "refuse_noncausal",
    "refuse_wrong_axis",
];

/// Examples that must end in a pruned `attention`.
const PRUNED: &[&str] = &[
    "fox",
    "fox_loggate",
    "fox_qknorm",
    "fox_softcap",
    "fox_gqa",
    "fox_alibi",
    "fox_keybias",
    "fox_handwritten",
    "fox_cache",
    "fox_sinks",
    "alibi",
    "alibi_m",
];

/// The score bound each pruned example's threshold carries (static: no pass over the data).
const BOUNDS: &[(&str, ScoreBound)] = &[
    ("fox", ScoreBound::IDENTITY),
    ("fox_softcap", ScoreBound::Static(20.0)),
    ("fox_keybias", ScoreBound::Data { gain: 1.0, extra: 4.0 }),
    ("fox_alibi", ScoreBound::IDENTITY),
    ("fox_gqa", ScoreBound::IDENTITY),
];

#[test]
fn thresholds_carry_the_region_bound() {
    for (ex, want) in BOUNDS {
        let (o, _) = run(&compile(&format!("examples/{ex}.attn")), &PassOptions::default());
        let th = o.find(|op| matches!(op, Op::Threshold { .. }));
        assert_eq!(th.len(), 1, "{ex}");
        let Op::Threshold { score, .. } = o.op(th[0]) else { unreachable!() };
        assert_eq!(score, want, "{ex}");
    }
}

fn count(g: &Graph, pred: impl Fn(&Op) -> bool) -> usize {
    g.find(pred).len()
}

fn is_pruned(g: &Graph) -> bool {
    count(g, |op| matches!(op, Op::Attention(a) if a.prune != Prune::Dense)) == 1
}

/// The IR after every pass, the explanations with the source text they point at.
fn report_text(rel: &str) -> String {
    let g = compile(rel);
    let src = std::fs::read_to_string(root().join(rel)).unwrap();
    let (_, report) = run(&g, &all_passes());
    let mut s = String::new();
    for (pass, ir) in &report.dumps {
        s.push_str(&format!("// ---- after {pass}\n{ir}"));
    }
    for e in &report.explanations {
        let text = src.get(e.span.range()).unwrap_or("<bad span>");
        s.push_str(&format!("// explain: {}\n//   at `{}`\n", e.message, text));
        if let Some(h) = &e.hint {
            s.push_str(&format!("//   hint: {h}\n"));
        }
    }
    s
}

#[test]
fn ir_after_every_pass_of_every_example() {
    for ex in EXAMPLES {
        let text = report_text(&format!("examples/{ex}.attn"));
        insta::assert_snapshot!(format!("example_{ex}"), text);
    }
}

#[test]
fn examples_prune_exactly_where_expected() {
    for ex in EXAMPLES {
        let g = compile(&format!("examples/{ex}.attn"));
        let (o, report) = run(&g, &PassOptions::default());
        let want = PRUNED.contains(ex);
        assert_eq!(is_pruned(&o), want, "{ex}: pruned = {}\n{}", is_pruned(&o), print_graph(&o));
        if !want {
            assert!(!report.explanations.is_empty(), "{ex} is not pruned but nothing explains why");
        }
    }
}

#[test]
fn fused_node_is_recognized_where_expected() {
    // Everything but softmax over the wrong axis becomes one fused node (no mask: dense).
    for ex in EXAMPLES {
        let g = compile(&format!("examples/{ex}.attn"));
        let (o, _) = run(&g, &PassOptions { prune: false, ..PassOptions::default() });
        let fused = count(&o, |op| matches!(op, Op::Attention(_)));
        let want = usize::from(*ex != "refuse_wrong_axis");
        assert_eq!(fused, want, "{ex}\n{}", print_graph(&o));
        if want == 1 {
            assert_eq!(count(&o, |op| matches!(op, Op::Softmax { .. } | Op::Reduce { .. })), 0, "{ex}");
        }
    }
}

fn spellings() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root().join("tests/spellings"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".attn"))
        .map(|n| format!("tests/spellings/{n}"))
        .collect();
    v.sort();
    v
}

/// Every spelling `tests/spellings/*.attn` of attention `@name` optimizes to exactly the graph
/// of `examples/name.attn` (FoX and ALiBi), for both threshold rules, with nothing to explain.
#[test]
fn all_spellings_reach_the_same_pruned_node_as_their_example() {
    let files = spellings();
    assert!(files.len() >= 15, "need at least 15 spellings, found {}", files.len());
    let mut per_example = std::collections::BTreeMap::<String, usize>::new();
    for f in &files {
        let g = compile(f);
        let example = format!("examples/{}.attn", g.name);
        *per_example.entry(g.name.clone()).or_default() += 1;
        for rule in RULES.iter().map(|r| r.rule()) {
            let name = rule.name.clone();
            let opts = PassOptions { rule, ..PassOptions::default() };
            let (want, _) = run(&compile(&example), &opts);
            assert!(is_pruned(&want), "{example} is not pruned");
            let (o, report) = run(&g, &opts);
            assert_eq!(print_graph(&o), print_graph(&want), "{f} differs from {example} ({name})");
            assert!(report.explanations.is_empty(), "{f}: {:?}", report.explanations);
        }
    }
    assert!(per_example["fox"] >= 13 && per_example["alibi"] >= 2, "{per_example:?}");
}

#[test]
fn refusals_stay_dense_and_explain_at_the_right_place() {
    let cases = [
        ("refuse_growing_bias", "slope[h]", "ALiBi slope"),
        ("refuse_growing_cumsum", "g[b, h, t]", "log forget gate"),
        ("refuse_noncausal", "softmax(j, s[b, h, i, j])", "not causally masked"),
        ("refuse_wrong_axis", "causal(i, j, s[b, h, i, j])", "softmax is taken over `i`"),
    ];
    for (ex, at, says) in cases {
        let rel = format!("examples/{ex}.attn");
        let src = std::fs::read_to_string(root().join(&rel)).unwrap();
        let (o, report) = run(&compile(&rel), &PassOptions::default());
        assert!(!is_pruned(&o), "{ex} was pruned");
        let e = report.explanations.iter().find(|e| e.message.contains(says));
        let e =
            e.unwrap_or_else(|| panic!("{ex}: no explanation saying {says:?}: {:?}", report.explanations));
        let text = &src[e.span.range()];
        assert!(text.contains(at), "{ex}: explanation points at `{text}`, expected it to contain `{at}`");
        assert!(e.hint.is_some(), "{ex}: explanation without a hint");
    }
}

#[test]
fn no_prune_keeps_dense_attention() {
    for ex in PRUNED {
        let (o, report) = run(
            &compile(&format!("examples/{ex}.attn")),
            &PassOptions { prune: false, ..PassOptions::default() },
        );
        assert_eq!(count(&o, |op| matches!(op, Op::Attention(a) if a.prune == Prune::Dense)), 1, "{ex}");
        assert!(!is_pruned(&o));
        assert_eq!(count(&o, |op| matches!(op, Op::Threshold { .. } | Op::BlockBoundary(_))), 0);
        assert!(report.explanations.iter().any(|e| e.message.contains("--no-prune")));
    }
}

/// `fuse-prelude`: one launch for the gate scan and the threshold where the threshold is one
/// kernel of tile norms (paper, local under a data bound) and the decay is a scanned gate.
#[test]
fn gpu_preludes_are_joint_where_scan_and_threshold_fit_one_launch() {
    let prelude = |ex: &str, target, rule: &str| {
        let opts = PassOptions { target, rule: by_name(rule).unwrap(), ..PassOptions::default() };
        let (o, _) = run(&compile(&format!("examples/{ex}.attn")), &opts);
        let pa = o.find(|op| matches!(op, Op::Attention(_)));
        let Op::Attention(a) = o.op(pa[0]) else { unreachable!() };
        a.prelude
    };
    let (gpu, cpu) = (Target::Sm90a, Target::Cpu);
    assert_eq!(prelude("fox", gpu, "paper"), Prelude::Joint);
    assert_eq!(prelude("fox", Target::Sm80, "local"), Prelude::Joint);
    assert_eq!(prelude("fox_loggate", gpu, "paper"), Prelude::Joint);
    assert_eq!(prelude("fox_gqa", gpu, "paper"), Prelude::Joint);
    assert_eq!(prelude("fox", cpu, "paper"), Prelude::Launches, "the CPU runs kernels in order");
    assert_eq!(prelude("fox", gpu, "tight"), Prelude::Launches, "row statistics: two kernels");
    assert_eq!(
        prelude("fox_softcap", gpu, "paper"),
        Prelude::Launches,
        "a static score bound reads no norms"
    );
    assert_eq!(prelude("alibi", gpu, "paper"), Prelude::Launches, "slopes are not scanned");
}

/// `fuse-prelude` splits the gate's rows over the joint launch's blocks when T is bound above
/// one scan segment; with T unbound (the Python op) or at most one segment, the rows stay whole.
#[test]
fn joint_prelude_splits_rows_known_to_be_long() {
    let prelude = |dims: &[(&str, u64)]| {
        let dims = dims.iter().map(|&(k, v)| (k.to_string(), v)).collect();
        let opts = PassOptions { target: Target::Sm90a, dims, ..PassOptions::default() };
        let (o, _) = run(&compile("examples/fox.attn"), &opts);
        let Op::Attention(a) = o.op(o.find(|op| matches!(op, Op::Attention(_)))[0]) else { unreachable!() };
        a.prelude
    };
    let above = foxc_passes::fuse_out::SPLIT_ROWS_ABOVE;
    assert_eq!(prelude(&[("D", 128)]), Prelude::Joint, "T unbound");
    assert_eq!(prelude(&[("D", 128), ("T", above)]), Prelude::Joint);
    assert_eq!(prelude(&[("D", 128), ("T", above + 1)]), Prelude::JointSplitRows);
    assert_eq!(prelude(&[("B", 1), ("H", 16), ("T", 32768), ("D", 64)]), Prelude::JointSplitRows);
}

/// With T unbound, a lower bound the caller guarantees (`dims_at_least`) decides the split as a
/// bound T does; `split_rows_bounds` gives that bound exactly for the row lengths above one
/// segment, so a caller keyed on it (the Python op) gets one plan per class of T.
#[test]
fn joint_prelude_splits_rows_known_to_be_at_least_long() {
    let above = foxc_passes::fuse_out::SPLIT_ROWS_ABOVE;
    let opts = |at_least: BTreeMap<String, u64>| PassOptions {
        target: Target::Sm90a,
        dims: [("D".to_string(), 64)].into(),
        dims_at_least: at_least,
        ..PassOptions::default()
    };
    let prelude = |o: &foxc_ir::Graph| {
        let Op::Attention(a) = o.op(o.find(|op| matches!(op, Op::Attention(_)))[0]) else { unreachable!() };
        a.prelude
    };
    for ex in ["fox", "fox_gqa", "fox_loggate"] {
        let (whole, _) = run(&compile(&format!("examples/{ex}.attn")), &opts(BTreeMap::new()));
        assert_eq!(prelude(&whole), Prelude::Joint, "{ex}: T unbound, nothing known");
        let bounds = |t: u64| foxc_passes::fuse_out::split_rows_bounds(&whole, &|s| (s == "T").then_some(t));
        assert_eq!(bounds(above), BTreeMap::new(), "{ex}: one segment");
        assert_eq!(bounds(above + 1), [("T".to_string(), above + 1)].into(), "{ex}");
        let (split, _) = run(&compile(&format!("examples/{ex}.attn")), &opts(bounds(65536)));
        assert_eq!(prelude(&split), Prelude::JointSplitRows, "{ex}: T > {above} guaranteed");
    }
}

/// A gate scan outside a joint prelude (a decode step's: its threshold runs in two launches)
/// splits its rows over a block per segment on GPU targets when its rows are known (bound, or
/// at least, as the Python op keys them) to be longer than one segment; the CPU, a short or
/// unknown row, a joint prelude's scan and a slope keep one scan per row.
#[test]
fn a_lone_gate_scan_splits_rows_known_to_be_long() {
    let above = foxc_passes::fuse_out::SPLIT_ROWS_ABOVE;
    let split = |path: &str, target: Target, dims: &[(&str, u64)], at_least: &[(&str, u64)]| {
        let owned = |d: &[(&str, u64)]| d.iter().map(|&(k, v)| (k.to_string(), v)).collect();
        let opts = PassOptions {
            target,
            dims: owned(dims),
            dims_at_least: owned(at_least),
            ..PassOptions::default()
        };
        let (o, _) = run(&compile(path), &opts);
        let scans = o.find(|op| matches!(op, Op::GateCumsum { .. }));
        scans.iter().any(|&n| matches!(o.op(n), Op::GateCumsum { split_rows: true, .. }))
    };
    let decode = "bench/fox_prefill.attn";
    let long = [("D", 128), ("N", 1), ("M", above + 1)];
    assert!(split(decode, Target::Sm90a, &long, &[]));
    assert!(split(decode, Target::Sm80, &long, &[]));
    assert!(!split(decode, Target::Cpu, &long, &[]), "the CPU scans in order");
    assert!(!split(decode, Target::Sm90a, &[("D", 128), ("N", 1), ("M", above)], &[]), "one segment");
    assert!(!split(decode, Target::Sm90a, &[("D", 128), ("N", 1)], &[]), "M unknown");
    assert!(split(decode, Target::Sm90a, &[("D", 128), ("N", 1)], &[("M", above + 1)]), "M at least");
    // The Python op's key: the bound it reads off the graph optimized without one.
    let opts = PassOptions {
        target: Target::Sm90a,
        dims: [("D".to_string(), 128)].into(),
        ..PassOptions::default()
    };
    let (whole, _) = run(&compile(decode), &opts);
    let bounds = |m: u64| foxc_passes::fuse_out::split_rows_bounds(&whole, &|s| (s == "M").then_some(m));
    assert_eq!(bounds(above + 7), [("M".to_string(), above + 1)].into());
    assert_eq!(bounds(above), BTreeMap::new());
    // A joint prelude splits its own scan (prelude = joint(split rows)); a slope has no scan.
    let square = [("D", 128), ("T", above + 1)];
    assert!(!split("examples/fox.attn", Target::Sm90a, &square, &[]), "the joint launch scans");
    assert!(!split("examples/alibi.attn", Target::Sm90a, &square, &[]));
}

/// `fuse-threshold`: on GPU targets a threshold of tile norms only (paper, local under a data
/// bound) is one launch; row statistics (tight), a static bound (the softcap's region reads no
/// norms) and the CPU keep the default. The IR prints the decision.
#[test]
fn gpu_thresholds_of_norms_only_are_one_launch() {
    let plan = |ex: &str, target, rule: &str| {
        let opts = PassOptions { target, rule: by_name(rule).unwrap(), ..PassOptions::default() };
        let (o, _) = run(&compile(&format!("examples/{ex}.attn")), &opts);
        let th = o.find(|op| matches!(op, Op::Threshold { .. }));
        let Op::Threshold { plan, .. } = o.op(th[0]) else { unreachable!() };
        (*plan, print_graph(&o).contains("plan = one_launch"))
    };
    let (gpu, cpu) = (Target::Sm90a, Target::Cpu);
    let (one, two) = ((ThresholdPlan::OneLaunch, true), (ThresholdPlan::NormsThenDelta, false));
    assert_eq!(plan("fox", gpu, "paper"), one);
    assert_eq!(plan("fox", Target::Sm80, "local"), one);
    assert_eq!(plan("alibi", gpu, "paper"), one, "a slope gate's threshold is one launch too");
    assert_eq!(plan("fox", gpu, "tight"), two, "row statistics");
    assert_eq!(plan("fox_softcap", gpu, "paper"), two, "a static score bound reads no norms");
    assert_eq!(plan("fox", cpu, "paper"), two, "the CPU ignores it");
}

#[test]
fn options_reach_the_attributes() {
    let g = compile("examples/fox_qknorm.attn");
    for (target, rule, log_eps) in [
        (Target::Cpu, by_name("paper").unwrap(), -10.0),
        (Target::Sm90a, by_name("tight").unwrap(), -7.5),
        (Target::Sm80, by_name("paper").unwrap(), -3.0),
    ] {
        let opts = PassOptions { target, rule: rule.clone(), log_eps, ..PassOptions::default() };
        let (o, _) = run(&g, &opts);
        let tiles = tiles_for(target, None, false);
        let th = o.find(|op| matches!(op, Op::Threshold { .. }));
        let Op::Threshold { rule: r, log_eps: l, bound, bm, .. } = o.op(th[0]).clone() else {
            unreachable!()
        };
        assert_eq!((r, l, bm), (rule, log_eps, tiles.bm));
        // The rmsnorm weights are data (no declared range): the bound reads the data.
        assert_eq!(bound, NormBound::Data);
        let bb = o.find(|op| matches!(op, Op::BlockBoundary(_)));
        let pa = o.find(|op| matches!(op, Op::Attention(a) if a.prune != Prune::Dense));
        let Op::Attention(a) = o.op(pa[0]) else { unreachable!() };
        assert_eq!(a.tiles, Some(tiles));
        // The CPU runs block_boundary as its own kernel; GPU targets fuse it into the attention.
        if target == Target::Cpu {
            assert_eq!(o.op(bb[0]), &Op::BlockBoundary(tiles));
            assert_eq!(a.prune, Prune::Start);
        } else {
            assert!(bb.is_empty());
            assert_eq!(a.prune, Prune::Boundary);
        }
        // q and k of QK-norm are positional rmsnorms over axis 3 (the scale is an attribute),
        // f32 on the CPU, cast to bf16 for the GPU kernels (the half-operands pass).
        let ops = Attention::operands(&o, pa[0]).unwrap();
        let normed = |v| match target {
            Target::Cpu => v,
            _ => {
                assert!(matches!(o.op(v), Op::Cast) && o.ty(v).dtype == foxc_ir::DType::BF16);
                o.operands(v)[0]
            }
        };
        assert!(matches!(o.op(normed(ops.q)), Op::RmsNorm { axis, .. } if axis == "3"));
        assert!(matches!(o.op(normed(ops.k)), Op::RmsNorm { axis, .. } if axis == "3"));
    }
    let t64 = foxc_ir::Tiles { bm: 64, bn: 64 };
    assert_eq!(tiles_for(Target::Cpu, Some(64), false), t64);
    // sm_90a, D = 128: the warp-specialized kernel's 128-key tiles, for a forward only (the
    // backward runs faster with 64-key tiles), and only when D is known (D = 256's standard kernel
    // cannot hold 128-key tiles in shared memory).
    assert_eq!(tiles_for(Target::Sm90a, Some(128), false), foxc_ir::Tiles { bm: 64, bn: 128 });
    assert_eq!(tiles_for(Target::Sm90a, Some(128), true), t64);
    assert_eq!(tiles_for(Target::Sm90a, None, false), t64);
    // D = 64 (the standard kernel) also runs faster with 128-key tiles, a forward only.
    assert_eq!(tiles_for(Target::Sm90a, Some(64), false), foxc_ir::Tiles { bm: 64, bn: 128 });
    assert_eq!(tiles_for(Target::Sm90a, Some(64), true), t64);
    assert_eq!(tiles_for(Target::Sm80, Some(64), false), t64);
    assert_eq!(tiles_for(Target::Sm90a, Some(256), false), t64);
}

/// The tiles pass reads the head dim from the sizes the caller bound (`PassOptions::dims`).
#[test]
fn bound_head_dim_reaches_the_tiles() {
    let g = compile("examples/fox.attn");
    let tiles_of = |dims: &[(&str, u64)], gradient: bool| {
        let dims = dims.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        let (o, _) =
            run(&g, &PassOptions { target: Target::Sm90a, dims, gradient, ..PassOptions::default() });
        let pa = o.find(|op| matches!(op, Op::Attention(_)));
        let Op::Attention(a) = o.op(pa[0]) else { unreachable!() };
        a.tiles.unwrap()
    };
    assert_eq!(tiles_of(&[("D", 128)], false), foxc_ir::Tiles { bm: 64, bn: 128 });
    assert_eq!(tiles_of(&[("D", 128)], true), foxc_ir::Tiles { bm: 64, bn: 64 });
    assert_eq!(tiles_of(&[("D", 256)], false), foxc_ir::Tiles { bm: 64, bn: 64 });
    assert_eq!(tiles_of(&[("T", 128)], false), foxc_ir::Tiles { bm: 64, bn: 64 });
}

/// A user-requested tile shape overrides the target's choice on every ACP node.
#[test]
fn requested_tiles_override_the_target_choice() {
    let g = compile("examples/fox.attn");
    let tiles = foxc_ir::Tiles { bm: 128, bn: 32 };
    let (o, _) =
        run(&g, &PassOptions { tiles: Some(tiles), target: Target::Sm90a, ..PassOptions::default() });
    // On the GPU the boundary is fused: the tiles are the attention's.
    let pa = o.find(|op| matches!(op, Op::Attention(a) if a.prune == Prune::Boundary));
    assert!(matches!(o.op(pa[0]), Op::Attention(a) if a.tiles == Some(tiles)));
    let th = o.find(|op| matches!(op, Op::Threshold { .. }));
    assert!(matches!(o.op(th[0]), Op::Threshold { bm: 128, .. }));
    let (o, _) = run(&g, &PassOptions { tiles: Some(tiles), target: Target::Cpu, ..PassOptions::default() });
    let bb = o.find(|op| matches!(op, Op::BlockBoundary(_)));
    assert_eq!(o.op(bb[0]), &Op::BlockBoundary(tiles));
}

/// A QK-norm program with constant D and ranged weights gets a static bound.
#[test]
fn static_bound_from_ranged_rmsnorm_weights() {
    let src =
        "attention f(q: bf16[B, H, T, 16], k: bf16[B, H, T, 16], v: bf16[B, H, T, 16], fgate: f32[B, H, T],
                     wq: f32[16] in [-2, 1.5], wk: f32[16] in [0, 0.5]) -> bf16[B, H, T, 16] {
        c[b, h, t]      = cumsum(t, logsigmoid(fgate[b, h, t]))
        qn[b, h, t, d]  = rmsnorm(q[b, h, t, d], wq[d])
        kn[b, h, t, d]  = rmsnorm(k[b, h, t, d], wk[d])
        s[b, h, i, j]   = sum(d, qn[b, h, i, d] * kn[b, h, j, d]) / sqrt(16) + c[b, h, i] - c[b, h, j]
        p[b, h, i, j]   = softmax(j, causal(i, j, s[b, h, i, j]))
        out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d])
        return out
    }";
    let g = foxc_ir::frontend::compile("static.attn", src.as_bytes())
        .map_err(|d| d.render("s", src))
        .unwrap()
        .graph;
    let (o, _) = run(&g, &PassOptions::default());
    let th = o.find(|op| matches!(op, Op::Threshold { .. }));
    let Op::Threshold { bound, scale, .. } = o.op(th[0]).clone() else { unreachable!() };
    assert_eq!(bound, NormBound::Static { q_max: 2.0 * 4.0, k_max: 0.5 * 4.0 });
    assert_eq!(scale.constant_value(), Some(0.25));
}

#[test]
fn bad_log_eps_is_an_error_not_a_panic() {
    let g = compile("examples/fox.attn");
    for log_eps in [f64::NAN, 0.0, 1.0, f64::INFINITY, f64::NEG_INFINITY] {
        let mut o = g.clone();
        let e = foxc_passes::optimize(&mut o, &PassOptions { log_eps, ..PassOptions::default() });
        assert!(matches!(e, Err(foxc_passes::PassError::InvalidOption(_))), "{log_eps}");
    }
}

#[test]
fn dumps_only_on_request_and_optimize_is_idempotent() {
    for ex in EXAMPLES {
        let g = compile(&format!("examples/{ex}.attn"));
        let (o, report) = run(&g, &PassOptions::default());
        assert!(report.dumps.is_empty());
        let (_, all) = run(&g, &all_passes());
        let names: Vec<&str> = all.dumps.iter().map(|(n, _)| n.as_str()).collect();
        let passes: Vec<&str> =
            foxc_passes::PASSES.iter().filter(|p| p.runs.on(Target::Cpu)).map(|p| p.name).collect();
        assert_eq!(names, passes);
        assert_eq!(all.dumps.last().unwrap().1, print_graph(&o));
        let (again, _) = run(&o, &PassOptions::default());
        assert_eq!(print_graph(&again), print_graph(&o), "{ex}: a second optimize changed the graph");
    }
}

/// Per-head thresholds given by the user reach the threshold op as its rule, printed with their
/// values, and `--explain` says they are the user's choice; on a GPU target too (a formula of
/// no norm statistic: the two-launch plan's delta kernel alone).
#[test]
fn given_thresholds_print_in_the_ir_and_the_explanations() {
    let rule = foxc_ir::PruneRule::given_thresholds(&[-8.0, -12.5, f64::NEG_INFINITY, -0.25]).unwrap();
    let mut s = String::new();
    for target in [Target::Cpu, Target::Sm90a] {
        let opts = PassOptions { rule: rule.clone(), target, ..PassOptions::default() };
        let (o, report) = run(&compile("examples/fox.attn"), &opts);
        let th = o.find(|op| matches!(op, Op::Threshold { .. }));
        assert_eq!(th.len(), 1, "{target:?}");
        let Op::Threshold { rule: r, plan, .. } = o.op(th[0]) else { unreachable!() };
        assert_eq!(r, &rule);
        assert_eq!(*plan, ThresholdPlan::NormsThenDelta);
        s.push_str(&format!("// ---- {target:?}\n{}", print_graph(&o)));
        for e in &report.explanations {
            s.push_str(&format!("// explain: {}\n", e.message));
        }
    }
    assert!(s.contains("rule = given[-8, -12.5, -inf, -0.25]"), "{s}");
    insta::assert_snapshot!("given_thresholds", s);
}
