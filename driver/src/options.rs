//! What the user chooses about pruning and the sm_90a forward kernel, as plain values, and the
//! defaults of every front end (the CLI's flags and Python's keyword arguments read these).

use crate::{Error, Target};
use foxc_ir::attention::{KvLoads, WsGrid, WsTurns};
use foxc_ir::{PruneRule, Tiles};
use foxc_passes::fuse_load_map::QMap;
use foxc_passes::tiles::ForwardKernel;
use foxc_passes::PassOptions;

/// ln(eps) of the pruning unless the user says otherwise (defined once, by the passes).
pub use foxc_passes::DEFAULT_LOG_EPS;

/// The safe threshold rule unless the user says otherwise: the first of the table.
pub const DEFAULT_PRUNE_RULE: &str = foxc_passes::rules::RULES[0].name;

/// The pruning choices of one compilation. `None`: the tiles pass's choice for the target.
#[derive(Clone, Debug, PartialEq)]
pub struct PruneOptions {
    /// Keep dense attention (no ACP).
    pub no_prune: bool,
    /// ln(eps): the pruned attention mass per row stays below eps.
    pub log_eps: f64,
    /// The safe threshold rule (an entry of `foxc_passes::rules::RULES`).
    pub prune_rule: PruneRule,
    /// ACP tile shape.
    pub tiles: Option<Tiles>,
    /// How the sm_90a warp-specialized forward loads K and V.
    pub ws_loads: Option<KvLoads>,
    /// The sm_90a warp-specialized forward's grid.
    pub ws_grid: Option<WsGrid>,
    /// Whether its consumer warpgroups take turns at the tensor cores.
    pub ws_turns: Option<WsTurns>,
    /// The sm_90a forward kernel.
    pub attn_kernel: Option<ForwardKernel>,
    /// Where q's elementwise statement (RoPE's rotation) is computed.
    pub q_map: Option<QMap>,
    /// Key tiles per block of a GPU decode step's split-keys kernel.
    pub split_key_tiles: Option<u32>,
    /// Bounds `(q_max, k_max)` the caller guarantees on every query's and key's norm
    /// (`PassOptions::norm_bounds`: the threshold reads no norms from the data).
    pub norm_bounds: Option<(f64, f64)>,
}

impl Default for PruneOptions {
    fn default() -> PruneOptions {
        PruneOptions {
            no_prune: false,
            log_eps: DEFAULT_LOG_EPS,
            prune_rule: foxc_passes::rules::default_rule(),
            tiles: None,
            ws_loads: None,
            ws_grid: None,
            ws_turns: None,
            attn_kernel: None,
            q_map: None,
            split_key_tiles: None,
            norm_bounds: None,
        }
    }
}

impl PruneOptions {
    /// The GPU forward's choices that are set, by the CLI flag that sets them (for the
    /// refusal on the CPU, where nothing would read them).
    fn gpu_only_given(&self) -> Option<&'static str> {
        let given = [
            ("--ws-loads", self.ws_loads.is_some()),
            ("--ws-grid", self.ws_grid.is_some()),
            ("--ws-turns", self.ws_turns.is_some()),
            ("--attn-kernel", self.attn_kernel.is_some()),
            ("--split-key-tiles", self.split_key_tiles.is_some()),
        ];
        given.iter().find(|(_, g)| *g).map(|(flag, _)| *flag)
    }
}

/// The pass options of `prune` for `target`. The GPU forward's choices are refused on the CPU,
/// where nothing would read them.
pub fn pass_options(
    prune: &PruneOptions,
    target: Target,
    print_after_all: bool,
) -> Result<PassOptions, Error> {
    if !target.is_gpu() {
        if let Some(flag) = prune.gpu_only_given() {
            return Err(Error::user(format!(
                "error: {flag} chooses how a GPU forward kernel runs; this command's target is the CPU (use --backend cuda, or --target sm_90a with compile)"
            )));
        }
    }
    if let Some((q, k)) = prune.norm_bounds {
        if !(q.is_finite() && k.is_finite() && q > 0.0 && k > 0.0) {
            return Err(Error::user(format!(
                "error: norm bounds must be finite and positive, got q_max = {q}, k_max = {k}"
            )));
        }
    }
    if let Some(t) = prune.split_key_tiles {
        if !(1..=MAX_SPLIT_KEY_TILES).contains(&t) {
            return Err(Error::user(format!(
                "error: --split-key-tiles {t}: key tiles per block must be 1 to {MAX_SPLIT_KEY_TILES}"
            )));
        }
    }
    Ok(PassOptions {
        prune: !prune.no_prune,
        log_eps: prune.log_eps,
        rule: prune.prune_rule.clone(),
        target,
        print_after_all,
        tiles: prune.tiles,
        ws_loads: prune.ws_loads,
        ws_grid: prune.ws_grid,
        ws_turns: prune.ws_turns,
        attn_kernel: prune.attn_kernel,
        q_map: prune.q_map,
        split_key_tiles: prune.split_key_tiles,
        norm_bounds: prune.norm_bounds,
        ..PassOptions::default()
    })
}

