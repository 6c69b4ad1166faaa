//! The front half of the pipeline: source file -> verified graph -> optimized graph.

pub use crate::options::pass_options;
use crate::Error;
use foxc_ir::frontend::{self, Compiled};
use foxc_ir::Graph;
use foxc_passes::{PassOptions, PassReport};
use std::collections::BTreeMap;
use std::path::Path;

/// The FoX program embedded in the binary: what `foxc run` runs without a file.
pub const DEFAULT_PROGRAM: (&str, &str) = ("examples/fox.attn", include_str!("../../examples/fox.attn"));
/// The shape of the embedded default run (small standard workload, CPU-sized).
pub const DEFAULT_SHAPE: &str = "B=1,H=8,T=4096,D=64";

/// A source file and the name diagnostics use for it.
pub struct Source {
    pub name: String,
    pub bytes: Vec<u8>,
}

impl Source {
    pub fn read(path: &Path) -> Result<Source, Error> {
        let bytes = std::fs::read(path)
            .map_err(|e| Error::user(format!("error: cannot read {}: {e}", path.display())))?;
        Ok(Source { name: path.display().to_string(), bytes })
    }

    pub fn embedded_default() -> Source {
        Source { name: DEFAULT_PROGRAM.0.to_string(), bytes: DEFAULT_PROGRAM.1.as_bytes().to_vec() }
    }

    /// Parse, check and lower; a failure carries the rendered diagnostics.
    pub fn compile(&self) -> Result<Compiled, Error> {
        frontend::compile(&self.name, &self.bytes).map_err(|d| {
            let text = d.render_bytes(&self.name, &self.bytes);
            if d.is_internal() {
                Error::internal(text)
            } else {
                Error::user(text)
            }
        })
    }

    pub fn parse(&self) -> Result<foxc_ir::ast::Program, Error> {
        frontend::parse(&self.name, &self.bytes)
            .map_err(|d| Error::user(d.render_bytes(&self.name, &self.bytes)))
    }
}

/// The sizes that `inputs` bind in `g`, by dim name: what the passes may specialize on
/// ([`PassOptions::dims`], e.g. the head dim that picks the GPU tiles).
pub fn bound_dims(g: &Graph, inputs: &foxc_runtime::TensorMap) -> Result<BTreeMap<String, u64>, Error> {
    let shapes: Vec<(String, Vec<usize>)> =
        inputs.iter().map(|(k, t)| (k.clone(), t.shape.clone())).collect();
    let dims = foxc_ir::shapes::bind_dims(g, &shapes).map_err(|e| Error::user(format!("error: {e}")))?;
    Ok(dims.0)
}

/// Run the pass pipeline on a copy of `g`.
pub fn optimize(g: &Graph, opts: &PassOptions) -> Result<(Graph, PassReport), Error> {
    let mut opt = g.clone();
    let report = foxc_passes::optimize(&mut opt, opts).map_err(|e| match e {
        // An option out of its range (`--log-eps`) is the user's; anything else is foxc's.
        foxc_passes::PassError::InvalidOption(_) => Error::user(format!("error: {e}")),
        _ => Error::internal(format!("error: {e}")),
    })?;
    Ok((opt, report))
}

/// The head dim code generation specializes on when the user gives none.
pub const DEFAULT_CODEGEN_D: u64 = 64;

/// Dims that code generation specializes on: `shape`, with D defaulted to
/// [`DEFAULT_CODEGEN_D`].
pub fn codegen_dims(shape: Option<BTreeMap<String, u64>>) -> BTreeMap<String, u64> {
    let mut dims = shape.unwrap_or_default();
    dims.entry("D".to_string()).or_insert(DEFAULT_CODEGEN_D);
    dims
}

/// Parse `B=2,H=4,T=1024,D=64` into dim bindings.
pub fn parse_shape(s: &str) -> Result<BTreeMap<String, u64>, Error> {
    let mut out = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| Error::user(format!("error: bad --shape entry `{part}`: expected NAME=SIZE")))?;
        let v: u64 = v.trim().parse().map_err(|_| {
            Error::user(format!("error: bad --shape size `{v}` for {k}: expected a positive integer"))
        })?;
        if v == 0 {
            return Err(Error::user(format!("error: --shape {k}=0: sizes must be at least 1")));
        }
        if out.insert(k.trim().to_string(), v).is_some() {
            return Err(Error::user(format!("error: --shape names {k} twice")));
        }
    }
    if out.is_empty() {
        return Err(Error::user("error: --shape is empty: expected e.g. B=1,H=2,T=64,D=16"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_parses_and_rejects() {
        let s = parse_shape("B=2, H=4,T=1024,D=64").unwrap();
        assert_eq!(s["T"], 1024);
        assert_eq!(s.len(), 4);
        assert!(parse_shape("B=0").is_err());
        assert!(parse_shape("B").is_err());
        assert!(parse_shape("B=x").is_err());
        assert!(parse_shape("B=1,B=2").is_err());
        assert!(parse_shape("").is_err());
    }
}
