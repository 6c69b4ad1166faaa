//! RoPE applied where the kernels load q (issue 25, item 7): the rotation statement of an
//! attention's q becomes a `load_map` (`fuse-load-maps`), which the attention and threshold
//! kernels compute per element as they load it, instead of a loop writing the rotated tensor
//! (f32 on the CPU; on the GPU, with `--q-map kernel`, rounded to the 16-bit type of the Q tile
//! the kernels fill with it; a GPU's default is the loop). k's rotation stays a loop (a map there
//! would be computed once per query tile) and
//! `--explain` says so. Checked against the f64 interpreter with f32 operands and outputs (a
//! wrong element shows far above the 1e-5 tolerance), at a head dim with a partial group of
//! four columns, with grouped kv heads and with queries at the end of longer keys; and through
//! the gradients, whose program stores the map again.
//!
//! Shown failing: with the CPU kernels reading q's `x` without the map (`Operand::lanes`
//! returning `x`, for the attention and the threshold alike),
//! `load_maps_match_the_reference_on_the_cpu` failed (rel L2 7.961e-1 on the f32 program at
//! D = 6).

mod common;

use common::{cpu_check, fresh_seed as seed, run_cli as run};

fn write(name: &str, src: &str) -> String {
    common::write_program("load_maps", name, src)
}

/// RoPE's rotate-half on q and k, f32 throughout.
const ROPE: &str = "attention rope32(q: f32[B, H, T, D], k: f32[B, H, T, D], v: f32[B, H, T, D], fgate: f32[B, H, T], cos: f32[T, D], sin: f32[T, D]) -> f32[B, H, T, D] {
    c[b, h, t]      = cumsum(t, logsigmoid(fgate[b, h, t]))
    qr[b, h, t, d]  = q[b, h, t, d] * cos[t, d] + select(d < D / 2, -q[b, h, t, d + D / 2], q[b, h, t, d - D / 2]) * sin[t, d]
    kr[b, h, t, d]  = k[b, h, t, d] * cos[t, d] + select(d < D / 2, -k[b, h, t, d + D / 2], k[b, h, t, d - D / 2]) * sin[t, d]
    s[b, h, i, j]   = sum(d, qr[b, h, i, d] * kr[b, h, j, d]) / sqrt(D) + c[b, h, i] - c[b, h, j]
    p[b, h, i, j]   = softmax(j, causal(i, j, s[b, h, i, j]))
    out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d])
    return out
}
";

/// Grouped kv heads: q's map reads per-query-head tables, k's rotation runs over its own G
/// heads.
const ROPE_GQA: &str = "attention rope_gqa(q: f32[B, H, T, D], k: f32[B, G, T, D], v: f32[B, G, T, D], fgate: f32[B, H, T], cos: f32[T, D], sin: f32[T, D], w: f32[G, D], u: f32[H, D]) -> f32[B, H, T, D] {
    c[b, h, t]      = cumsum(t, logsigmoid(fgate[b, h, t]))
    qr[b, h, t, d]  = (q[b, h, t, d] * cos[t, d] + select(d < D / 2, -q[b, h, t, d + D / 2], q[b, h, t, d - D / 2]) * sin[t, d]) * u[h, d]
    kr[b, g, t, d]  = (k[b, g, t, d] * cos[t, d] + select(d < D / 2, -k[b, g, t, d + D / 2], k[b, g, t, d - D / 2]) * sin[t, d]) * w[g, d]
    s[b, h, i, j]   = sum(d, qr[b, h, i, d] * kr[b, h / (H / G), j, d]) / sqrt(D) + c[b, h, i] - c[b, h, j]
    p[b, h, i, j]   = softmax(j, causal(i, j, s[b, h, i, j]))
    out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h / (H / G), j, d])
    return out
}
";