/// The most key tiles a split-keys block walks (`--split-key-tiles`): 1024 tiles of 128 keys
/// are 131072 keys a block, one block per head at the longest decode benchmarked.
pub const MAX_SPLIT_KEY_TILES: u32 = 1024;

/// Parse `-8,-12,-inf` (the CLI's `--thresholds`) into the rule of per-head thresholds
/// (`PruneRule::given_thresholds`, also Python's `thresholds=`: one per query head, each `<= 0`,
/// `-inf` never prunes the head). Not a safety proof (docs/RULES.md, "Given thresholds"); a
/// program of another head count is refused when its dims are bound (`validate::check_inputs`).
pub fn parse_thresholds(s: &str) -> Result<PruneRule, String> {
    let values = s
        .split(',')
        .map(|v| {
            let v = v.trim();
            v.parse::<f64>().map_err(|_| {
                format!("expected numbers <= 0 separated by commas (e.g. -8,-12,-inf), got `{v}`")
            })
        })
        .collect::<Result<Vec<f64>, String>>()?;
    PruneRule::given_thresholds(&values)
}

/// A tile size foxc's kernels take: a power of two from 8 to 256.
fn valid_tile(x: u32) -> bool {
    x.is_power_of_two() && (8..=256).contains(&x)
}

fn bad_tile(v: impl std::fmt::Display) -> String {
    format!("tile sizes must be powers of two from 8 to 256, got `{v}`")
}

/// A tile shape BM x BN (Python's `tiles=(bm, bn)`).
pub fn tiles(bm: u32, bn: u32) -> Result<Tiles, String> {
    let check = |x: u32| if valid_tile(x) { Ok(x) } else { Err(bad_tile(x)) };
    Ok(Tiles { bm: check(bm)?, bn: check(bn)? })
}

/// Parse `128x64` (the CLI's `--tiles`); the message quotes a bad size as written.
pub fn parse_tiles(s: &str) -> Result<Tiles, String> {
    let (m, n) = s.split_once(['x', 'X']).ok_or_else(|| format!("expected BMxBN (e.g. 64x64), got `{s}`"))?;
    let parse = |v: &str| match v.trim().parse::<u32>() {
        Ok(x) if valid_tile(x) => Ok(x),
        _ => Err(bad_tile(v)),
    };
    Ok(Tiles { bm: parse(m)?, bn: parse(n)? })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_tiles(t: u32, target: Target) -> Result<PassOptions, Error> {
        pass_options(&PruneOptions { split_key_tiles: Some(t), ..PruneOptions::default() }, target, false)
    }

    #[test]
    fn split_key_tiles_in_range_on_a_gpu_target() {
        assert_eq!(with_tiles(4, Target::Sm90a).unwrap().split_key_tiles, Some(4));
        assert_eq!(
            with_tiles(MAX_SPLIT_KEY_TILES, Target::Sm80).unwrap().split_key_tiles,
            Some(MAX_SPLIT_KEY_TILES)
        );
        for bad in [0, MAX_SPLIT_KEY_TILES + 1] {
            let e = with_tiles(bad, Target::Sm90a).unwrap_err().to_string();
            assert!(e.contains(&format!("--split-key-tiles {bad}: key tiles per block must be 1 to")), "{e}");
        }
        let e = with_tiles(4, Target::Cpu).unwrap_err().to_string();
        assert!(e.contains("--split-key-tiles chooses how a GPU forward kernel runs"), "{e}");
    }
}
