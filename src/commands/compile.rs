//! `foxc compile FILE --emit ast|ir|opt|grad|clif|llvm|ptx|grad-ptx`

use crate::cli::{CompileArgs, EmitArg};
use foxc_driver::pipeline::{self, parse_shape, Source};
use foxc_driver::{cpu_backend, cuda_backend, target, Error, Target};
use foxc_ir::print::{print_graph, to_dot};

pub fn compile(a: &CompileArgs) -> Result<(), Error> {
    let src = Source::read(&a.file)?;
    let text = match a.emit {
        EmitArg::Ast => src.parse()?.to_string(),
        EmitArg::Ir => {
            let c = src.compile()?;
            if a.dot {
                to_dot(&c.graph)
            } else {
                print_graph(&c.graph)
            }
        }
        _ => {
            let c = src.compile()?;
            let target: Target = match (a.emit, a.target) {
                (EmitArg::Llvm | EmitArg::Ptx | EmitArg::GradPtx, None) => target::DEFAULT_GPU,
                (EmitArg::Llvm | EmitArg::Ptx | EmitArg::GradPtx, Some(t)) if !t.is_gpu() => {
                    return Err(Error::user(
                        "error: --emit llvm, ptx and grad-ptx generate GPU code: give --target sm_90a or sm_80 (or --emit clif for the CPU)",
                    ))
                }
                (EmitArg::Clif, None) => Target::Cpu,
                (EmitArg::Clif, Some(t)) if t.is_gpu() => {
                    return Err(Error::user(
                        "error: --emit clif generates CPU code: give --target cpu (or --emit ptx for a GPU target)",
                    ))
                }
                (_, t) => t.unwrap_or(Target::Cpu),
            };
            let mut opts = pipeline::pass_options(&a.prune.options(), target, a.print_after_all)?;
            if let Some(shape) = &a.shape {
                opts.dims = parse_shape(shape)?;
            }
            opts.gradient = matches!(a.emit, EmitArg::Grad | EmitArg::GradPtx);
            let (opt, report) = pipeline::optimize(&c.graph, &opts)?;
            if a.print_after_all {
                for (pass, ir) in &report.dumps {
                    eprintln!("// ----- IR after {pass} -----\n{ir}");
                }
            }
            if a.explain {
                let text = String::from_utf8_lossy(&src.bytes).into_owned();
                for e in &report.explanations {
                    eprintln!("{}", explain_line(&src.name, &text, e));
                }
                if report.explanations.is_empty() {
                    eprintln!("note: nothing to explain");
                }
            }
            let dims = pipeline::codegen_dims(a.shape.as_deref().map(parse_shape).transpose()?);
            match a.emit {
                EmitArg::Opt if a.dot => to_dot(&opt),
                EmitArg::Opt => print_graph(&opt),
                EmitArg::Grad => super::grad::emit_text(&foxc_driver::grad::grad_program(&opt, target)?),
                EmitArg::Clif => cpu_backend::emit_clif(&opt, &dims)?,
                EmitArg::Llvm => cuda_backend::emit(&opt, &[], &dims, target, cuda_backend::Emit::Llvm)?,
                EmitArg::Ptx => cuda_backend::emit(&opt, &[], &dims, target, cuda_backend::Emit::Ptx)?,
                EmitArg::GradPtx => {
                    let program = foxc_driver::grad::grad_program(&opt, target)?;
                    let outputs: Vec<_> = program.outputs.iter().map(|(_, v)| *v).collect();
                    cuda_backend::emit(&program.graph, &outputs, &dims, target, cuda_backend::Emit::Ptx)?
                }
                EmitArg::Ast | EmitArg::Ir => unreachable!("handled above"),
            }
        }
    };
    match &a.o {
        Some(path) => foxc_runtime::io::write_atomic(path, text.as_bytes())
            .map_err(|e| Error::user(format!("error: {e}")))?,
        None => {
            // A closed pipe (`foxc compile ... | head`) is not an error worth a panic.
            use std::io::Write;
            match std::io::stdout().lock().write_all(text.as_bytes()) {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                    return Err(Error::internal(format!("error: writing to stdout: {e}")))
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// One `--explain` entry, positioned like a diagnostic.
fn explain_line(file: &str, text: &str, e: &foxc_passes::Explanation) -> String {
    let start = (e.span.start as usize).min(text.len());
    let line_no = text[..start].matches('\n').count() + 1;
    let line_start = text[..start].rfind('\n').map_or(0, |p| p + 1);
    let col = text[line_start..start].chars().count() + 1;
    let line = text[line_start..].lines().next().unwrap_or("");
    let width = (e.span.end.saturating_sub(e.span.start) as usize)
        .clamp(1, line.len().saturating_sub(col - 1).max(1));
    let mut s = format!(
        "note: {}\n  --> {file}:{line_no}:{col}\n   |\n   | {line}\n   | {}{}",
        e.message,
        " ".repeat(col - 1),
        "^".repeat(width)
    );
    if let Some(h) = &e.hint {
        s.push_str(&format!("\n   = hint: {h}"));
    }
    s
}
