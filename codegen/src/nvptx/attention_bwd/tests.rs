//! The backward kernels build, verify and assemble with ptxas (when found) for every supported
//! configuration class; refusals say what is not supported.

use super::*;
use crate::nvptx::builder::Half;
use crate::nvptx::target::{self, NvptxTarget};
use foxc_ir::attention::{IndexVar, RNode, Region};
use foxc_ir::{BinaryOp, Dim, UnaryOp};

fn cfg(d: u32, sm: u32) -> BwdConfig {
    BwdConfig {
        head_dim: d,
        bm: 64,
        bn: 64,
        scale: 1.0 / (d as f32).sqrt(),
        has_decay: true,
        window: None,
        causal: true,
        prune: true,
        key_bound: false,
        sm,
        kv_group: 1,
        dtype: Half::Bf16,
        fewer_queries: false,
        grads: None,
    }
}

/// `20 tanh(x / 20)`: the softcap region (and its derivative, a region too).
fn softcap() -> Region {
    let mut r = Region::new();
    let x = r.push(RNode::Score);
    let c = r.push(RNode::Const(20.0));
    let d = r.push(RNode::Binary(BinaryOp::Div, x, c));
    let t = r.push(RNode::Unary(UnaryOp::Tanh, d));
    r.push(RNode::Binary(BinaryOp::Mul, c, t));
    r
}

fn no_dim(_: &Dim) -> Option<u64> {
    None
}

/// `abs(i - j) < 64`: a bidirectional local window as an expression mask's condition.
fn local_mask() -> Region {
    let mut r = Region::new();
    let i = r.push(RNode::Index(IndexVar::I));
    let j = r.push(RNode::Index(IndexVar::J));
    let d = r.push(RNode::Binary(BinaryOp::Sub, i, j));
    let a = r.push(RNode::Unary(UnaryOp::Abs, d));
    let w = r.push(RNode::Const(64.0));
    r.push(RNode::Binary(BinaryOp::Lt, a, w));
    r
}

/// Builds the three kernels of `c` into one module and returns its PTX.
fn ptx_of(cfgs: &[BwdConfig], region: &Region) -> String {
    ptx_masked(cfgs, region, None)
}

/// [`ptx_of`] with an expression mask's condition `mask`.
fn ptx_masked(cfgs: &[BwdConfig], region: &Region, mask: Option<&Region>) -> String {
    ptx_bounded(cfgs, region, mask, None)
}

/// [`ptx_masked`] with the mask's proven key bound `keys_from`.
fn ptx_bounded(
    cfgs: &[BwdConfig],
    region: &Region,
    mask: Option<&Region>,
    keys_from: Option<&Region>,
) -> String {
    let t = if cfgs[0].sm == 90 { NvptxTarget::Sm90a } else { NvptxTarget::Sm80 };
    let tm = target::target_machine(t).unwrap();
    let ctx = Context::create();
    let m = ctx.create_module("bwd");
    target::prepare_module(&m, &tm);
    let score = RegionMod::with_mask(region, mask, keys_from, &no_dim, Some(4), &[]).unwrap();
    let dx_region = region.grad().dx;
    let dx = RegionMod::new(&dx_region, &no_dim, Some(4)).unwrap();
    let regions = Regions::new(&score, (!region.is_identity()).then_some(&dx), vec![], 0);
    for c in cfgs {
        for kind in [BwdKernel::Pre, BwdKernel::Dq, BwdKernel::Dkv] {
            build_bwd_kernel(&ctx, &m, c, kind, &regions).unwrap();
        }
    }
    assert!(m.verify().is_ok());
    target::finish(&m, &tm).unwrap().1
}

/// Assembles `ptx` for `arch`; returns ptxas' report (registers, spills) or panics with it
/// (an empty report when ptxas is not installed).
fn assemble(ptx: &str, arch: &str, tag: &str) -> String {
    let Some(ptxas) = crate::nvptx::ptxas::find() else {
        eprintln!("note: ptxas not found (set $PTXAS); skipping the PTX assembly check");
        return String::new();
    };
    crate::nvptx::ptxas::assemble(&ptxas, ptx, arch)
        .unwrap_or_else(|log| panic!("ptxas failed ({tag}):\n{log}"))
}

