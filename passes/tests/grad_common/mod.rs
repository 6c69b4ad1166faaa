//! Helpers of the gradient tests: f64-friendly graphs, fresh inputs, the loss `sum(out * dout)`.
#![allow(dead_code)]

use foxc_ir::check::infer;
use foxc_ir::interp::{self, Tensor};
use foxc_ir::{DType, Graph, Op, ValueType};
use foxc_passes::grad::{GradProgram, DOUT};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};
use std::collections::BTreeMap;

pub fn root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every example program (file stem, source graph).
pub fn examples() -> Vec<(String, Graph)> {
    let mut files: Vec<_> = std::fs::read_dir(root().join("examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "attn"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            let g =
                foxc_ir::frontend::compile(&name, &bytes).unwrap_or_else(|_| panic!("{name} compiles")).graph;
            (name, g)
        })
        .collect()
}

/// The graph computed in f64 without rounding steps: float parameters become f32, every cast
/// is removed and attention outputs are f32. (A rounding step has no derivative that finite
/// differences could see; the gradient pass treats casts as straight-through.)
pub fn smooth(g: &Graph) -> Graph {
    let mut g = g.clone();
    for i in 0..g.params.len() {
        if g.params[i].ty.dtype.is_float() {
            g.params[i].ty.dtype = DType::F32;
            let n = g.params[i].node;
            g.node_mut(n).ty.dtype = DType::F32;
        }
    }
    for c in g.find(|op| matches!(op, Op::Cast)) {
        let src = g.operand_values(c)[0];
        assert_eq!(src.result, 0, "a cast of a result > 0");
        g.replace_all_uses(c, src.node);
        g.g.remove_node(c);
    }
    for n in g.topo_order() {
        if let Op::Attention(a) = &mut g.node_mut(n).op {
            a.out_dtype = DType::F32;
        }
        let tys: Vec<ValueType> = g.operand_values(n).iter().map(|&v| g.value_ty(v).clone()).collect();
        let refs: Vec<&ValueType> = tys.iter().collect();
        let op = g.op(n).clone();
        if let Op::Attention(a) = &op {
            let rt = a.result_types(&refs).unwrap();
            g.node_mut(n).ty = rt[0].clone();
            g.node_mut(n).more = rt[1..].to_vec();
        } else if let Some(t) = infer(&op, &refs).unwrap() {
            g.node_mut(n).ty = t;
        }
    }
    foxc_ir::verify::verify(&g).unwrap_or_else(|e| panic!("smooth {}: {e}", g.name));
    g
}

/// `t` summed along `axis` (a running sum: non-increasing where every element is <= 0).
fn cumsum_along(mut t: Tensor, axis: usize) -> Tensor {
    let (len, stride) = (t.shape[axis], t.shape[axis + 1..].iter().product::<usize>());
    for l in 0..t.data.len() {
        if (l / stride) % len > 0 {
            t.data[l] += t.data[l - stride];
        }
    }
    t
}

/// Fresh inputs for every parameter of `g` plus `dout` shaped like the output. `decay` moves
/// the gate logits / log-gates / slopes towards fast forgetting (so that ACP prunes).
pub fn inputs(g: &Graph, dims: &BTreeMap<&str, usize>, seed: u64, decay: f64) -> BTreeMap<String, Tensor> {
    let mut rng = StdRng::seed_from_u64(seed);
    let normal = Normal::new(0.0, 1.0).unwrap();
    let shape_of = |t: &ValueType| -> Vec<usize> {
        t.dims()
            .map(|d| d.eval(&|s: &str| dims.get(s).map(|&x| x as u64)).expect("bound dim") as usize)
            .collect()
    };
    let mut out = BTreeMap::new();
    for p in &g.params {
        let shape = shape_of(&p.ty);
        let t = Tensor::from_fn(&shape, |_| match p.name.as_str() {
            "fgate" | "g" => 1.0 - 3.0 * decay + normal.sample(&mut rng),
            "logf" => -rng.random_range(0.05..0.5f64) * (1.0 + 4.0 * decay),
            "slope" | "m" => rng.random_range(0.1..0.6f64) * (1.0 + 4.0 * decay),
            "wq" | "wk" => 1.0 + 0.3 * normal.sample(&mut rng),
            "kb" => -rng.random_range(0.0..4.0f64),
            // A decay cumsum given as a parameter: its log gates here, summed below.
            _ if p.nonincreasing.is_some() => -rng.random_range(0.05..0.5f64) * (1.0 + 4.0 * decay),
            _ => normal.sample(&mut rng),
        });
        let t = match p.nonincreasing {
            Some(axis) => cumsum_along(t, axis),
            None => t,
        };
        out.insert(p.name.clone(), t);
    }
    let out_ty = g.ty(g.output.unwrap()).clone();
    let shape = shape_of(&out_ty);
    out.insert(DOUT.to_string(), Tensor::from_fn(&shape, |_| normal.sample(&mut rng)));
    out
}

/// `sum(out * dout)` of the forward graph.
pub fn loss(g: &Graph, inputs: &BTreeMap<String, Tensor>) -> f64 {
    let mut ins = inputs.clone();
    let dout = ins.remove(DOUT).unwrap();
    let r = interp::run(g, &ins).unwrap_or_else(|e| panic!("{}: {e}", g.name));
    r.output.data.iter().zip(&dout.data).map(|(a, b)| a * b).sum()
}

/// Every output of the gradient program, by name.
pub fn grads(p: &GradProgram, inputs: &BTreeMap<String, Tensor>) -> BTreeMap<String, Tensor> {
    // By value: a gradient may be a later result of a node (the backward's dk, not its dq).
    let targets: Vec<_> = p.outputs.iter().map(|(_, v)| *v).collect();
    let vals =
        interp::eval_values(&p.graph, inputs, &targets).unwrap_or_else(|e| panic!("{}: {e}", p.graph.name));
    p.outputs.iter().map(|(n, v)| (n.clone(), vals[v].clone())).collect()
}
