//! Unit tests of the warp-specialized kernel's emission (PTX-level checks live in
//! codegen/tests/nvptx_ws.rs).

use super::*;
use crate::nvptx::attention::score::Identity;

fn cfg(d: u32) -> AttnKernelConfig {
    let mut c = AttnKernelConfig::new(d, true, true);
    c.ws = true;
    c
}

#[test]
fn builds_and_verifies_tuned_variants() {
    let ctx = Context::create();
    let m = ctx.create_module("t");
    for d in HEAD_DIMS {
        for (decay, prune, window, bf16) in
            [(true, true, None, true), (true, false, None, false), (false, false, Some(256), false)]
        {
            let mut c = cfg(d);
            c.has_decay = decay;
            c.prune = prune;
            c.window = window;
            c.out_half = bf16;
            let name = c.kernel_name();
            assert!(name.starts_with("foxc_attn_fwd_ws_"), "{name}");
            let f = build(&ctx, &m, &c, &Identity, &name).unwrap();
            assert_eq!(f.count_params(), 8);
        }
    }
    assert!(m.verify().is_ok());
}

#[test]
fn layout_takes_the_deepest_ring_that_fits() {
    let mut c = cfg(128);
    let l = layout(&c).unwrap();
    assert_eq!((l.stages, l.q_bytes, l.kv_bytes), (4, 16384, 16384));
    assert_eq!(l.kv0 % 1024, 0);
    assert_eq!(l.total, 2 * 16384 + 4 * (2 * 16384 + 256 + 16) + 32);
    assert_eq!(l.xch0 % 8, 0);
    c.bn = 128;
    assert_eq!(layout(&c).unwrap().stages, 3);
    let g = launch_geometry(&c, 1000, 6, None);
    assert_eq!(g.grid, (8, 6, 1));
    assert_eq!(g.block, (384, 1, 1));
    c.head_dim = 96;
    assert!(validate(&c).unwrap_err().contains("head_dim"));
}

/// PTX of the kernel for `c` (sm_90a), through the backend's own LLVM pipeline.
pub(super) fn ptx_for(c: &AttnKernelConfig) -> String {
    use crate::nvptx::target::{finish, prepare_module, target_machine, NvptxTarget};
    let ctx = Context::create();
    let m = ctx.create_module("ws");
    let tm = target_machine(NvptxTarget::Sm90a).unwrap();
    prepare_module(&m, &tm);
    build(&ctx, &m, c, &Identity, &c.kernel_name()).unwrap();
    finish(&m, &tm).unwrap().1
}

#[test]
fn ptx_has_the_roles_the_ring_and_the_register_split() {
    for d in HEAD_DIMS {
        let ptx = ptx_for(&cfg(d));
        let r = residency(d, 64);
        for want in [
            format!(".maxntid {}", r.threads()),
            format!(".minnctapersm {}", r.blocks_per_sm),
            format!("setmaxnreg.dec.sync.aligned.u32 \t{}", r.producer_regs),
            format!("setmaxnreg.inc.sync.aligned.u32 \t{}", r.consumer_regs),
            "cp.async.mbarrier.arrive.noinc.shared.b64".to_string(),
            "mbarrier.try_wait.parity.shared.b64".to_string(),
            "mbarrier.arrive.shared.b64".to_string(),
            "mbarrier.init.shared.b64".to_string(),
            "bar.sync \t0".to_string(),
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16".to_string(),
        ] {
            assert!(ptx.contains(&want), "D={d}: no `{want}` in the PTX");
        }
    }
}

