//! `foxc bench`: median time of the pruned and the dense (`--no-prune`) program on the
//! standard workload (or given inputs), in one process, with the kept fraction and the rate on kept work.
//! `--grad` times the gradient program instead (forward + backward, every gradient).

use super::Given;
use crate::cli::{BenchArgs, FormatArg};
use foxc_driver::pipeline::{self, parse_shape, Source};
use foxc_driver::{acp_stats, tensors, Backend, Error};
use foxc_ir::Graph;
use foxc_runtime::TensorMap;

struct Row {
    variant: &'static str,
    median_ms: f64,
    min_ms: f64,
    /// The kept tile fraction and the kept work in FLOPs; `None` where the reference
    /// interpreter cannot compute them at these sizes ([`acp_stats::beyond_reference`]).
    kept: Option<(f64, f64)>,
}

impl Row {
    fn kept_tiles(&self) -> Option<f64> {
        self.kept.map(|k| k.0)
    }

    /// GFLOP/s on the kept work.
    fn gflops_kept(&self) -> Option<f64> {
        self.kept.map(|k| k.1 / self.median_ms / 1e6)
    }
}

/// `x` with `decimals` decimals, or `missing` where there is none.
fn or_missing(x: Option<f64>, decimals: usize, missing: &str) -> String {
    x.map_or_else(|| missing.to_string(), |x| format!("{x:.decimals$}"))
}

/// The backward's FLOPs counted as 2.5 times the forward's (the convention of issue 9).
const BACKWARD_FLOPS: f64 = 2.5;

/// Median and minimum time of the gradient program of `opt` (seeded `dout`).
fn time_grad(
    backend: &dyn Backend,
    fwd: &Graph,
    opt: &Graph,
    inputs: &TensorMap,
    seed: u64,
    iters: usize,
) -> Result<(f64, f64), Error> {
    let program = foxc_driver::grad::grad_program(opt, backend.target())?;
    let mut inputs = inputs.clone();
    let dout = foxc_driver::grad::seeded_dout(&program, fwd, &inputs, seed)?;
    inputs.insert(foxc_passes::grad::DOUT.to_string(), dout);
    let s = backend.bench(&program.graph, &program.outputs, &inputs, iters)?;
    Ok((s.median_ms, s.min_ms))
}

pub fn bench(a: &BenchArgs) -> Result<(), Error> {
    let src = Source::read(&a.file)?;
    let c = src.compile()?;
    let given = Given::of(a.inputs.as_deref(), a.shape.as_deref())
        .ok_or_else(|| Error::user("error: `foxc bench` needs --shape or --inputs"))?;
    let inputs = given.tensors(&c.graph, a.seed)?;
    tensors::validate(&c.graph, &inputs)?;
    // The shape's own dims (those the standard workload was drawn at), or the ones the given
    // inputs bind; and how the rows name them.
    let (dims, shape) = match given {
        Given::File(path) => (pipeline::bound_dims(&c.graph, &inputs)?, format!("inputs {}", path.display())),
        Given::Standard(shape) => (parse_shape(shape)?, shape.to_string()),
    };
    let kind = a.backend;
    let backend = foxc_driver::backend(kind);
    // The statistics come from the reference interpreter, which stops at 2^28 elements a
    // tensor: beyond it the rows leave them out (and the inputs are not copied to f64).
    let beyond = acp_stats::beyond_reference(&inputs);
    if let Some(why) = &beyond {
        eprintln!("note: kept tiles not computed: {why}");
    }
    let interp_inputs = if beyond.is_none() { tensors::to_interp(&inputs) } else { Default::default() };
    let mut rows = Vec::new();
    let mut variants = vec![("dense", true)];
    if !a.prune.no_prune {
        variants.insert(0, ("pruned", false));
    }
    for (variant, no_prune) in variants {
        let p = foxc_driver::PruneOptions { no_prune, ..a.prune.options() };
        let mut opts = pipeline::pass_options(&p, backend.target(), false)?;
        opts.dims = dims.clone();
        opts.gradient = a.grad;
        let (opt, _) = pipeline::optimize(&c.graph, &opts)?;
        // The kept set the backend used: the CPU kernels' own block starts; the GPU kernel does
        // not report its own, so the reference's stand in there.
        let starts = backend.block_starts(&opt, &inputs)?;
        let stats = match beyond {
            None => Some(acp_stats::measure_with(&opt, &interp_inputs, starts.as_ref())?),
            Some(_) => None,
        };
        let (median_ms, min_ms) = if a.grad {
            time_grad(&*backend, &c.graph, &opt, &inputs, a.seed, a.iters.max(1))?
        } else {
            let s = backend.bench(&opt, &[], &inputs, a.iters.max(1))?;
            (s.median_ms, s.min_ms)
        };
        // The dense program's stats count what its kernels still skip: the tiles below a key
        // bound (packed sequences), none otherwise. The backward walks the forward's kept set:
        // its work is the forward's times 2.5.
        let work = if a.grad { 1.0 + BACKWARD_FLOPS } else { 1.0 };
        let kept = stats.map(|s| match s {
            Some(s) => (s.kept_tile_fraction, s.kept_flops * work),
            None => (1.0, 0.0),
        });
        rows.push(Row { variant, median_ms, min_ms, kept });
    }
    let backend = kind.name();
    let pass = if a.grad { "forward+backward" } else { "forward" };
    match a.format {
        FormatArg::Table => {
            println!("foxc bench: {} {pass} on {backend}, {shape} (seed {})", src.name, a.seed);
            println!(
                "{:<8} {:>11} {:>11} {:>11} {:>13}",
                "variant", "median ms", "min ms", "kept tiles", "GFLOP/s kept"
            );
            for r in &rows {
                println!(
                    "{:<8} {:>11.3} {:>11.3} {:>11} {:>13}",
                    r.variant,
                    r.median_ms,
                    r.min_ms,
                    or_missing(r.kept_tiles(), 3, "n/a"),
                    or_missing(r.gflops_kept(), 1, "n/a")
                );
            }
            if rows.len() >= 2 && rows[0].variant == "pruned" {
                println!(
                    "pruned/dense time {:.3} vs kept fraction {}",
                    rows[0].median_ms / rows[1].median_ms,
                    or_missing(rows[0].kept_tiles(), 3, "n/a")
                );
            }
        }
        FormatArg::Csv => {
            println!("program,pass,backend,shape,variant,median_ms,min_ms,kept_tiles,gflops_kept");
            for r in &rows {
                println!(
                    "{},{pass},{backend},\"{}\",{},{:.4},{:.4},{},{}",
                    src.name,
                    shape,
                    r.variant,
                    r.median_ms,
                    r.min_ms,
                    or_missing(r.kept_tiles(), 4, ""),
                    or_missing(r.gflops_kept(), 2, "")
                );
            }
        }
        FormatArg::Json => {
            let v: Vec<serde_json::Value> = rows
                .iter()
                .map(|r| {
                    serde_json::json!({
                        "program": src.name, "pass": pass, "backend": backend, "shape": shape, "variant": r.variant,
                        "median_ms": r.median_ms, "min_ms": r.min_ms, "kept_tiles": r.kept_tiles(),
                        "gflops_kept": r.gflops_kept(),
                    })
                })
                .collect();
            println!("{}", serde_json::Value::Array(v));
        }
    }
    Ok(())
}
