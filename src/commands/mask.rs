//! `foxc mask`: the pruning map as a PNG. One panel per head (batch 0): a pixel block per
//! (query tile, key tile); dark = kept, orange = skipped by ACP, white = above the diagonal.

use crate::cli::{PruneArgs, TargetArg};
use crate::pipeline::{self, Source};
use crate::{acp_stats, tensors, Error};
use std::path::Path;

const KEPT: [u8; 3] = [30, 60, 120];
const SKIPPED: [u8; 3] = [250, 190, 120];
const EMPTY: [u8; 3] = [255, 255, 255];
const GAP: [u8; 3] = [200, 200, 200];

pub fn mask(
    file: &Path,
    inputs: &Path,
    png_path: &Path,
    prune: &PruneArgs,
    target: TargetArg,
) -> Result<(), Error> {
    let src = Source::read(file)?;
    let c = src.compile()?;
    let inputs = tensors::read(inputs)?;
    tensors::validate(&c.graph, &inputs)?;
    let (opt, _) = pipeline::optimize(&c.graph, &pipeline::pass_options(prune, target, false))?;
    let stats = acp_stats::measure(&opt, &tensors::to_interp(&inputs))?.ok_or_else(|| {
        Error::user("error: no decay attention recognized: nothing to draw (see foxc compile --explain)")
    })?;
    let [_, h, mt] = [stats.start.shape[0], stats.start.shape[1], stats.start.shape[2]];
    let t =
        inputs.values().find(|x| x.shape.len() == 4).map(|x| x.shape[2]).unwrap_or(mt * stats.bm as usize);
    let nt = t.div_ceil(stats.bn as usize);
    let scale = (256 / mt.max(nt)).clamp(1, 16);
    let (pw, ph) = (nt * scale, mt * scale);
    let cols = h.min(4);
    let rows = h.div_ceil(cols);
    let (w, hgt) = (cols * (pw + 2) + 2, rows * (ph + 2) + 2);
    let mut img = vec![0u8; w * hgt * 3];
    for px in img.chunks_exact_mut(3) {
        px.copy_from_slice(&GAP);
    }
    for head in 0..h {
        let (ox, oy) = (2 + (head % cols) * (pw + 2), 2 + (head / cols) * (ph + 2));
        for m in 0..mt {
            let start = stats.start.data[head * mt + m] as usize;
            let last_row = ((m + 1) * stats.bm as usize).min(t) - 1;
            let diag = last_row / stats.bn as usize;
            for n in 0..nt {
                let color = if n > diag {
                    EMPTY
                } else if n < start {
                    SKIPPED
                } else {
                    KEPT
                };
                for y in 0..scale {
                    for x in 0..scale {
                        let p = ((oy + m * scale + y) * w + ox + n * scale + x) * 3;
                        img[p..p + 3].copy_from_slice(&color);
                    }
                }
            }
        }
    }
    write_png(png_path, w as u32, hgt as u32, &img)?;
    println!(
        "wrote {} ({} heads of batch 0, {}x{} tiles each, {}x{} px); kept {:.3} of causal tiles",
        png_path.display(),
        h,
        mt,
        nt,
        w,
        hgt,
        stats.kept_tile_fraction
    );
    Ok(())
}

fn write_png(path: &Path, w: u32, h: u32, rgb: &[u8]) -> Result<(), Error> {
    let file = std::fs::File::create(path)
        .map_err(|e| Error::user(format!("error: cannot write {}: {e}", path.display())))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut writer = enc.write_header().map_err(|e| Error::internal(format!("error: png: {e}")))?;
    writer.write_image_data(rgb).map_err(|e| Error::internal(format!("error: png: {e}")))?;
    Ok(())
}
