//! Free-running consumers (`turns = none`, `cfg.free_running`): the kernel without the
//! consumers' ring of turns, everything else as with it.

use super::tests::{ptx_for, used_registers};
use super::*;

/// The configurations the A/B runs: D = 64's three consumers (64-key tiles) and two (128-key
/// tiles), D = 128's two (128-key tiles), with decay, pruning, TMA loads and bf16 output.
fn configs() -> Vec<AttnKernelConfig> {
    [(64, 64), (64, 128), (128, 128)]
        .into_iter()
        .map(|(d, bn)| {
            let mut c = AttnKernelConfig::new(d, true, true);
            (c.ws, c.tma, c.out_half, c.bn) = (true, true, true, bn);
            c
        })
        .collect()
}

/// The turn barriers' instructions in `ptx`: `bar.sync` / `bar.arrive` for 256 threads (the
/// waiting consumer and the one handing over). Every other named barrier of the kernel is one
/// warpgroup's (128: the Q tiles, the start exchanges) or the block's (`bar.sync 0`).
fn turn_barriers(ptx: &str) -> usize {
    ptx.lines()
        .map(str::trim)
        .filter(|l| (l.starts_with("bar.sync") || l.starts_with("bar.arrive")) && l.ends_with(", 256;"))
        .count()
}

/// Counts of the instructions the turns do not touch: the GEMMs, the ring's mbarriers, the
/// register split, the per-warpgroup barriers.
fn untouched(ptx: &str) -> Vec<(&'static str, usize)> {
    ["wgmma.mma_async", "wgmma.wait_group", "wgmma.commit_group", "mbarrier.", "setmaxnreg.", ", 128;"]
        .into_iter()
        .map(|k| (k, ptx.matches(k).count()))
        .collect()
}

/// `none` emits no turn barrier at all (no `bar.arrive`: the only arrivals without waiting are
/// the hand-overs), the ring has them (the first hand-over is `bar.arrive` on consumer 0's
/// turn barrier, `nc + 1`); the rest of the kernel keeps its instruction counts. The tiles grid
/// and (D = 128) the persistent one.
#[test]
fn free_running_consumers_take_no_turns() {
    let mut cases = configs();
    let mut p = configs().pop().unwrap();
    p.persistent = true;
    cases.push(p);
    for ring in cases {
        let free = AttnKernelConfig { free_running: true, ..ring.clone() };
        let name = free.kernel_name();
        assert!(name.contains("_free_") && !ring.kernel_name().contains("_free"), "{name}");
        let (pr, pf) = (ptx_for(&ring), ptx_for(&free));
        let nc = residency(ring.head_dim, ring.bn).consumers;
        assert!(turn_barriers(&pr) > 0, "{name}: the ring has no turn barriers");
        assert!(pr.contains(&format!("bar.arrive \t{}, 256;", nc + 1)), "{name}: no first hand-over");
        assert_eq!(turn_barriers(&pf), 0, "{name}: turn barriers in the free-running kernel");
        assert!(!pf.contains("bar.arrive"), "{name}: a hand-over in the free-running kernel");
        assert_eq!(untouched(&pr), untouched(&pf), "{name}");
    }
}

/// ptxas accepts the free-running kernels with `setmaxnreg` honoured, within the registers at
/// entry, with no more spills than the ring's build (which at D = 64 with 128-key tiles spills
/// 16-28 bytes).
#[test]
fn free_running_assembles_with_ptxas() {
    use crate::nvptx::ptxas;
    let Some(ptxas) = ptxas::find() else {
        eprintln!("note: ptxas not found (set $PTXAS); skipping the PTX assembly check");
        return;
    };
    for ring in configs() {
        let free = AttnKernelConfig { free_running: true, ..ring.clone() };
        let assemble = |c: &AttnKernelConfig| {
            ptxas::assemble(&ptxas, &ptx_for(c), "sm_90a")
                .unwrap_or_else(|log| panic!("ptxas failed on {}:\n{log}", c.kernel_name()))
        };
        let (lr, lf) = (assemble(&ring), assemble(&free));
        let name = free.kernel_name();
        assert!(!lf.contains("C7508") && !lf.contains("warning"), "{name}: {lf}");
        let entry = residency(free.head_dim, free.bn).entry_regs;
        assert!(used_registers(&lf) <= entry, "{name}: over {entry} at entry: {lf}");
        let (sr, sf) = (ptxas::spill_stores(&lr), ptxas::spill_stores(&lf));
        eprintln!("{name}: spill stores {sf} (ring {sr})");
        assert!(sf <= sr.max(if free.bn == 64 { 0 } else { 64 }), "{name}: {lf}");
    }
}