/// Queries at the end of longer keys (prefill against a cache): q's rotation reads the tables at
/// its rows' key positions.
const ROPE_PREFILL: &str = "attention rope_prefill(q: f32[B, H, N, D], k: f32[B, H, M, D], v: f32[B, H, M, D], c: f32[B, H, M] nonincreasing along M, cos: f32[M, D], sin: f32[M, D]) -> f32[B, H, N, D] {
    qr[b, h, t, d]  = q[b, h, t, d] * cos[t + M - N, d] + select(d < D / 2, -q[b, h, t, d + D / 2], q[b, h, t, d - D / 2]) * sin[t + M - N, d]
    kr[b, h, t, d]  = k[b, h, t, d] * cos[t, d] + select(d < D / 2, -k[b, h, t, d + D / 2], k[b, h, t, d - D / 2]) * sin[t, d]
    s[b, h, i, j]   = sum(d, qr[b, h, i, d] * kr[b, h, j, d]) / sqrt(D) + c[b, h, i + M - N] - c[b, h, j]
    p[b, h, i, j]   = softmax(j, select(j <= i + M - N, s[b, h, i, j], -inf))
    out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d])
    return out
}
";

fn opt(file: &str, target: &str) -> String {
    let (code, t) = run(&["compile", file, "--emit", "opt", "--target", target]);
    assert_eq!(code, Some(0), "{file} {target}: {t}");
    t
}

/// [`opt`] with the GPU kernels computing q's map (`--q-map kernel`; a GPU's default is the loop).
fn opt_mapped(file: &str, target: &str) -> String {
    let (code, t) = run(&["compile", file, "--emit", "opt", "--target", target, "--q-map", "kernel"]);
    assert_eq!(code, Some(0), "{file} {target}: {t}");
    t
}

#[test]
fn rope_on_q_is_loaded_through_a_map_on_the_cpu() {
    let t = opt("bench/fox_rope.attn", "cpu");
    let map = "= load_map {f = x * %4[i, d] + select(d < dim(D) * 0.5, -%0[b, h, i, d + D / 2], %0[b, h, i, d - D / 2]) * %5[i, d]} %0, %4, %0, %5 : f32[B, H, T, D]";
    assert_eq!(t.matches(map).count(), 1, "{t}");
    // The rotated q is not written (the threshold and the attention read the map); k's is.
    assert_eq!(t.matches("= store").count(), 1, "{t}");
    assert!(t.contains(", pruned}"), "{t}");
    let (code, why) = run(&["compile", "bench/fox_rope.attn", "--explain"]);
    assert_eq!(code, Some(0), "{why}");
    assert!(
        why.contains(
            "the attention's k stays a loop of its own: a kernel loads each key tile once per query tile"
        ),
        "{why}"
    );
}

#[test]
fn load_maps_match_the_reference_on_the_cpu() {
    let s = seed();
    let rope = write("rope32.attn", ROPE);
    for shape in ["B=1,H=2,T=130,D=6", "B=2,H=3,T=70,D=32"] {
        for prune in [true, false] {
            cpu_check("run", &rope, shape, &s, prune);
        }
    }
    cpu_check("run", "bench/fox_rope.attn", "B=1,H=2,T=200,D=64", &s, true);
    let gqa = write("rope_gqa.attn", ROPE_GQA);
    assert_eq!(opt(&gqa, "cpu").matches("= load_map").count(), 1);
    cpu_check("run", &gqa, "B=2,H=4,G=2,T=150,D=8", &s, true);
    let prefill = write("rope_prefill.attn", ROPE_PREFILL);
    assert_eq!(opt(&prefill, "cpu").matches("= load_map").count(), 1);
    cpu_check("run", &prefill, "B=1,H=2,N=37,M=160,D=10", &s, true);
}

#[test]
fn the_gradient_program_stores_the_maps_again() {
    let s = seed();
    let rope = write("rope32_grad.attn", ROPE);
    let (code, t) = run(&["compile", &rope, "--emit", "grad"]);
    assert_eq!(code, Some(0), "{t}");
    assert!(!t.contains("load_map"), "{t}");
    let t = cpu_check("grad", &rope, "B=1,H=2,T=90,D=6", &s, true);
    assert!(t.contains("check grad_cos") && t.contains("check grad_q"), "{t}");
}

