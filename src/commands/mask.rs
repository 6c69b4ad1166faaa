//! `foxc mask`: the pruning map as a PNG. One panel per head (batch 0): a pixel block per
//! (query tile, key tile); dark = kept, orange = skipped (by ACP or the key bound), white =
//! above the diagonal (queries fewer than keys sit at the end of the keys).
//! With `--rules a,b` the rules' maps stand side by side (a column of panels per rule, heads
//! down the rows), each reported with its kept fraction and its largest pruned mass.

use crate::cli::PruneArgs;
use foxc_driver::pipeline::{self, Source};
use foxc_driver::{acp_stats, tensors, Error, Target};
use foxc_ir::interp::{self, Tensor};
use std::collections::BTreeMap;
use std::path::Path;

const KEPT: [u8; 3] = [30, 60, 120];
const SKIPPED: [u8; 3] = [250, 190, 120];
const EMPTY: [u8; 3] = [255, 255, 255];
const GAP: [u8; 3] = [200, 200, 200];

/// Largest `B*H*T*T` for which the pruned mass is measured over every row (full f64 attention);
/// beyond it, over a deterministic sample of rows (the interpreter's row entry point).
const FULL_MASS_LIMIT: u64 = 1 << 26;

/// The largest pruned mass of any row (or of the sampled rows) and what was covered.
/// `stats` gives the rows: its block starts' batch-heads and its queries.
fn max_pruned_mass(
    g: &foxc_ir::Graph,
    inputs: &BTreeMap<String, Tensor>,
    stats: &acp_stats::AcpStats,
) -> Result<(f64, String), Error> {
    let err = |e: interp::InterpError| Error::user(format!("error: reference interpreter: {e}"));
    let Some(node) = acp_stats::attention_node(g) else { return Ok((0.0, "no attention".into())) };
    let (heads, t) = (stats.start.shape[0] * stats.start.shape[1], stats.queries as usize);
    if (heads * t) as u64 * stats.keys <= FULL_MASS_LIMIT {
        let r = interp::run(g, inputs).map_err(err)?;
        return Ok((r.prune.iter().map(|p| p.max_pruned_mass).fold(0.0, f64::max), "all rows".into()));
    }
    let rows: Vec<(usize, usize)> =
        (0..256).map(|s| ((s * 7919) % heads, (s as u64 * 2654435761 % t as u64) as usize)).collect();
    let got = interp::attention::sample_rows(g, inputs, node, &rows).map_err(err)?;
    Ok((got.iter().map(|r| r.pruned_mass).fold(0.0, f64::max), format!("{} sampled rows", rows.len())))
}

pub fn mask(
    file: &Path,
    inputs: &Path,
    png_path: &Path,
    prune: &PruneArgs,
    target: Target,
    rules: &[foxc_ir::PruneRule],
) -> Result<(), Error> {
    let src = Source::read(file)?;
    let c = src.compile()?;
    let inputs = tensors::read(inputs)?;
    tensors::validate(&c.graph, &inputs)?;
    let interp_inputs = tensors::to_interp(&inputs);
    let rules: Vec<foxc_ir::PruneRule> =
        if rules.is_empty() { vec![prune.prune_rule.clone()] } else { rules.to_vec() };
    let mut maps = vec![];
    for rule in &rules {
        let p = foxc_driver::PruneOptions { prune_rule: rule.clone(), ..prune.options() };
        let (opt, _) = pipeline::optimize(&c.graph, &pipeline::pass_options(&p, target, false)?)?;
        let stats = acp_stats::measure(&opt, &interp_inputs)?.ok_or_else(|| {
            Error::user("error: no decay attention recognized: nothing to draw (see foxc compile --explain)")
        })?;
        // A single rule keeps the old, cheap behaviour: no f64 attention run.
        let mass = if rules.len() > 1 { Some(max_pruned_mass(&opt, &interp_inputs, &stats)?) } else { None };
        maps.push((rule, stats, mass));
    }
    let s0 = &maps[0].1;
    let [_, h, mt] = [s0.start.shape[0], s0.start.shape[1], s0.start.shape[2]];
    let nt = s0.keys.div_ceil(s0.bn as u64) as usize;
    let scale = (256 / mt.max(nt)).clamp(1, 16);
    let (pw, ph) = (nt * scale, mt * scale);
    // One rule: heads in a grid of up to 4 columns; several: a column per rule, a row per head.
    let (cols, rows) = if maps.len() == 1 { (h.min(4), h.div_ceil(h.min(4))) } else { (maps.len(), h) };
    let (w, hgt) = (cols * (pw + 2) + 2, rows * (ph + 2) + 2);
    let mut img = vec![0u8; w * hgt * 3];
    for px in img.chunks_exact_mut(3) {
        px.copy_from_slice(&GAP);
    }
    for (r, (_, stats, _)) in maps.iter().enumerate() {
        for head in 0..h {
            let (col, row) = if maps.len() == 1 { (head % cols, head / cols) } else { (r, head) };
            let (ox, oy) = (2 + col * (pw + 2), 2 + row * (ph + 2));
            for m in 0..mt {
                let (first, last) = stats.walk(head, m);
                for n in 0..nt {
                    let color = tile_color(n as u64, (first, last));
                    for y in 0..scale {
                        for x in 0..scale {
                            let p = ((oy + m * scale + y) * w + ox + n * scale + x) * 3;
                            img[p..p + 3].copy_from_slice(&color);
                        }
                    }
                }
            }
        }
    }
    write_png(png_path, w as u32, hgt as u32, &img)?;
    println!(
        "wrote {} ({} heads of batch 0, {}x{} tiles each, {}x{} px)",
        png_path.display(),
        h,
        mt,
        nt,
        w,
        hgt
    );
    for (rule, stats, mass) in &maps {
        let m = match mass {
            Some((m, cov)) => format!(", max pruned mass {m:.3e} ({cov}; eps {:.3e})", prune.log_eps.exp()),
            None => String::new(),
        };
        println!("  {:<12} kept {:.3} of causal tiles{m}", rule.name, stats.kept_tile_fraction);
    }
    Ok(())
}

/// The color of key tile `n` of a query tile that walks the key tiles `first..=last`.
fn tile_color(n: u64, (first, last): (u64, u64)) -> [u8; 3] {
    if n > last {
        EMPTY
    } else if n < first {
        SKIPPED
    } else {
        KEPT
    }
}

fn write_png(path: &Path, w: u32, h: u32, rgb: &[u8]) -> Result<(), Error> {
    let mut bytes = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut bytes, w, h);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut writer = enc.write_header().map_err(|e| Error::internal(format!("error: png: {e}")))?;
        writer.write_image_data(rgb).map_err(|e| Error::internal(format!("error: png: {e}")))?;
    }
    foxc_runtime::io::write_atomic(path, &bytes).map_err(|e| Error::user(format!("error: {e}")))
}