/// Every class the dispatch can produce: both targets, D = 64 and 128 (and 32, 96), masks
/// causal and window, pruned and dense, grouped-query heads, a score region.
#[test]
fn backward_kernels_assemble_for_sm90a_and_sm80() {
    for sm in [90, 80] {
        let arch = if sm == 90 { "sm_90a" } else { "sm_80" };
        let mut cfgs = vec![];
        for d in BWD_HEAD_DIMS {
            cfgs.push(cfg(d, sm));
        }
        let mut dense_window = cfg(64, sm);
        (dense_window.prune, dense_window.window) = (false, Some(200));
        let mut causal_nodecay = cfg(128, sm);
        (causal_nodecay.prune, causal_nodecay.has_decay) = (false, false);
        let mut gqa = cfg(128, sm);
        (gqa.kv_group, gqa.bm) = (4, 128);
        // 128-key tiles: two warpgroups per dkv block on the wgmma path.
        let mut wide = cfg(128, sm);
        (wide.bm, wide.bn) = (128, 128);
        let mut wide64 = cfg(64, sm);
        (wide64.bn, wide64.prune, wide64.window) = (128, false, Some(500));
        cfgs.extend([dense_window, causal_nodecay, gqa]);
        if sm == 90 {
            // (mma.sync's dq at 128 keys and D = 128 spills: sm_80 keeps 64-key tiles.)
            cfgs.extend([wide, wide64]);
        }
        let log = assemble(&ptx_of(&cfgs, &Region::identity()), arch, &format!("id{sm}"));
        // No kernel spills to local memory (a spill would be a silent slowdown), and ptxas keeps
        // the wgmma chains asynchronous (it serializes them, with a warning, when an accumulator
        // is touched while in flight).
        for l in log.lines().filter(|l| l.contains("spill")) {
            assert!(l.contains(" 0 bytes spill stores"), "{arch}: {l}\n{log}");
        }
        assert!(!log.contains("serialized"), "{arch}: {log}");
        let log = assemble(&ptx_of(&[cfg(64, sm), cfg(128, sm)], &softcap()), arch, &format!("cap{sm}"));
        assert!(!log.is_empty() || crate::nvptx::ptxas::find().is_none());
        assert!(!log.contains("serialized"), "{arch}: {log}");
    }
}

#[test]
fn names_and_refusals() {
    let c = cfg(128, 90);
    assert_eq!(
        c.kernel_name(BwdKernel::Dq),
        format!("foxc_attn_bwd_dq_d128_bm64_bn64_decay_prune_s{:08x}_sm90", c.scale.to_bits())
    );
    let mut big = cfg(512, 90);
    assert!(big.validate().unwrap_err().contains("head_dim"));
    big.head_dim = 128;
    big.prune = true;
    big.has_decay = false;
    assert!(big.validate().unwrap_err().contains("decay"));
    let mut bn = cfg(64, 80);
    bn.bn = 24;
    assert!(bn.validate().unwrap_err().contains("bn"));
}

/// sm_90a with D = 64 / 128 and 64-key multiples runs every product on wgmma (dq: m64n{bn} for
/// S and dP, m64n{D} for dQ; dkv: m64n{bq} and m64n{D}); sm_80, D = 32 / 96 and 32-key tiles
/// stay on mma.sync.
#[test]
fn wgmma_on_sm90a_mma_sync_elsewhere() {
    for (d, bn, sm, wg) in [
        (64, 64, 90, true),
        (128, 64, 90, true),
        (128, 128, 90, true),
        (96, 64, 90, false),
        (32, 64, 90, false),
    ]
    .into_iter()
    .chain([(128, 32, 90, false), (64, 64, 80, false), (128, 128, 80, false)])
    .chain([(256, 64, 90, false), (256, 64, 80, false)])
    {
        let mut c = cfg(d, sm);
        (c.bn, c.bm) = (bn, 64.max(bn));
        assert_eq!(c.uses_wgmma(), wg, "D={d} bn={bn} sm={sm}");
        let ptx = ptx_of(&[c.clone()], &Region::identity());
        let wgmma = |n: u32| ptx.contains(&format!("wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16"));
        assert_eq!(wgmma(bn) && wgmma(c.bq()) && wgmma(d), wg, "D={d} bn={bn} sm={sm}");
        assert_eq!(ptx.contains("mma.sync.aligned.m16n8k16"), !wg, "D={d} bn={bn} sm={sm}");
        assert_eq!(ptx.contains("fence.proxy.async"), wg, "D={d} bn={bn} sm={sm}");
    }
}