/// D = 64 with 64-key tiles runs one block of three consumers per SM (issue 11 item 2; with
/// 128-key tiles two, as D = 128): 512 threads, 192 rows, `.maxntid 512`, 32 / 160 registers
/// after `setmaxnreg` within the block's pool of 512 x 128; its turns and exchange use named
/// barriers 4-7 (1-3 are the Q tiles). D = 128 keeps two consumers with 56 / 224 and the
/// barriers it had.
#[test]
fn d64_runs_three_consumers() {
    let r = residency(64, 64);
    assert_eq!(
        (r.consumers, r.blocks_per_sm, r.entry_regs, r.producer_regs, r.consumer_regs),
        (3, 1, 128, 32, 160)
    );
    assert_eq!((r.threads(), r.rows()), (512, 192));
    assert!(128 * r.producer_regs + 384 * r.consumer_regs <= r.threads() * r.entry_regs);
    // 128-key tiles at D = 64: two consumers with D = 128's registers (three spill at 160).
    let wide = residency(64, 128);
    assert_eq!((wide.consumers, wide.entry_regs, wide.producer_regs, wide.consumer_regs), (2, 168, 56, 224));
    for bn in [64, 128] {
        let r = residency(128, bn);
        assert_eq!((r.consumers, r.entry_regs, r.producer_regs, r.consumer_regs), (2, 168, 56, 224));
        assert_eq!((r.threads(), r.rows()), (THREADS, BLOCK_ROWS));
    }
    let c = cfg(64);
    let l = layout(&c).unwrap();
    assert_eq!((l.stages, l.kv0), (4, 3 * 8192));
    let g = launch_geometry(&c, 1000, 6, None);
    assert_eq!((g.grid, g.block), ((6, 6, 1), (512, 1, 1)));
    let ptx = ptx_for(&c);
    for want in [".maxntid 512", "bar.sync \t7, 128;", "mbarrier.init.shared.b64"] {
        assert!(ptx.contains(want), "no `{want}`");
    }
    // The three turn barriers (4, 5, 6) and the empty slots' 384 arrivals.
    assert!(ptx.contains("384;"), "no 384-arrival empty barrier");
    let ptx128 = ptx_for(&cfg(128));
    assert!(ptx128.contains("bar.sync \t5, 128;") && !ptx128.contains("bar.sync \t7"));
}

/// ptxas accepts the kernel and honours `setmaxnreg` (no C7508 "ignored" warning), for D = 64
/// and 128, f32 and bf16 output, with and without decay, under the register cap at entry of the
/// residency (168 at D = 128, 128 at D = 64). Spills: none with 64-key tiles; with 128-key
/// tiles the consumers hold S, O and two tiles of P: 28 bytes at D = 128 (224 registers) as
/// measured on the H200, 28 at D = 64 (160 registers): at most 64.
#[test]
fn assembles_with_ptxas_and_bounded_spills() {
    use crate::nvptx::ptxas;
    let Some(ptxas) = ptxas::find() else {
        eprintln!("note: ptxas not found (set $PTXAS); skipping the PTX assembly check");
        return;
    };
    for d in HEAD_DIMS {
        for (decay, bf16, bn) in [(true, true, 64), (false, false, 64), (true, true, 128)] {
            let mut c = cfg(d);
            c.has_decay = decay;
            c.prune = decay;
            c.out_half = bf16;
            c.bn = bn;
            let log = ptxas::assemble(&ptxas, &ptx_for(&c), "sm_90a")
                .unwrap_or_else(|log| panic!("ptxas failed on {}:\n{log}", c.kernel_name()));
            assert!(!log.contains("C7508") && !log.contains("warning"), "D={d}: {log}");
            let r = residency(d, bn);
            let entry = r.entry_regs;
            assert!(used_registers(&log) <= entry, "D={d} bn={bn}: over {entry} at entry: {log}");
            let limit = if bn == 64 { 0 } else { 64 };
            assert!(ptxas::spill_stores(&log) <= limit, "D={d} bn={bn}: {log}");
        }
    }
}

/// Registers per thread of the (one) kernel of a `ptxas -v` report.
pub(super) fn used_registers(report: &str) -> u32 {
    let at = report.find("Used ").expect("a register count in the ptxas report");
    report[at + 5..].split_whitespace().next().unwrap().parse().unwrap()
}

/// The tuned configuration at D = 128: 128-key tiles, decay, pruning, bf16 output.
fn tuned() -> AttnKernelConfig {
    let mut c = cfg(128);
    c.bn = 128;
    c.out_half = true;
    c
}

/// Each role issues its first copies (the producer's first K/V fill, a consumer's Q tile)
/// before the start search's first ballot, so they land while the search runs; and the
/// searches are split over the warps and exchanged behind a warpgroup barrier (the producer's
/// named barrier 5).
#[test]
fn first_loads_go_out_before_the_start_search() {
    let ptx = ptx_for(&tuned());
    let roles: Vec<&str> = ptx.split("setmaxnreg.").skip(1).collect();
    assert_eq!(roles.len(), 2, "a consumer and a producer section");
    for role in roles {
        let copy = role.find("cp.async.cg.shared.global").expect("a cp.async in the role");
        let ballot = role.find("vote.sync.ballot").expect("a start search in the role");
        assert!(copy < ballot, "the search comes before the first copy in:\n{}", &role[..200]);
    }
    assert!(ptx.contains("bar.sync \t5, 128;"), "no producer exchange barrier");
}

