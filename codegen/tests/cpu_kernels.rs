//! The CPU backend's kernels against a naive f64 reference, on fused graphs built with the
//! graph API: dense (relative L2 <= 1e-5), pruned (same kept set: 1e-5; vs dense: the eps bound),
//! shapes that are not multiples of the tiles, T = 1, several D, bf16 and f32, and errors.

mod cpu_common;

use cpu_common::*;
use foxc_codegen::cpu;
use foxc_ir::*;

fn run_case(cfg: &Cfg, b: usize, h: usize, t: usize, d: usize, seed: u64) {
    let built = build(cfg, d as u64);
    let dims = dims(b as u64, h as u64, t as u64, d as u64);
    let prog = cpu::compile(&built.g, &dims).unwrap_or_else(|e| panic!("compile {cfg:?}: {e}"));
    let mut rng = Rng::new(seed);
    let inp = random_inputs(&mut rng, cfg, b, h, t, d);
    let res = execute(&built.g, &prog, &inp);
    let out = &res[&built.g.output.unwrap()];
    let attn = &res[&built.attn];
    let r = reference_prep(cfg, &inp, b, h, t, d);
    let v = &inp["v"].vals;
    let has_decay = cfg.gate.is_some();
    let dense = reference_attention(&r, v, b, h, t, d, has_decay, cfg.window, None);
    let what = format!("{cfg:?} B={b} H={h} T={t} D={d}");
    assert!(attn.vals.iter().all(|x| x.is_finite()), "non-finite output: {what}");
    if let Some((_, _, tiles)) = cfg.prune {
        let st = &res[&built.start.unwrap()];
        let (bm, bn) = (tiles.bm as usize, tiles.bn as usize);
        let mt = t.div_ceil(bm);
        for (idx, s) in st.vals.iter().enumerate() {
            let m = idx % mt;
            assert!(*s >= 0.0 && *s as usize <= (m * bm) / bn, "start out of range: {what}");
        }
        let same = reference_attention(&r, v, b, h, t, d, has_decay, cfg.window, Some((&st.vals, bm, bn)));
        let e = rel_l2(&attn.vals, &same);
        assert!(e <= 1e-5, "pruned vs reference with the same kept tiles: rel L2 {e:e}: {what}");
        let vmax = v.iter().fold(0f64, |a, x| a.max(x.abs() as f64));
        let bound = 2.0 * cfg.log_eps.exp() * vmax;
        let maxdiff = attn.vals.iter().zip(&dense).map(|(a, b)| (*a as f64 - b).abs()).fold(0.0, f64::max);
        assert!(
            maxdiff <= bound + 1e-5,
            "pruned vs dense: max abs diff {maxdiff:e} > eps bound {bound:e}: {what}"
        );
    } else {
        let e = rel_l2(&attn.vals, &dense);
        assert!(e <= 1e-5, "dense: rel L2 {e:e}: {what}");
    }
    if cfg.out == DType::BF16 {
        for (o, a) in out.vals.iter().zip(&attn.vals) {
            assert_eq!(o.to_bits(), bf16_round(*a).to_bits(), "bf16 cast: {what}");
        }
    }
}

fn tiles(bm: u32, bn: u32) -> Tiles {
    Tiles { bm, bn }
}

#[test]
fn dense_fox_f32_and_bf16() {
    for (i, dt) in [DType::F32, DType::BF16].into_iter().enumerate() {
        run_case(&Cfg::fox(dt), 1, 2, 70, 64, 1 + i as u64);
    }
}

#[test]
fn dense_edge_shapes() {
    let mut seed = 10;
    for &(t, d) in &[(1, 16), (17, 32), (17, 96), (65, 128), (3, 20), (129, 64)] {
        seed += 1;
        run_case(&Cfg::fox(DType::BF16), 2, 1, t, d, seed);
    }
}

#[test]
fn dense_variants() {
    let mut c = Cfg::fox(DType::F32);
    c.gate = None;
    run_case(&c, 1, 2, 50, 32, 21);
    c.window = Some(7);
    run_case(&c, 1, 2, 150, 32, 22);
    let mut c = Cfg::fox(DType::F32);
    c.gate = Some(GateKind::Slope);
    run_case(&c, 1, 3, 90, 16, 23);
    c.gate = Some(GateKind::LogGate);
    c.window = Some(70);
    run_case(&c, 2, 1, 200, 16, 24);
}

#[test]
fn pruned_rules_and_tiles() {
    let mut seed = 30;
    // Every rule of the table (a new rule is compiled and compared without touching this test).
    for rule in foxc_passes::rules::RULES.iter().map(|r| r.rule()) {
        for tl in [tiles(16, 16), tiles(32, 16), tiles(16, 32), tiles(64, 64), tiles(12, 20)] {
            for &(t, d) in &[(1usize, 16usize), (17, 32), (300, 64)] {
                seed += 1;
                let mut c = Cfg::fox(DType::BF16);
                c.prune = Some((rule.clone(), NormBound::Data, tl));
                run_case(&c, 1, 2, t, d, seed);
            }
        }
    }
}