/// f16 operands: the three kernels read dout in f16 and multiply in f16 (wgmma .f16.f16 on
/// sm_90a at D = 64 / 128, mma.sync's f32.f16.f16.f32 elsewhere), P and dS packed to f16, no
/// bf16 anywhere; they assemble without spills and are named apart from the bf16 kernels.
#[test]
fn f16_kernels_multiply_in_f16() {
    for (d, sm, wg) in [(64, 90, true), (128, 90, true), (96, 90, false), (64, 80, false), (128, 80, false)] {
        let mut c = cfg(d, sm);
        c.dtype = Half::F16;
        let ptx = ptx_of(std::slice::from_ref(&c), &Region::identity());
        for kind in [BwdKernel::Pre, BwdKernel::Dq, BwdKernel::Dkv] {
            let name = c.kernel_name(kind);
            assert!(name.contains("_f16"), "{name}");
            let body = kernel_body(&ptx, &name);
            assert!(!body.contains("bf16"), "{name}");
        }
        assert!(!ptx.contains("bf16"), "D={d} sm={sm}");
        assert!(ptx.contains("cvt.rn.f16x2.f32"), "D={d} sm={sm}");
        assert_eq!(ptx.contains(".f32.f16.f16 "), wg, "D={d} sm={sm}");
        assert_eq!(ptx.contains("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"), !wg, "D={d} sm={sm}");
        let log = assemble(&ptx, if sm == 90 { "sm_90a" } else { "sm_80" }, &format!("f16 D={d} sm={sm}"));
        for l in log.lines().filter(|l| l.contains("spill")) {
            assert!(l.contains(" 0 bytes spill stores"), "D={d} sm={sm}: {l}\n{log}");
        }
    }
}

/// Queries fewer than keys: the `_fq` kernels take `Tk` as their last parameter and assemble
/// on both targets, pruned and dense, with and without a decay, wgmma and mma.sync,
/// grouped-query heads too; their names differ from the square kernels'. No spills, but for
/// D = 96's pruned dq kernel (the mma.sync path, whose square kernel already takes 253-255
/// registers): the key length and the query offset cost it 16 (sm_80) to 28 (sm_90a) bytes;
/// and sm_80's grouped-query dkv kernel at D = 128 (255 registers), 16 bytes since its chunk
/// scan tests 32 chunks a step.
#[test]
fn fewer_queries_kernels_take_tk_last_and_assemble() {
    for sm in [90, 80] {
        let mut cfgs = vec![];
        for d in [64, 128, 96] {
            let mut c = cfg(d, sm);
            c.fewer_queries = true;
            cfgs.push(c.clone());
            (c.prune, c.has_decay) = (false, false);
            cfgs.push(c);
        }
        let mut gqa = cfg(128, sm);
        (gqa.fewer_queries, gqa.kv_group, gqa.bm) = (true, 4, 128);
        cfgs.push(gqa);
        let ptx = ptx_of(&cfgs, &Region::identity());
        for c in &cfgs {
            for kind in [BwdKernel::Dq, BwdKernel::Dkv] {
                let name = c.kernel_name(kind);
                assert!(name.contains("_fq_"), "{name}");
                let mut square = c.clone();
                square.fewer_queries = false;
                assert_eq!(square.kernel_name(kind).replace("_fq", ""), name.replace("_fq", ""));
                assert_ne!(square.kernel_name(kind), name);
                // The signature ends in `T`'s i32 ... and then `Tk`'s.
                let at = ptx.find(&format!(".entry {name}(")).unwrap_or_else(|| panic!("{name}"));
                let sig = &ptx[at..at + ptx[at..].find(')').unwrap()];
                let last = sig.lines().rfind(|l| l.contains(".param")).unwrap();
                assert!(last.contains(".u32") || last.contains(".b32"), "{name}: {last}");
                let params = sig.matches(".param").count();
                assert_eq!(params, FIRST_BWD_PARAM as usize + 1, "{name}");
            }
        }
        let arch = if sm == 90 { "sm_90a" } else { "sm_80" };
        let log = assemble(&ptx, arch, &format!("fq{sm}"));
        let mut kernel = "";
        for l in log.lines() {
            if let Some(at) = l.find("Compiling entry function '") {
                kernel = &l[at + 26..];
            }
            let known = kernel.starts_with("foxc_attn_bwd_dq_d96_bm64_bn64_decay_prune_fq")
                || kernel.starts_with("foxc_attn_bwd_dkv_d128_bm128_bn64_decay_prune_g4_fq_s3db504f3_sm80");
            if l.contains("spill stores") && !known {
                assert!(l.contains(" 0 bytes spill stores"), "{arch} {kernel}: {l}\n{log}");
            }
            if known && l.contains("spill stores") {
                let bytes: u32 = l.trim().split(' ').nth(4).and_then(|x| x.parse().ok()).unwrap_or(999);
                assert!(bytes <= 32, "{arch} {kernel}: {l}");
            }
        }
        assert!(!log.contains("serialized"), "{arch}: {log}");
    }
}