/// bf16 programs with RoPE on q: plain, with grouped kv heads and a per-position scale of q (a
/// map that changes q's norms), and with queries at the end of longer keys.
const GPU_PROGRAMS: [&str; 3] =
    ["bench/fox_rope.attn", "bench/fox_rope_gqa.attn", "bench/fox_rope_prefill.attn"];

/// The GPU kernels load q through its map: one bf16 `load_map` (the rotation rounded to the Q
/// tile's type, as the `half-operands` pass made the statement), no kernel writes the rotated q,
/// and every kernel that reads q (the attention's and the threshold's) takes the map's captured
/// tensors as parameters after its own, at every kernel shape: warp-specialized (D = 128),
/// standard wgmma (D = 64 on sm_90a with the standard kernel chosen by the tiles), mma.sync
/// (D = 96; sm_80), split keys (N = 16 queries), queries fewer than keys (the norms and delta
/// kernels). The PTX assembles with ptxas where found. Their values are checked on a GPU
/// (BENCHMARKS.md, "RoPE's q rotation in the GPU kernels' Q loads").
#[test]
fn rope_on_q_is_loaded_through_a_map_on_the_gpu() {
    use foxc_codegen::nvptx::ptxas;
    let ptxas = ptxas::find();
    for f in GPU_PROGRAMS {
        for target in ["sm_90a", "sm_80"] {
            let t = opt_mapped(f, target);
            let maps: Vec<_> = t.lines().filter(|l| l.contains("= load_map {f = ")).collect();
            assert_eq!(maps.len(), 1, "{f} {target}: {t}");
            assert!(maps[0].contains(": bf16[B, H, "), "{f} {target}: {t}");
            // k's rotation is the one store of the head dim's rows ([B, G or H, T or M, D]).
            assert_eq!(t.matches("= store").count(), 1, "{f} {target}: {t}");
        }
        for (target, shape) in [
            ("sm_90a", "D=128,H=4,G=2,N=300,M=2000"),
            ("sm_90a", "D=96,H=4,G=2,N=300,M=2000"),
            ("sm_90a", "D=128,H=4,G=2,N=16,M=3000"),
            ("sm_80", "D=64,H=4,G=2,N=300,M=2000"),
        ] {
            let (code, ptx) = run(&[
                "compile", f, "--emit", "ptx", "--target", target, "--shape", shape, "--q-map", "kernel",
            ]);
            assert_eq!(code, Some(0), "{f} {target} {shape}: {ptx}");
            // The kernels that read q read the map's tables (`cos`, `sin`, `u`) and q's partner
            // elements 16 bytes at a time where aligned (`ld.global.nc.v4.b32`, which only a
            // map's reads emit).
            let entries: Vec<&str> = ptx.split(".visible .entry ").skip(1).collect();
            let name = |e: &str| e.split('(').next().unwrap().to_string();
            let maps_q = |e: &&&str| e.contains("ld.global.nc.v4.b32");
            let attn: Vec<_> = entries.iter().filter(|e| name(e).starts_with("foxc_attn_fwd")).collect();
            assert!(!attn.is_empty() && attn.iter().all(maps_q), "{f} {target} {shape}");
            // The threshold's norms of q (the delta kernel of the paper rule reads no q row).
            // (At D = 96 they read rows element by element, 12 lanes of 16 bytes not dividing a
            // warp, and the map's reads are element by element too.)
            let threshold: Vec<_> = entries.iter().filter(|e| name(e).contains("threshold")).collect();
            assert!(!threshold.is_empty(), "{f} {target} {shape}");
            if !shape.starts_with("D=96") {
                assert!(threshold.iter().any(maps_q), "{f} {target} {shape}");
            }
            let stores = entries.iter().filter(|e| name(e).contains("_store_")).count();
            assert_eq!(stores, 1, "{f} {target} {shape}");
            if let Some(p) = &ptxas {
                let arch = if target == "sm_80" { "sm_80" } else { "sm_90a" };
                ptxas::assemble(p, &ptx, arch).unwrap_or_else(|log| panic!("{f} {shape}: ptxas: {log}"));
            }
        }
    }
}