#[test]
fn pruned_qk_norm_static_bound_window_bf16_out() {
    let d = 64usize;
    let mut c = Cfg::fox(DType::BF16);
    c.qk_norm = true;
    // QK-norm bound: max|w| * sqrt(D); weights are ~N(1, 0.2), below 2.5 with overwhelming odds.
    let bnd = 2.5 * (d as f64).sqrt();
    c.prune = Some((
        foxc_passes::rules::by_name("paper").unwrap(),
        NormBound::Static { q_max: bnd, k_max: bnd },
        tiles(32, 32),
    ));
    c.out = DType::BF16;
    run_case(&c, 1, 2, 200, d, 41);
    c.prune = Some((
        foxc_passes::rules::by_name("tight").unwrap(),
        NormBound::Static { q_max: bnd, k_max: bnd },
        tiles(32, 32),
    ));
    c.window = Some(100);
    c.gate = Some(GateKind::LogGate);
    run_case(&c, 2, 2, 130, d, 42);
}

#[test]
fn pruning_skips_tiles_on_fast_heads() {
    let (b, h, t, d) = (1usize, 2usize, 512usize, 32usize);
    let mut c = Cfg::fox(DType::F32);
    c.prune = Some((foxc_passes::rules::by_name("tight").unwrap(), NormBound::Data, tiles(32, 32)));
    let built = build(&c, d as u64);
    let prog = cpu::compile(&built.g, &dims(b as u64, h as u64, t as u64, d as u64)).unwrap();
    let inp = random_inputs(&mut Rng::new(5), &c, b, h, t, d);
    let res = execute(&built.g, &prog, &inp);
    let st = &res[&built.start.unwrap()].vals;
    let mt = t / 32;
    // Head 0 forgets fast: its late query tiles start far from 0. Head 1 forgets slowly.
    assert!(st[mt - 1] >= 5.0, "fast head not pruned: {:?}", &st[..mt]);
    assert!(st[2 * mt - 1] <= 1.0, "slow head pruned too much: {:?}", &st[mt..]);
}

/// An op without a fused kernel compiles to a generic loop kernel named after it; unbound dims
/// are still an error.
#[test]
fn unfused_ops_get_generic_kernels() {
    let mut g = Graph::new("bad");
    let sp = Span::default();
    let t = ValueType::tensor(DType::F32, [Dim::sym("T")]);
    let x = g.add_param("x", t.clone(), sp);
    let y = g.add(Op::Unary(UnaryOp::Exp), t, &[x], sp);
    g.output = Some(y);
    let dims = [("T".to_string(), 4u64)].into_iter().collect();
    let p = cpu::compile(&g, &dims).unwrap();
    assert_eq!(p.kernels.len(), 1);
    assert_eq!(p.kernels[0].name, "k1_exp");
    let e = cpu::compile(&build(&Cfg::fox(DType::F32), 8).g, &dims).unwrap_err();
    assert!(e.to_string().contains("not bound"), "{e}");
}

/// Hard resets (`log f = -inf`) stay finite through the floor; gates of exactly 1 prune nothing.
#[test]
fn hard_reset_and_no_decay_gates() {
    let (b, h, t, d) = (1usize, 2usize, 150usize, 32usize);
    let mut c = Cfg::fox(DType::F32);
    c.gate = Some(GateKind::LogGate);
    c.prune = Some((foxc_passes::rules::by_name("tight").unwrap(), NormBound::Data, tiles(16, 16)));
    let built = build(&c, d as u64);
    let prog = cpu::compile(&built.g, &dims(b as u64, h as u64, t as u64, d as u64)).unwrap();
    let mut inp = random_inputs(&mut Rng::new(77), &c, b, h, t, d);
    let g = inp.get_mut("fgate").unwrap();
    for (i, x) in g.vals.iter_mut().enumerate() {
        // head 0: a hard reset every 40 tokens; head 1: no decay at all.
        *x = if i < t {
            if i % 40 == 39 {
                f32::NEG_INFINITY
            } else {
                -0.01
            }
        } else {
            0.0
        };
    }
    let res = execute(&built.g, &prog, &inp);
    let out = &res[&built.attn].vals;
    assert!(out.iter().all(|x| x.is_finite()), "NaN or inf after a hard reset");
    let st = &res[&built.start.unwrap()].vals;
    let mt = t.div_ceil(16);
    assert!(st[mt..].iter().all(|&s| s == 0.0), "a head without decay was pruned: {:?}", &st[mt..]);
    assert!(st[mt - 1] > 0.0, "a hard reset did not prune: {:?}", &st[..mt]);
    let r = reference_prep(&c, &inp, b, h, t, d);
    let want = reference_attention(&r, &inp["v"].vals, b, h, t, d, true, None, Some((st, 16, 16)));
    let e = rel_l2(out, &want);
    assert!(e <= 1e-5, "rel L2 {e:e}");
}