/// bf16 O leaves through shared memory in 16-byte stores, one per 8 columns of a row:
/// 64 rows x D / 8 chunks over a consumer's 128 threads.
#[test]
fn bf16_output_leaves_in_16_byte_stores() {
    for d in HEAD_DIMS {
        let mut c = tuned();
        c.head_dim = d;
        let ptx = ptx_for(&c);
        let wide = ptx.matches("st.global.v4.b32").count();
        assert_eq!(wide as u32, 64 * d / 8 / 128, "D={d}");
        // The only other global stores are the two LSE values of the thread's rows.
        assert_eq!(ptx.matches("st.global.b32").count() + ptx.matches("st.global.f32").count(), 2, "D={d}");
    }
}

/// The tuned configuration with the persistent grid.
fn persistent(tma: bool) -> AttnKernelConfig {
    let mut c = tuned();
    (c.tma, c.persistent) = (tma, true);
    c
}

/// The persistent kernel takes its items from the counter (one `atom.add`, by the producer),
/// keeps the item ring's four barriers beside the K/V ring's, takes `BH` and the counter last,
/// and only the producer searches (the consumers read the starts the producer posts); the tiles
/// kernel has none of it.
#[test]
fn persistent_kernel_hands_out_items_from_a_counter() {
    for tma in [true, false] {
        let c = persistent(tma);
        let name = c.kernel_name();
        assert!(name.contains("_persist_"), "{name}");
        let ptx = ptx_for(&c);
        assert_eq!(ptx.matches("atom.global.add.u32").count(), 1, "tma {tma}");
        let stages = layout(&c).unwrap().stages as usize;
        assert_eq!(ptx.matches("mbarrier.init.shared.b64").count(), 2 * stages + 4, "tma {tma}");
        let last = if tma { 11 } else { 9 };
        assert!(ptx.contains(&format!(".param .u32 {name}_param_{}", last - 1)), "no BH parameter");
        assert!(
            ptx.contains(&format!(".param .u64 .ptr .global .align 1 {name}_param_{last}\n")),
            "no counter"
        );
        let roles: Vec<&str> = ptx.split("setmaxnreg.").skip(1).collect();
        let (consumer, producer) = (roles[0], roles[1]);
        assert!(consumer.starts_with("inc") && producer.starts_with("dec"), "role order");
        assert!(!consumer.contains("vote.sync.ballot"), "a consumer searches (tma {tma})");
        assert!(producer.contains("vote.sync.ballot"), "the producer does not search (tma {tma})");
        let tiles = ptx_for(&AttnKernelConfig { persistent: false, ..c.clone() });
        assert!(!tiles.contains("atom.") && !tiles.contains("_persist_"), "tma {tma}");
    }
}

/// ptxas assembles the persistent kernel with `setmaxnreg` honoured: no spills with TMA, the
/// cp.async producer's address math spills a little (56 B with ptxas 13.0), as the tiles grid's
/// cp.async producer did (24 B).
#[test]
fn persistent_kernel_assembles_with_ptxas() {
    use crate::nvptx::ptxas;
    let Some(ptxas) = ptxas::find() else {
        eprintln!("note: ptxas not found (set $PTXAS); skipping the PTX assembly check");
        return;
    };
    for (tma, prune, limit) in [(true, true, 0), (true, false, 0), (false, true, 64)] {
        let mut c = persistent(tma);
        c.prune = prune;
        let log = ptxas::assemble(&ptxas, &ptx_for(&c), "sm_90a")
            .unwrap_or_else(|log| panic!("ptxas failed on {}:\n{log}", c.kernel_name()));
        assert!(!log.contains("C7508") && !log.contains("warning"), "{log}");
        assert!(ptxas::spill_stores(&log) <= limit, "tma {tma} prune {prune}: {log}");
    }
}

