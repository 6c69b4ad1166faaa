//! One function per CLI command.

mod bench;
mod compile;
pub mod grad;
mod mask;
mod rules;
mod run;
mod verify;

pub use bench::bench;
pub use compile::compile;
pub use grad::grad;
pub use mask::mask;
pub use rules::rules;
pub use run::run;
pub use verify::verify;

use foxc_driver::pipeline::{parse_shape, Source};
use foxc_driver::{tensors, Error};
use std::path::Path;

/// `foxc check FILE`
pub fn check(file: &Path) -> Result<(), Error> {
    let src = Source::read(file)?;
    let c = src.compile()?;
    println!("{}: ok (attention @{}, {} parameters)", src.name, c.graph.name, c.graph.params.len());
    // Every backend runs what the front end accepts, except where the GPU says otherwise.
    let gpu = foxc_driver::target::DEFAULT_GPU;
    use foxc_driver::support::{gpu_support, GpuSupport, GPU_CHECK_MAX_NODES};
    let found = match gpu_support(&c.graph, gpu) {
        GpuSupport::Checked(found) => found,
        GpuSupport::TooLarge(n) => {
            println!(
                "note: not compiled for the GPU at check time: {n} IR nodes, over {GPU_CHECK_MAX_NODES} (`foxc compile FILE --emit ptx` compiles it)"
            );
            vec![]
        }
    };
    for u in found {
        if u.gpu_only {
            // The GPU's refusals of a construct say already that the CPU backend runs it.
            let cpu = if u.reason.contains("--backend cpu") {
                ""
            } else {
                "; the CPU backend and the reference can"
            };
            println!(
                "note: the CUDA backend ({}) cannot run the {} of this program: {}{cpu}",
                foxc_driver::target::name(gpu),
                u.path,
                u.reason
            );
        } else {
            println!(
                "note: no backend can run the {} of this program (foxc grad, training): {}",
                u.path, u.reason
            );
        }
    }
    Ok(())
}

/// Where the tensors of `run`, `grad` and `bench` come from: the safetensors file `--inputs`,
/// else the standard workload at `--shape`.
#[derive(Clone, Copy)]
pub(crate) enum Given<'a> {
    File(&'a Path),
    Standard(&'a str),
}

impl<'a> Given<'a> {
    /// `--inputs` if given (it conflicts with `--shape`), else `--shape`; `None` without either
    /// (each command says what it needs).
    pub(crate) fn of(inputs: Option<&'a Path>, shape: Option<&'a str>) -> Option<Given<'a>> {
        inputs.map(Given::File).or(shape.map(Given::Standard))
    }

    /// The tensors: the file read, or the standard workload drawn with `seed`.
    pub(crate) fn tensors(self, g: &foxc_ir::Graph, seed: u64) -> Result<foxc_runtime::TensorMap, Error> {
        match self {
            Given::File(path) => tensors::read(path),
            Given::Standard(shape) => tensors::generate(g, &parse_shape(shape)?, seed),
        }
    }
}

/// `foxc inputs FILE --shape ... -o in.safetensors`
pub fn inputs(file: &Path, shape: &str, seed: u64, o: &Path) -> Result<(), Error> {
    let src = Source::read(file)?;
    let c = src.compile()?;
    let dims = parse_shape(shape)?;
    let t = tensors::generate(&c.graph, &dims, seed)?;
    tensors::write(o, &t)?;
    for (name, x) in &t {
        println!("{name}: {} {:?}", x.dtype, x.shape);
    }
    println!("wrote {}", o.display());
    Ok(())
}
