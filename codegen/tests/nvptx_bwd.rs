//! NVPTX `attention_backward`: the launch plan (pre, dq, dkv after the forward), refusals, the
//! PTX of every class assembling with ptxas (when found) for sm_90a and sm_80, and a snapshot
//! of the dq kernel's entry and parameter list.

use foxc_codegen::nvptx::ptxas;
use foxc_codegen::nvptx::{compile, KernelArg, Launch, NvptxSpec, NvptxTarget};
use foxc_ir::{Attention, DType, Dim, Graph, Mask, Op, Prune, Scale, Span, Tiles, Value, ValueId, ValueType};
use std::collections::BTreeMap;

/// What varies between the graphs of the tests.
#[derive(Clone, Copy)]
struct Case {
    mask: Mask2,
    decay: bool,
    pruned: bool,
    /// Query heads per kv head (H = 4).
    group: u64,
    bm: u32,
}

#[derive(Clone, Copy)]
enum Mask2 {
    Causal,
    Window(u64),
    None,
}

const FOX: Case = Case { mask: Mask2::Causal, decay: true, pruned: true, group: 1, bm: 64 };

fn dims(h: &str) -> Vec<Dim> {
    vec![Dim::sym("B"), Dim::sym(h), Dim::sym("T"), Dim::sym("D")]
}

/// Forward attention and its backward over parameters (q, k, v, [c], [delta], dout); outputs
/// every result of the backward.
fn graph(c: Case) -> (Graph, Vec<Value>) {
    let s = Span::default();
    let mut g = Graph::new("bwd");
    let hk = if c.group == 1 { "H" } else { "Hk" };
    let bf = |d| ValueType::tensor(DType::BF16, d);
    let q = g.add_param("q", bf(dims("H")), s);
    let k = g.add_param("k", bf(dims(hk)), s);
    let v = g.add_param("v", bf(dims(hk)), s);
    let bht = vec![Dim::sym("B"), Dim::sym("H"), Dim::sym("T")];
    let mut ops = vec![q, k, v];
    if c.decay {
        ops.push(g.add_param("c", ValueType::tensor(DType::F32, bht.clone()), s));
    }
    let mask = match c.mask {
        Mask2::Causal => Mask::Causal,
        Mask2::Window(w) => Mask::Window(w),
        Mask2::None => Mask::None,
    };
    let mut a = Attention::new(Scale::inv_sqrt(1.0, Dim::sym("D")), mask, c.decay);
    a.tiles = Some(Tiles { bm: c.bm, bn: 64 });
    if c.group != 1 {
        a.kv_group = Dim::Const(c.group);
    }
    if c.pruned {
        a.prune = Prune::Boundary;
        let tiles = vec![Dim::sym("B"), Dim::sym("H"), Dim::Tiles(Box::new(Dim::sym("T")), c.bm)];
        ops.push(g.add_param("delta", ValueType::tensor(DType::F32, tiles), s));
    }
    let dout = g.add_param("dout", bf(dims("H")), s);
    let tys: Vec<ValueType> = ops.iter().map(|&o| g.ty(o).clone()).collect();
    let refs: Vec<&ValueType> = tys.iter().collect();
    let rt = a.result_types(&refs).unwrap();
    let vals: Vec<Value> = ops.iter().map(|&o| Value::of(o)).collect();
    let fwd = g.add_multi(Op::Attention(a.clone()), rt.clone(), &vals, s);
    let mut bops = vals.clone();
    bops.extend([Value::of(fwd), Value { node: fwd, result: 1 }, Value::of(dout)]);
    let mut btys: Vec<ValueType> = tys.clone();
    btys.extend([rt[0].clone(), rt[1].clone(), g.ty(dout).clone()]);
    let brefs: Vec<&ValueType> = btys.iter().collect();
    let brt = a.backward_result_types(&brefs).unwrap();
    let nres = brt.len() as u32;
    let bwd = g.add_multi(Op::AttentionBackward(a), brt, &bops, s);
    g.output = Some(fwd);
    (g, (0..nres).map(|r| Value { node: bwd, result: r }).collect())
}

fn spec(t: NvptxTarget, d: u64, outputs: Vec<Value>) -> NvptxSpec {
    let mut s = NvptxSpec::new(t, BTreeMap::from([("D".to_string(), d), ("H".into(), 4), ("Hk".into(), 1)]));
    s.outputs = outputs;
    s
}

fn node_of(g: &Graph, want: fn(&Op) -> bool) -> ValueId {
    g.topo_order().into_iter().find(|&n| want(g.op(n))).unwrap()
}

