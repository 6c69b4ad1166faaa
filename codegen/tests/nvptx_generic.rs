//! The generic NVPTX loops (plain kernels for non-fused ops) on unoptimized programs: every op
//! kind lowers to one kernel per node with runtime sizes, the PTX assembles with ptxas for
//! sm_90a and sm_80, and the LLVM IR of a small program is snapshotted. (Their results against
//! the interpreter are checked on a GPU by the root crate's `tests/cuda_generic.rs`.)

use foxc_codegen::nvptx::ptxas;
use foxc_codegen::nvptx::{compile, CodegenError, KernelArg, Launch, NvptxArtifact, NvptxSpec, NvptxTarget};
use foxc_ir::{Graph, Op, Value};
use std::collections::BTreeMap;

fn program(src: &str) -> Graph {
    foxc_ir::frontend::compile("t.attn", src.as_bytes()).unwrap_or_else(|e| panic!("{e:?}")).graph
}

fn spec(t: NvptxTarget) -> NvptxSpec {
    NvptxSpec::new(t, BTreeMap::new())
}

/// The programs of `tests/generic/` (one per corner of the generic kernels, each with a
/// `# shape:` line for the GPU run of `tests/cuda_generic.rs`): name and source.
fn programs() -> Vec<(String, String)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/generic");
    let mut out: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "attn"))
        .map(|p| {
            (p.file_stem().unwrap().to_string_lossy().into_owned(), std::fs::read_to_string(&p).unwrap())
        })
        .collect();
    out.sort();
    assert!(out.len() >= 8, "expected the generic corner programs in {}", dir.display());
    out
}

fn source(name: &str) -> String {
    programs().into_iter().find(|(n, _)| n == name).unwrap().1
}

fn compiled(src: &str, t: NvptxTarget) -> (Graph, NvptxArtifact) {
    let g = program(src);
    let a = compile(&g, &spec(t)).unwrap_or_else(|e| panic!("{e}\n{src}"));
    (g, a)
}

/// Every program lowers to one generic kernel per computed node, each named after its op, with
/// sizes that are products of the program's dims (nothing specialized).
#[test]
fn every_corner_lowers_with_runtime_sizes() {
    for (name, src) in programs() {
        let (g, a) = compiled(&src, NvptxTarget::Sm90a);
        assert!(!a.kernels.is_empty(), "{name}");
        for k in &a.kernels {
            // A product with a compile-time scalar is the scaled-copy kernel; a cumsum along the
            // last axis of a buffer, the gate scan's two launches.
            let op = g.op(k.node).mnemonic();
            let n = k.node.index();
            let special = [
                format!("_scale_n{n}"),
                format!("_gate_segment_sums_n{n}"),
                format!("_gate_scan_segments_n{n}"),
            ];
            let ok = special.iter().any(|x| k.name.ends_with(x)) || k.name.ends_with(&format!("_{op}_n{n}"));
            assert!(ok, "{name}: {}", k.name);
            assert!(a.ptx.contains(&format!(".entry {}", k.name)), "{name}: PTX lacks {}", k.name);
            assert!(matches!(k.launch, Launch::Grid { .. }), "{name}");
            // Sizes are kernel arguments: some argument is a product of symbolic dims.
            let runtime = |a: &KernelArg| matches!(a, KernelArg::I64(d) | KernelArg::I32(d) if d.iter().any(|d| !d.symbols().is_empty()));
            assert!(g.ty(k.node).rank() == 0 || k.args.iter().any(runtime), "{name}: {:?}", k.args);
        }
        assert_eq!(a.outputs.len(), 1);
    }
}

/// The sizes are runtime values: binding other dims changes launch grids, not the PTX.
#[test]
fn sizes_are_runtime_arguments() {
    // The launch of the (last) kernel of the (only) cumsum of `name` with the dims bound by
    // `bind`.
    let grid = |name: &str, bind: &[(&str, u64)]| {
        let (g, a) = compiled(&source(name), NvptxTarget::Sm90a);
        let k = a.kernels.iter().rfind(|k| matches!(g.op(k.node), Op::Cumsum { .. })).unwrap();
        let bind: BTreeMap<String, u64> = bind.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        (k.geometry(&|s: &str| bind.get(s).copied()).unwrap().grid, k.geometry(&|_| None).is_err())
    };
    // Along the innermost axis t of [B, H, T]: the gate scan, a block per segment of 8192 and
    // (b, h) line.
    assert_eq!(grid("fox_alibi_gate", &[("B", 2), ("H", 3), ("T", 100)]), ((1, 6, 1), true));
    assert_eq!(grid("fox_alibi_gate", &[("B", 5), ("H", 16), ("T", 9000)]), ((2, 80, 1), true));
    // Along the outer axis t of [T, N]: one thread per line (n), 128 lines per block.
    assert_eq!(grid("cumsum_outer", &[("T", 1000), ("N", 8)]), ((1, 1, 1), true));
    assert_eq!(grid("cumsum_outer", &[("T", 3), ("N", 300)]), ((3, 1, 1), true));
}