/// D = 256 splits both kernels in two 128-column halves (grid y = heads x 2): each block reads
/// its part from ctaid.y, keeps one buffer of K and V in the dq kernel (two would not fit sm_80),
/// and accumulates 128 columns: per thread 64 f32 of dQ, 64 + 64 of dK and dV (16 8-column
/// tiles each), as many as D = 128's whole.
#[test]
fn head_dim_256_splits_in_halves() {
    for sm in [80, 90] {
        let c = cfg(256, sm);
        assert_eq!((c.d_parts(), c.part_dim(), c.dq_kv_buffers(), c.bq()), (2, 128, 1, 16));
        assert!(c.validate().is_ok(), "{:?}", c.validate());
        let c128 = cfg(128, sm);
        assert_eq!((c128.d_parts(), c128.part_dim(), c128.dq_kv_buffers()), (1, 128, 2));
        let ptx = ptx_of(std::slice::from_ref(&c), &Region::identity());
        for kind in ["dq", "dkv"] {
            let body =
                kernel_body(&ptx, &c.kernel_name(if kind == "dq" { BwdKernel::Dq } else { BwdKernel::Dkv }));
            // 16 k-steps of S^T / S over the whole D, 16 8-column tiles of accumulators:
            // m16n8k16 products per visited tile. dq: S and dP (2 x 16 x 8), dQ (4 x 16);
            // dkv at 16-row chunks: S^T and dP^T (2 x 16 x 2), dK and dV (2 x 1 x 16).
            let mmas = body.matches("mma.sync.aligned.m16n8k16").count();
            let want = if kind == "dq" { 2 * 16 * 8 + 4 * 16 } else { 2 * 16 * 2 + 2 * 16 };
            assert_eq!(mmas, want, "{kind} sm_{sm}");
        }
    }
}

/// The text of kernel `name`'s body in `ptx`.
fn kernel_body<'p>(ptx: &'p str, name: &str) -> &'p str {
    let at = ptx.find(&format!(".entry {name}(")).unwrap_or_else(|| panic!("no kernel {name}"));
    let rest = &ptx[at..];
    &rest[..rest[1..].find(".entry").map_or(rest.len(), |e| e + 1)]
}

/// Without a causal mask (no mask, or an expression mask) the kernels are the `_bidir` ones:
/// they assemble on both targets and paths (wgmma at D = 64 / 128 on sm_90a, mma.sync else,
/// D = 256 split), the condition is compiled into them (the masked kernels differ from the
/// unmasked ones and evaluate it on every tile: no `need` branch around it), and pruning or a
/// window with a non-causal mask is refused.
#[test]
fn non_causal_masks_build_bidir_kernels() {
    for sm in [90, 80] {
        let arch = if sm == 90 { "sm_90a" } else { "sm_80" };
        let cfgs: Vec<BwdConfig> = [64, 128, 256, 96]
            .into_iter()
            .map(|d| {
                let mut c = cfg(d, sm);
                (c.causal, c.prune) = (false, false);
                // (D = 256 without decay: the dq kernel spills 4 bytes on sm_80, see GPU_KERNEL.md.)
                c.has_decay = d >= 128;
                c
            })
            .collect();
        assert!(cfgs[0].kernel_name(BwdKernel::Dkv).contains("_bidir_"));
        let plain = ptx_of(&cfgs, &Region::identity());
        let masked = ptx_masked(&cfgs, &Region::identity(), Some(&local_mask()));
        let capped = ptx_masked(&cfgs[..2], &softcap(), Some(&local_mask()));
        for c in &cfgs {
            for kind in [BwdKernel::Dq, BwdKernel::Dkv] {
                let name = c.kernel_name(kind);
                let p = kernel_body(&plain, &name);
                let at = masked.find(&format!(".entry {name}_r")).expect("a masked kernel (region tag)");
                let m = &masked[at..];
                let m = &m[..m[1..].find(".entry").map_or(m.len(), |e| e + 1)];
                // The condition: |i - j| compared with 64 (abs.s32 or its f32 form).
                assert!(
                    m.contains("abs.") && !p.contains("abs."),
                    "{name}: no condition in the masked kernel"
                );
                // Rows past T and keys past T are masked in the unmasked kernel too.
                assert!(p.contains("setp."), "{name}");
            }
        }
        for ptx in [&plain, &masked] {
            let log = assemble(ptx, arch, &format!("bidir{sm}"));
            for l in log.lines().filter(|l| l.contains("spill")) {
                assert!(l.contains(" 0 bytes spill stores"), "{arch}: {l}\n{log}");
            }
        }
        // (A softcap region at D = 128 spills on sm_80, with or without the mask.)
        assemble(&capped, arch, &format!("bidir_cap{sm}"));
    }
    let mut c = cfg(64, 90);
    c.causal = false;
    assert!(c.validate().unwrap_err().contains("non-causal"));
    (c.prune, c.window) = (false, Some(100));
    assert!(c.validate().unwrap_err().contains("non-causal"));
}