/// One block per SM, never more than the items; one per item without a device count. The
/// item ring fits beside a 3-slot ring of 128-key tiles at D = 128.
#[test]
fn persistent_launch_geometry_and_layout() {
    let c = persistent(true);
    let l = layout(&c).unwrap();
    assert_eq!(l.stages, 3);
    assert_eq!((l.item0 % 16, l.total - l.item0), (0, 72));
    assert!(l.total <= residency(128, 128).max_shared);
    assert_eq!(layout(&tuned()).unwrap().total, l.item0);
    // 1000 rows: 8 query tiles per head; 6 heads: 48 items.
    assert_eq!(launch_geometry(&c, 1000, 6, Some(132)).grid, (48, 1, 1));
    assert_eq!(launch_geometry(&c, 1000, 6, Some(16)).grid, (16, 1, 1));
    assert_eq!(launch_geometry(&c, 1000, 6, None).grid, (48, 1, 1));
    assert_eq!(launch_geometry(&tuned(), 1000, 6, Some(16)).grid, (8, 6, 1));
}

/// The persistent grid is refused where the block has three consumers (D = 64 with 64-key
/// tiles, not run with it), as a usage error naming the way out; two consumers take it.
#[test]
fn persistent_grid_needs_two_consumers() {
    let mut c = persistent(true);
    assert_eq!(check_persistent(&c), Ok(()));
    (c.head_dim, c.bn) = (64, 64);
    let e = check_persistent(&c).unwrap_err();
    assert!(e.contains("--ws-grid tiles") && e.contains("head_dim 64"), "{e}");
    assert!(validate(&c).is_err());
    c.bn = 128;
    assert_eq!(check_persistent(&c), Ok(()));
    c.bn = 64;
    c.persistent = false;
    assert_eq!(check_persistent(&c), Ok(()));
}

/// Queries fewer than keys: the `_fq` kernel takes `Tk` right after the tensor maps (before the
/// persistent grid's `BH` and counter), reads it, and assembles with the square kernel's
/// register and spill bounds: TMA and cp.async loads, the tiles and persistent grids, three
/// consumers at D = 64, dense too.
#[test]
fn fewer_queries_take_tk_after_the_maps_and_assemble() {
    use crate::nvptx::ptxas;
    let fq = |mut c: AttnKernelConfig| {
        c.fewer_queries = true;
        c
    };
    let dense = AttnKernelConfig { prune: false, has_decay: false, ..tuned() };
    let cp_async = AttnKernelConfig { tma: false, ..tuned() };
    let tma = AttnKernelConfig { tma: true, ..tuned() };
    let cfgs = [fq(tma.clone()), fq(cp_async), fq(persistent(true)), fq(cfg(64)), fq(dense)];
    let ptxas = ptxas::find();
    for c in cfgs {
        let name = c.kernel_name();
        let square = AttnKernelConfig { fewer_queries: false, ..c.clone() };
        assert_eq!(square.kernel_name().replace("_fq", ""), name.replace("_fq", ""));
        assert!(name.contains("_fq_"), "{name}");
        let ptx = ptx_for(&c);
        let at = ptx.find(&format!(".entry {name}(")).unwrap();
        let sig = &ptx[at..at + ptx[at..].find(')').unwrap()];
        let maps = if c.tma { 2 } else { 0 };
        let grid = if c.persistent { 2 } else { 0 };
        assert_eq!(sig.matches(".param").count(), 8 + maps + 1 + grid, "{name}");
        let tk = format!("{name}_param_{}", 8 + maps);
        assert!(sig.contains(&format!(".param .u32 {tk}")), "{name}: no u32 Tk at {tk}\n{sig}");
        assert!(ptx.contains(&format!("[{tk}]")), "{name}: Tk is never read");
        let Some(ptxas) = &ptxas else { continue };
        let log = ptxas::assemble(ptxas, &ptx, "sm_90a")
            .unwrap_or_else(|log| panic!("ptxas failed on {name}:\n{log}"));
        assert!(!log.contains("C7508") && !log.contains("warning"), "{name}: {log}");
        let r = residency(c.head_dim, c.bn);
        assert!(used_registers(&log) <= r.entry_regs, "{name}: {log}");
        let limit = if c.bn == 64 { 0 } else { 64 };
        assert!(ptxas::spill_stores(&log) <= limit, "{name}: {log}");
    }
}