#[test]
fn plan_runs_pre_dq_dkv_after_the_forward() {
    let (g, outs) = graph(FOX);
    let a = compile(&g, &spec(NvptxTarget::Sm90a, 128, outs.clone())).expect("compiles");
    let bwd = node_of(&g, |op| matches!(op, Op::AttentionBackward(_)));
    let names: Vec<&str> = a.kernels.iter().map(|k| k.name.as_str()).collect();
    let kinds: Vec<&str> = names
        .iter()
        .map(|n| {
            ["attn_fwd", "bwd_pre", "bwd_dq", "bwd_dkv"].into_iter().find(|k| n.contains(k)).unwrap_or(n)
        })
        .collect();
    assert_eq!(kinds, ["attn_fwd", "bwd_pre", "bwd_dq", "bwd_dkv"], "{names:?}");
    assert!(a.kernels[1..].iter().all(|k| k.node == bwd));
    // dq writes result 0 and dc (result 3); dkv writes dk, dv and reads-modifies dc.
    let buf = |r: u32| a.outputs[r as usize];
    let args = |i: usize| -> Vec<usize> {
        a.kernels[i]
            .args
            .iter()
            .filter_map(|x| if let KernelArg::Buffer(b) = x { Some(*b) } else { None })
            .collect()
    };
    assert_eq!(args(2)[8..10], [buf(0), buf(3)]);
    assert_eq!(args(3)[8..11], [buf(1), buf(2), buf(3)]);
    // The start scratch is written by dq (arg 10) and read by dkv (arg 7).
    assert_eq!(args(2)[10], args(3)[7]);
    let bind = |s: &str| match s {
        "B" => Some(2),
        "H" => Some(4),
        "T" => Some(1000),
        "D" => Some(128),
        _ => None,
    };
    let dq = a.kernels[2].geometry(&bind).unwrap();
    assert_eq!((dq.grid, dq.block.0), ((16, 8, 1), 128));
    let dkv = a.kernels[3].geometry(&bind).unwrap();
    assert_eq!((dkv.grid, dkv.block.0), ((16, 8, 1), 128));
    assert!(dq.shared_bytes > 48 * 1024 && dkv.shared_bytes > 48 * 1024);
    assert!(matches!(a.kernels[2].launch, Launch::GridShared { .. }));
}

#[test]
fn refusals_are_user_facing() {
    // No mask runs now (every tile visited: the `_bidir` kernels).
    let (g, outs) = graph(Case { mask: Mask2::None, pruned: false, ..FOX });
    let a = compile(&g, &spec(NvptxTarget::Sm90a, 64, outs)).expect("no mask compiles");
    assert!(a.kernels.iter().any(|k| k.name.starts_with("foxc_attn_bwd_dkv") && k.name.contains("_bidir")));
    let (g, outs) = graph(FOX);
    let e = compile(&g, &spec(NvptxTarget::Sm90a, 512, outs)).unwrap_err();
    assert!(e.to_string().contains("head_dim"), "{e}");
}

/// D = 256 compiles on both targets; dq and dkv launch a block per (tile, head, half of D):
/// grid y twice the heads (D = 128: `plan_runs_pre_dq_dkv_after_the_forward`, 8).
#[test]
fn head_dim_256_launches_two_halves() {
    for t in [NvptxTarget::Sm90a, NvptxTarget::Sm80] {
        let (g, outs) = graph(FOX);
        let a = compile(&g, &spec(t, 256, outs)).expect("D = 256 compiles");
        let bind = |s: &str| match s {
            "B" => Some(2),
            "H" => Some(4),
            "T" => Some(1000),
            "D" => Some(256),
            _ => None,
        };
        let dq = a.kernels[2].geometry(&bind).unwrap();
        let dkv = a.kernels[3].geometry(&bind).unwrap();
        assert!(a.kernels[2].name.contains("bwd_dq_d256") && a.kernels[3].name.contains("bwd_dkv_d256"));
        assert_eq!((dq.grid, dkv.grid), ((16, 16, 1), (16, 16, 1)), "{t:?}");
        let max = if t == NvptxTarget::Sm80 { 166_912 } else { 232_448 };
        assert!(dq.shared_bytes <= max && dkv.shared_bytes <= max, "{t:?}");
    }
}

/// sm_90a and sm_80, D = 64 and 128; causal, window and (causal without decay) dense; pruned;
/// GQA (4 query heads per kv head, bm = 128).
#[test]
fn every_backward_class_assembles_with_ptxas() {
    let Some(ptxas) = ptxas::find() else {
        eprintln!("note: ptxas not found (set $PTXAS); skipping the PTX assembly check");
        return;
    };
    let cases = [
        FOX,
        Case { pruned: false, ..FOX },
        Case { mask: Mask2::Window(300), pruned: false, ..FOX },
        Case { decay: false, pruned: false, ..FOX },
        Case { group: 4, bm: 128, ..FOX },
    ];
    for (ci, c) in cases.iter().enumerate() {
        for t in [NvptxTarget::Sm90a, NvptxTarget::Sm80] {
            for d in [64, 128] {
                let (g, outs) = graph(*c);
                let a = compile(&g, &spec(t, d, outs)).expect("compiles");
                ptxas::assemble(&ptxas, &a.ptx, t.cpu())
                    .unwrap_or_else(|log| panic!("ptxas failed on c{ci}_{}_d{d}:\n{log}", t.cpu()));
            }
        }
    }
}

/// The dq kernel's entry and parameters in the PTX (what the launch plan's arguments bind to).
#[test]
fn dq_kernel_entry_snapshot() {
    let (g, outs) = graph(FOX);
    let a = compile(&g, &spec(NvptxTarget::Sm90a, 64, outs)).expect("compiles");
    let start = a.ptx.find(".entry foxc_attn_bwd_dq").expect("dq entry");
    let head: String =
        a.ptx[start..].lines().take_while(|l| !l.starts_with('{')).collect::<Vec<_>>().join("\n");
    insta::assert_snapshot!("nvptx_bwd_dq_entry_sm90a_d64", head);
}