/// Each capture gradient slot is summed once per kernel, however many reads it has and in
/// whatever order the region's derivative lists them (a slot listed twice would be added twice).
#[test]
fn capture_slots_are_listed_once() {
    let id = RegionMod::new(&Region::identity(), &no_dim, Some(4)).unwrap();
    let read = |by_key, slot| CaptureRead { by_key, local: &id, slot };
    let reads = vec![read(true, 1), read(true, 0), read(true, 1), read(false, 0)];
    let r = Regions::new(&id, None, reads, 2);
    assert_eq!(r.slots(true), [0, 1]);
    assert_eq!(r.slots(false), [0]);
}

/// `j >= i - 100` (the mask) and `i - 100` (its key bound): rows see their last 101 keys.
fn lag_mask() -> (Region, Region) {
    let mut e = Region::new();
    let i = e.push(RNode::Index(IndexVar::I));
    let c = e.push(RNode::Const(100.0));
    e.push(RNode::Binary(BinaryOp::Sub, i, c));
    let mut m = e.clone();
    let lo = m.root;
    let j = m.push(RNode::Index(IndexVar::J));
    m.push(RNode::Binary(BinaryOp::Ge, j, lo));
    (m, e)
}

/// Under a key bound (`keys_from`, packed sequences' first keys) the kernels use the start
/// scratch whether pruned or not: the dq kernel writes each IR tile's first key tile there and
/// the dkv kernel skips the query chunks whose start is past its key tile. They assemble on
/// both targets and paths without spills, causal and not, and the dense kernels hold the
/// scratch's store (dq) and scan (dkv) the unbounded dense ones lack.
#[test]
fn key_bound_kernels_use_the_start_scratch() {
    let (mask, bound) = lag_mask();
    for sm in [90, 80] {
        let arch = if sm == 90 { "sm_90a" } else { "sm_80" };
        let mut cfgs = vec![];
        for d in [64, 128, 96, 256] {
            for (causal, prune) in [(true, true), (true, false), (false, false)] {
                let mut c = cfg(d, sm);
                (c.causal, c.prune, c.key_bound) = (causal, prune, true);
                c.validate().unwrap();
                cfgs.push(c);
            }
        }
        let bounded = ptx_bounded(&cfgs, &Region::identity(), Some(&mask), Some(&bound));
        let log = assemble(&bounded, arch, &format!("key_bound{sm}"));
        for l in log.lines().filter(|l| l.contains("spill")) {
            assert!(l.contains(" 0 bytes spill stores"), "{arch}: {l}\n{log}");
        }
        let dense: Vec<BwdConfig> = cfgs.iter().filter(|c| !c.prune).cloned().collect();
        let unbounded: Vec<BwdConfig> =
            dense.iter().map(|c| BwdConfig { key_bound: false, ..c.clone() }).collect();
        let plain = ptx_masked(&unbounded, &Region::identity(), Some(&mask));
        let count = |ptx: &str, name: &str, op: &str| {
            let at = ptx.find(&format!(".entry {name}_r")).unwrap_or_else(|| panic!("no kernel {name}"));
            let k = &ptx[at..];
            let k = &k[..k[1..].find(".entry").map_or(k.len(), |e| e + 1)];
            k.matches(op).count()
        };
        for (c, u) in dense.iter().zip(&unbounded) {
            let (dq, dkv) = (c.kernel_name(BwdKernel::Dq), c.kernel_name(BwdKernel::Dkv));
            assert!(dq.contains("_kb_") && !u.kernel_name(BwdKernel::Dq).contains("_kb_"), "{dq}");
            let (udq, udkv) = (u.kernel_name(BwdKernel::Dq), u.kernel_name(BwdKernel::Dkv));
            assert!(
                count(&bounded, &dq, "st.global.b32") > count(&plain, &udq, "st.global.b32"),
                "{dq}: no store of the start scratch"
            );
            assert!(
                count(&bounded, &dkv, "ld.global.b32") > count(&plain, &udkv, "ld.global.b32"),
                "{dkv}: no read of the start scratch"
            );
        }
    }
}