/// f16 operands: the map rounds to f16, the Q tile's type, and the kernels assemble.
#[test]
fn an_f16_map_fills_an_f16_q_tile() {
    use foxc_codegen::nvptx::ptxas;
    let src = std::fs::read_to_string("bench/fox_rope.attn").unwrap().replace("bf16", "f16");
    let f = write("rope_f16.attn", &src);
    for (target, shape) in [("sm_90a", "D=128"), ("sm_80", "D=64")] {
        let t = opt_mapped(&f, target);
        let maps: Vec<_> = t.lines().filter(|l| l.contains("= load_map {f = ")).collect();
        assert!(maps.len() == 1 && maps[0].ends_with(": f16[B, H, T, D]"), "{target}: {t}");
        let (code, ptx) =
            run(&["compile", &f, "--emit", "ptx", "--target", target, "--shape", shape, "--q-map", "kernel"]);
        assert_eq!(code, Some(0), "{target}: {ptx}");
        // The map's tables and q's partner elements are read 16 bytes at a time.
        assert!(ptx.contains("ld.global.nc.v4.b32"), "{target}");
        if let Some(p) = ptxas::find() {
            let arch = if target == "sm_80" { "sm_80" } else { "sm_90a" };
            ptxas::assemble(&p, &ptx, arch).unwrap_or_else(|log| panic!("{target}: ptxas: {log}"));
        }
    }
    cpu_check("run", &f, "B=1,H=2,T=100,D=16", &seed(), true);
}

/// On a GPU target, a q map whose own element comes from an f32 tensor stays a loop, and
/// `--explain` says why: the kernels load `x` as their Q tile's 16-bit type.
#[test]
fn an_f32_element_keeps_the_gpu_loop() {
    let src = std::fs::read_to_string("bench/fox_rope.attn").unwrap().replace("q: bf16[", "q: f32[");
    let f = write("rope_f32_q.attn", &src);
    assert!(!opt_mapped(&f, "sm_90a").contains("load_map"));
    let (code, why) = run(&["compile", &f, "--explain", "--target", "sm_90a", "--q-map", "kernel"]);
    assert_eq!(code, Some(0), "{why}");
    assert!(why.contains("it reads its own element from a f32 tensor"), "{why}");
}

/// A GPU target keeps q's rotation a loop unless `--q-map kernel` asks for the map (measured
/// faster on an H100: `fuse_load_map::GPU_Q_MAP`), and `--explain` says so at the statement;
/// `--q-map loop` keeps the CPU's loop too. Shown failing with the GPU's default the kernel.
#[test]
fn a_gpu_keeps_the_q_loop_unless_asked() {
    for target in ["sm_90a", "sm_80"] {
        let t = opt("bench/fox_rope.attn", target);
        assert!(!t.contains("load_map") && t.matches("= store").count() == 2, "{target}: {t}");
        let (code, why) = run(&["compile", "bench/fox_rope.attn", "--explain", "--target", target]);
        assert_eq!(code, Some(0), "{why}");
        assert!(
            why.contains("the attention's q stays a loop of its own: on a GPU the loop measured faster"),
            "{why}"
        );
        assert!(why.contains("qr[b, h, t, d]  = q[b, h, t, d] * cos[t, d]"), "at q's statement: {why}");
    }
    let (code, t) = run(&["compile", "bench/fox_rope.attn", "--emit", "opt", "--q-map", "loop"]);
    assert_eq!(code, Some(0), "{t}");
    assert!(!t.contains("load_map") && t.matches("= store").count() == 2, "{t}");
    let s = seed();
    let args = ["run", "bench/fox_rope.attn", "--backend", "cpu", "--check", "--shape", "B=1,H=2,T=100,D=16"];
    let (code, t) = run(&[&args[..], &["--seed", &s, "--q-map", "loop"]].concat());
    assert!(code == Some(0) && t.contains("check: ok"), "{t}");
}