/// Several outputs: each named value gets its buffer, listed in order; an attention's lse is
/// its own result buffer.
#[test]
fn outputs_name_their_buffers() {
    let src = "attention c(x: f32[T, N]) -> f32[T, N] {\n  y[t, n] = x[t, n] * 2\n  c[t, n] = cumsum(t, y[t, n])\n  return c\n}";
    let g = program(src);
    let out = g.find(|o| matches!(o, Op::Cumsum { .. }))[0];
    let y = g.operands(out)[0];
    let mut s = spec(NvptxTarget::Sm80);
    s.outputs = vec![Value::of(y), Value::of(out)];
    let a = compile(&g, &s).unwrap();
    assert_eq!(a.outputs.len(), 2);
    assert_ne!(a.outputs[0], a.outputs[1]);
    assert_eq!(a.buffers[a.outputs[0]].kind, foxc_codegen::nvptx::BufferKind::Value(Value::of(y)));
    // Only what the outputs need: asking for `y` alone drops the cumsum.
    s.outputs = vec![Value::of(y)];
    let a = compile(&g, &s).unwrap();
    assert!(a.kernels.iter().all(|k| !matches!(g.op(k.node), Op::Cumsum { .. })));
    // A value the graph lacks is a user error, before any kernel is built.
    s.outputs = vec![Value { node: out, result: 3 }];
    assert!(matches!(compile(&g, &s), Err(CodegenError::User(_))));
}

/// What the generic loops do not run is named before any launch: an attention the passes did
/// not fuse runs as written (softmax and all), a contraction is materialized.
#[test]
fn unfused_attention_runs_as_loops() {
    let src = "attention p(x: f32[T, T], v: f32[T, D]) -> f32[T, D] {\n  p[i, j] = softmax(j, causal(i, j, x[i, j]))\n  o[i, d] = sum(j, p[i, j] * v[j, d])\n  return o\n}";
    let (g, a) = compiled(src, NvptxTarget::Sm90a);
    let ops: Vec<&str> = a.kernels.iter().map(|k| g.op(k.node).mnemonic()).collect();
    for op in ["softmax", "causal", "mul", "sum"] {
        assert!(ops.contains(&op), "{op} missing from {ops:?}");
    }
}

/// A `sum {contract}` (the `contract` pass marks sums for the CPU target only) is translated as
/// the IR says here too: the sum's loop reads the product's operands, the product has no kernel,
/// and the PTX assembles. Unmarked, the product is a kernel of its own.
#[test]
fn a_contracting_sum_reads_its_product_through() {
    let src = "attention o(p: f32[T, T], v: f32[T, D]) -> f32[T, D] {\n  o[i, d] = sum(j, p[i, j] * v[j, d])\n  return o\n}";
    let mut g = program(src);
    let ops = |g: &Graph, t: NvptxTarget| {
        let a = compile(g, &spec(t)).unwrap();
        (a.kernels.iter().map(|k| g.op(k.node).mnemonic()).collect::<Vec<_>>().join(" "), a.ptx)
    };
    assert_eq!(ops(&g, NvptxTarget::Sm90a).0, "bind bind mul sum store");
    foxc_passes::contract::mark(&mut g, &[]);
    assert_eq!(ops(&g, NvptxTarget::Sm90a).0, "bind bind sum store");
    let Some(ptxas) = ptxas::find() else { return };
    for t in [NvptxTarget::Sm90a, NvptxTarget::Sm80] {
        ptxas::assemble(&ptxas, &ops(&g, t).1, t.cpu()).unwrap_or_else(|log| panic!("{}: {log}", t.cpu()));
    }
}

/// The LLVM IR of a small program: a bound gate, its log-sigmoid minus a per-head slope
/// (broadcast over b and t), stored and scanned along t.
#[test]
fn generic_llvm_ir_snapshot() {
    let (_, a) = compiled(&source("fox_alibi_gate"), NvptxTarget::Sm90a);
    insta::assert_snapshot!("nvptx_generic_fox_alibi_gate", kernels_ir(&a.llvm_ir));
}

/// The kernel definitions of a module, attribute-group numbers dropped.
fn kernels_ir(ir: &str) -> String {
    let mut out = String::new();
    let mut keep = false;
    for line in ir.lines() {
        if line.starts_with("define ") {
            keep = true;
        }
        if keep {
            let line = match line.find(" #") {
                Some(p) if line.starts_with("define ") => &line[..p],
                _ => line,
            };
            out.push_str(line);
            out.push('\n');
        }
        if line == "}" {
            keep = false;
        }
    }
    out
}

#[test]
fn every_generic_kernel_assembles_with_ptxas() {
    let Some(ptxas) = ptxas::find() else {
        eprintln!("note: ptxas not found (set $PTXAS); skipping the PTX assembly check");
        return;
    };
    for (name, src) in programs() {
        for t in [NvptxTarget::Sm90a, NvptxTarget::Sm80] {
            let (_, a) = compiled(&src, t);
            ptxas::assemble(&ptxas, &a.ptx, t.cpu())
                .unwrap_or_else(|log| panic!("ptxas failed on {name}_{}:\n{log}", t.cpu()));
        }
    }
}
