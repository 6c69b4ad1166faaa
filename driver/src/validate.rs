//! Checking user-supplied input tensors against a graph's signature before anything runs.
//!
//! Every failure is a user error whose message names the tensor (and the index or axis):
//! missing and unexpected tensors, dtype mismatches, shape mismatches, NaN, infinities (allowed
//! only where the declared range includes them, e.g. `log f = -inf` for a hard reset in a
//! parameter declared `in [-inf, 0]`), values outside a declared range, and dims that break an
//! exact division a subscript needs (`h / (H / G)` with G not dividing H).

use foxc_ir::index::IndexExpr;
use foxc_ir::shapes::{bind_dims, DimBindings, ShapeError};
use foxc_ir::{Graph, Op, RNode, ValueId};
use foxc_runtime::TensorMap;
use std::borrow::Cow;

#[derive(Debug, PartialEq, thiserror::Error)]
pub enum InputError {
    #[error("missing input tensor{} {}: graph `{graph}` takes {expected}", plural(.missing), names(.missing))]
    Missing { missing: Vec<String>, graph: String, expected: String },
    #[error("unexpected input tensor{} {}: graph `{graph}` takes {expected}", plural(.extra), names(.extra))]
    Extra { extra: Vec<String>, graph: String, expected: String },
    #[error("input tensor `{tensor}` has dtype {got}, but the graph declares {declared}")]
    Dtype { tensor: String, declared: String, got: String },
    #[error(transparent)]
    Shape(#[from] ShapeError),
    #[error("input tensor `{tensor}` has shape {shape:?} but {got} data bytes (expected {expected})")]
    Data { tensor: String, shape: Vec<usize>, expected: usize, got: usize },
    #[error("input tensor `{tensor}` holds {value} at index {index:?}{}", allowed(.range))]
    NonFinite { tensor: String, index: Vec<usize>, value: f64, range: Option<(f64, f64)> },
    #[error(
        "input tensor `{tensor}` holds {value} at index {index:?}, outside its declared range [{lo}, {hi}]"
    )]
    OutOfRange { tensor: String, index: Vec<usize>, value: f64, lo: f64, hi: f64 },
    #[error(
        "input tensor `{tensor}` is declared nonincreasing along {dim}, but holds {value} at index {index:?} after {before} at the index before"
    )]
    Increasing { tensor: String, dim: String, index: Vec<usize>, value: f64, before: f64 },
    #[error("{num} = {num_value} is not divisible by {den} = {den_value} (needed by `{subscript}` in {tensor}'s subscript)")]
    Indivisible {
        num: String,
        num_value: u64,
        den: String,
        den_value: u64,
        subscript: String,
        tensor: String,
    },
    #[error(
        "the fused attention puts its {queries} = {tq} queries at the end of its {keys} = {tk} keys: it needs at most as many queries as keys"
    )]
    QueriesAfterKeys { queries: String, tq: u64, keys: String, tk: u64 },
    /// A rule of per-head thresholds given for another number of query heads.
    #[error("{0}")]
    GivenHeads(String),
    #[error(
        "subscript `{subscript}` of `{tensor}` takes values {lo}..={hi} at these sizes ({dims}), outside axis {axis} of size {size}"
    )]
    SubscriptOutOfRange {
        subscript: String,
        tensor: String,
        axis: usize,
        lo: i64,
        hi: i64,
        size: u64,
        dims: String,
    },
}

fn plural(v: &[String]) -> &'static str {
    if v.len() == 1 {
        ""
    } else {
        "s"
    }
}

fn names(v: &[String]) -> String {
    v.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
}

fn allowed(range: &Option<(f64, f64)>) -> String {
    match range {
        Some((lo, hi)) => format!(" (declared range [{lo}, {hi}])"),
        None => " (inputs must be finite; declare a range such as `in [-inf, 0]` to allow infinities)".into(),
    }
}

fn unravel(mut l: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for (i, &n) in shape.iter().enumerate().rev() {
        if n > 0 {
            idx[i] = l % n;
            l /= n;
        }
    }
    idx
}

/// Check `inputs` against the parameters of `g`; on success, the bound dimensions.
/// A parameter's type as the source declares it (an `i64` parameter's storage, not its i32
/// value type).
fn declared(p: &foxc_ir::Param) -> String {
    foxc_ir::ValueType { dtype: p.stored(), ..p.ty.clone() }.to_string()
}

/// The inputs as the graph reads them: each `i64` parameter narrowed to its i32 value type
/// (saturating, `Param::stored`); borrowed when the graph has none.
pub fn as_read<'a>(g: &Graph, inputs: &'a TensorMap) -> Cow<'a, TensorMap> {
    let narrowed: Vec<&str> =
        g.params.iter().filter(|p| p.storage.is_some()).map(|p| p.name.as_str()).collect();
    if narrowed.is_empty() {
        return Cow::Borrowed(inputs);
    }
    let mut m = inputs.clone();
    for name in narrowed {
        if let Some(t) = m.get_mut(name) {
            *t = t.narrowed_to_i32();
        }
    }
    Cow::Owned(m)
}

pub fn check_inputs(g: &Graph, inputs: &TensorMap) -> Result<DimBindings, InputError> {
    let expected =
        g.params.iter().map(|p| format!("{}: {}", p.name, declared(p))).collect::<Vec<_>>().join(", ");
    let missing: Vec<String> =
        g.params.iter().filter(|p| !inputs.contains_key(&p.name)).map(|p| p.name.clone()).collect();
    if !missing.is_empty() {
        return Err(InputError::Missing { missing, graph: g.name.clone(), expected });
    }
    let extra: Vec<String> = inputs.keys().filter(|k| g.param(k).is_none()).cloned().collect();
    if !extra.is_empty() {
        return Err(InputError::Extra { extra, graph: g.name.clone(), expected });
    }
    for p in &g.params {
        let t = &inputs[&p.name];
        if t.dtype != p.stored() {
            return Err(InputError::Dtype {
                tensor: p.name.clone(),
                declared: declared(p),
                got: t.dtype.to_string(),
            });
        }
    }
    let shapes: Vec<(String, Vec<usize>)> =
        g.params.iter().map(|p| (p.name.clone(), inputs[&p.name].shape.clone())).collect();
    let dims = bind_dims(g, &shapes)?;
    check_divisions(g, &dims)?;
    check_subscripts(g, &dims)?;
    check_query_positions(g, &dims)?;
    check_given_heads(g, &dims)?;
    for p in &g.params {
        let t = &inputs[&p.name];
        let expected = t.numel() * t.dtype.size_bytes();
        if t.data.len() != expected {
            return Err(InputError::Data {
                tensor: p.name.clone(),
                shape: t.shape.clone(),
                expected,
                got: t.data.len(),
            });
        }
        if !t.dtype.is_float() && p.range.is_none() {
            continue;
        }
        // The declared bounds as the tensor's dtype holds them: `in [0, 0.05]` admits the f32
        // nearest 0.05 (0.0500000007), as a user writing 0.05 in f32 means.
        // (Integer tensors compare with the bounds as written: truncating them would widen.)
        let rounded = |x: f64| if t.dtype.is_float() { foxc_ir::interp::cast(t.dtype, x) } else { x };
        let range = p.range.map(|(lo, hi)| (rounded(lo), rounded(hi)));
        let values = t.to_f64_vec();
        for (l, &v) in values.iter().enumerate() {
            let in_range = range.is_some_and(|(lo, hi)| v >= lo && v <= hi);
            if v.is_nan() || (v.is_infinite() && !in_range) {
                return Err(InputError::NonFinite {
                    tensor: p.name.clone(),
                    index: unravel(l, &t.shape),
                    value: v,
                    range: p.range,
                });
            }
            if let Some((lo, hi)) = p.range {
                if !in_range {
                    return Err(InputError::OutOfRange {
                        tensor: p.name.clone(),
                        index: unravel(l, &t.shape),
                        value: v,
                        lo,
                        hi,
                    });
                }
            }
        }
        if let Some(axis) = p.nonincreasing {
            check_nonincreasing(p, axis, &t.shape, &values)?;
        }
    }
    Ok(dims)
}

/// A parameter declared `nonincreasing along` axis `axis` must never grow along it.
fn check_nonincreasing(
    p: &foxc_ir::Param,
    axis: usize,
    shape: &[usize],
    v: &[f64],
) -> Result<(), InputError> {
    let len = shape[axis];
    let stride: usize = shape[axis + 1..].iter().product();
    for (l, &x) in v.iter().enumerate() {
        if !(l / stride).is_multiple_of(len) && x > v[l - stride] {
            return Err(InputError::Increasing {
                tensor: p.name.clone(),
                dim: p.ty.axes[axis].dim.to_string(),
                index: unravel(l, shape),
                value: x,
                before: v[l - stride],
            });
        }
    }
    Ok(())
}

/// The subscripts the front end could prove in range only for some sizes of the dims
/// (`Graph::bind_checks`, e.g. `c[b, h, i + M - N]` needs `M >= N`) must be in range at these.
fn check_subscripts(g: &Graph, dims: &DimBindings) -> Result<(), InputError> {
    let bind = |s: &str| dims.get(s);
    for c in &g.bind_checks {
        let Err(range) = c.holds(&bind) else { continue };
        let (lo, hi, size) = range.unwrap_or((i64::MIN, i64::MAX, c.size.eval(&bind).unwrap_or(0)));
        let mut named: Vec<String> = c.vars.iter().map(|(v, d)| format!("{v} < {d}")).collect();
        named.extend(dims.0.iter().map(|(k, v)| format!("{k} = {v}")));
        return Err(InputError::SubscriptOutOfRange {
            subscript: c.index.to_string(),
            tensor: c.tensor.clone(),
            axis: c.axis,
            lo,
            hi,
            size,
            dims: named.join(", "),
        });
    }
    Ok(())
}

/// `check_query_positions` and [`check_given_heads`] at the sizes of `inputs` (the reference
/// backend, which takes inputs as they are otherwise); sizes that do not bind are left to the
/// interpreter's own report.
pub fn check_positions_of(g: &Graph, inputs: &TensorMap) -> Result<(), InputError> {
    let shapes: Vec<(String, Vec<usize>)> =
        g.params.iter().filter_map(|p| Some((p.name.clone(), inputs.get(&p.name)?.shape.clone()))).collect();
    match bind_dims(g, &shapes) {
        Ok(dims) => check_query_positions(g, &dims).and_then(|()| check_given_heads(g, &dims)),
        Err(_) => Ok(()),
    }
}

/// A threshold of per-head thresholds given by the user (`--thresholds`) has one per query
/// head: the heads of its q (`H`) at these sizes. Every backend's kernel reads entry `h` of
/// the table for query head `h`, so another count is refused before anything runs.
pub fn check_given_heads(g: &Graph, dims: &DimBindings) -> Result<(), InputError> {
    let bind = |s: &str| dims.get(s);
    for n in g.topo_order() {
        let Op::Threshold { rule, .. } = g.op(n) else { continue };
        if !rule.reads_given() {
            continue;
        }
        let Some(heads) = g.ty(g.operands(n)[0]).dims().nth(1).cloned() else { continue };
        let Some(h) = heads.eval(&bind) else { continue };
        rule.check_heads(h as usize)
            .map_err(|e| InputError::GivenHeads(format!("{e} ({heads} = {h} from the inputs' shapes)")))?;
    }
    Ok(())
}

/// A fused attention with a decay or a causal mask puts query row i at key position
/// `i + Tk - Tq` (docs/SEMANTICS.md): `Tq <= Tk` at these sizes.
fn check_query_positions(g: &Graph, dims: &DimBindings) -> Result<(), InputError> {
    let bind = |s: &str| dims.get(s);
    for n in g.topo_order() {
        let (Op::Attention(a) | Op::AttentionBackward(a)) = g.op(n) else { continue };
        if !a.positions_queries() {
            continue;
        }
        let Ok(o) = foxc_ir::Attention::operands(g, n) else { continue };
        let rows = |v: ValueId| g.ty(v).dims().nth(2).cloned();
        let (Some(q), Some(k)) = (rows(o.q), rows(o.k)) else { continue };
        if let (Some(tq), Some(tk)) = (q.eval(&bind), k.eval(&bind)) {
            if tq > tk {
                return Err(InputError::QueriesAfterKeys {
                    queries: q.to_string(),
                    tq,
                    keys: k.to_string(),
                    tk,
                });
            }
        }
    }
    Ok(())
}

/// Every exact quotient of dims that a subscript divides by must divide under `dims`: those of
/// `gather` nodes, of captured tensors in a fused attention's score region, and its kv group.
fn check_divisions(g: &Graph, dims: &DimBindings) -> Result<(), InputError> {
    let bind = |s: &str| dims.get(s);
    let check = |e: &IndexExpr, tensor: &str| -> Result<(), InputError> {
        // The divisor, and the quotients among the dim terms (`d + D / 2`) and clamp bounds.
        let clamp_dims = e.clamps.iter().flat_map(|c| c.dim_terms.iter().map(|(d, _)| d));
        let mut quotients = e.div.iter().chain(e.dim_terms.iter().map(|(d, _)| d)).chain(clamp_dims);
        match quotients.find_map(|d| d.failed_division(&bind)) {
            Some((a, av, b, bv)) => Err(InputError::Indivisible {
                num: a.to_string(),
                num_value: av,
                den: b.to_string(),
                den_value: bv,
                subscript: e.to_string(),
                tensor: tensor.to_string(),
            }),
            None => Ok(()),
        }
    };
    let name = |v: ValueId| match g.op(v) {
        Op::Param { name, .. } => name.clone(),
        _ => g.node(v).name.clone().unwrap_or_else(|| "a tensor".into()),
    };
    for n in g.topo_order() {
        match g.op(n) {
            Op::Gather { index, .. } => {
                let src = name(g.operands(n)[0]);
                for e in index {
                    check(e, &src)?;
                }
            }
            Op::Attention(a) | Op::AttentionBackward(a) => {
                // The kv head of query head h is h / kv_group.
                let kv = IndexExpr { div: Some(a.kv_group.clone()), ..IndexExpr::var("h") };
                check(&kv, "k")?;
                for node in &a.score.nodes {
                    if let RNode::Capture { index, .. } = node {
                        for e in index {
                            check(e, "a captured tensor")?;
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use foxc_ir::{DType, Dim, Span, ValueType};
    use foxc_runtime::HostTensor;

    fn pos(dt: DType, dims: &[&str]) -> ValueType {
        ValueType::tensor(dt, dims.iter().map(|d| Dim::sym(d)))
    }

    fn graph() -> Graph {
        let sp = Span::default();
        let mut g = Graph::new("fox");
        for n in ["q", "k", "v"] {
            g.add_param(n, pos(DType::BF16, &["B", "H", "T", "D"]), sp);
        }
        g.add_param_in("logf", pos(DType::F32, &["B", "H", "T"]), (f64::NEG_INFINITY, 0.0), sp);
        g
    }

    fn good() -> TensorMap {
        let mut m = TensorMap::new();
        let n = 2 * 3 * 5 * 4;
        let vals: Vec<f32> = (0..n).map(|i| ((i * 7919) % 13) as f32 / 6.0 - 1.0).collect();
        for name in ["q", "k", "v"] {
            m.insert(name.into(), HostTensor::from_f32_as_bf16(&[2, 3, 5, 4], &vals));
        }
        let lf: Vec<f32> = (0..30).map(|i| -(i as f32) / 30.0).collect();
        m.insert("logf".into(), HostTensor::from_f32(&[2, 3, 5], &lf));
        m
    }

    fn err(m: &TensorMap) -> String {
        check_inputs(&graph(), m).unwrap_err().to_string()
    }

    #[test]
    fn good_inputs_bind_dims() {
        let d = check_inputs(&graph(), &good()).unwrap();
        assert_eq!(d.to_string(), "B=2,D=4,H=3,T=5");
        // -inf is a hard reset, allowed by the declared range
        let mut m = good();
        let mut lf = m["logf"].to_f32_vec();
        lf[4] = f32::NEG_INFINITY;
        m.insert("logf".into(), HostTensor::from_f32(&[2, 3, 5], &lf));
        assert!(check_inputs(&graph(), &m).is_ok());
    }

    #[test]
    fn missing_and_extra_are_named() {
        let mut m = good();
        m.remove("k");
        m.remove("v");
        let e = err(&m);
        assert!(e.starts_with("missing input tensors `k`, `v`"), "{e}");
        let mut m = good();
        m.insert("bias".into(), HostTensor::from_f32(&[1], &[0.0]));
        let e = err(&m);
        assert!(e.starts_with("unexpected input tensor `bias`") && e.contains("q: bf16[B, H, T, D]"), "{e}");
    }

    #[test]
    fn dtype_mismatch_is_named() {
        let mut m = good();
        let v = m["v"].to_f32_vec();
        m.insert("v".into(), HostTensor::from_f32(&[2, 3, 5, 4], &v));
        let e = err(&m);
        assert!(e.contains("`v` has dtype f32, but the graph declares bf16[B, H, T, D]"), "{e}");
    }

    #[test]
    fn shape_mismatch_names_tensor_and_dims() {
        let mut m = good();
        let v = m["k"].to_f32_vec();
        m.insert("k".into(), HostTensor::from_f32_as_bf16(&[2, 3, 4, 5], &v));
        let e = err(&m);
        assert!(e.contains("`k` axis 2 (T) has size 4") && e.contains("T = 5") && e.contains("`q`"), "{e}");
        let mut m = good();
        m.insert("logf".into(), HostTensor::from_f32(&[6, 5], &[0.0; 30]));
        let e = err(&m);
        assert!(e.contains("`logf` has rank 2"), "{e}");
    }

    #[test]
    fn nan_and_inf_are_named_with_index() {
        let mut m = good();
        let mut v = m["v"].to_f32_vec();
        v[60 + 2 * 20 + 3 * 4 + 1] = f32::NAN; // [1, 2, 3, 1]
        m.insert("v".into(), HostTensor::from_f32_as_bf16(&[2, 3, 5, 4], &v));
        let e = err(&m);
        assert!(e.contains("`v` holds NaN at index [1, 2, 3, 1]"), "{e}");
        let mut m = good();
        let mut q = m["q"].to_f32_vec();
        q[7] = f32::INFINITY;
        m.insert("q".into(), HostTensor::from_f32_as_bf16(&[2, 3, 5, 4], &q));
        let e = err(&m);
        assert!(e.contains("`q` holds inf at index [0, 0, 1, 3]") && e.contains("must be finite"), "{e}");
        let mut m = good();
        let mut lf = m["logf"].to_f32_vec();
        lf[2] = f32::NAN;
        m.insert("logf".into(), HostTensor::from_f32(&[2, 3, 5], &lf));
        assert!(err(&m).contains("`logf` holds NaN at index [0, 0, 2]"));
    }

    /// A parameter declared `nonincreasing along T` must not grow along T (equal steps are
    /// fine); the first growth is named with its index.
    #[test]
    fn growth_along_a_nonincreasing_axis_is_named() {
        let src = "attention f(x: f32[B, T], c: f32[B, T] nonincreasing along T) -> f32[B, T] {\n    y[b, t] = x[b, t] + c[b, t]\n    return y\n}\n";
        let g = foxc_ir::frontend::compile("f.attn", src.as_bytes()).unwrap().graph;
        let inputs = |c: &[f32]| {
            let mut m = TensorMap::new();
            m.insert("x".into(), HostTensor::from_f32(&[2, 4], &[0.5; 8]));
            m.insert("c".into(), HostTensor::from_f32(&[2, 4], c));
            m
        };
        let fine = [0.0, -1.0, -1.0, -7.5, 3.0, 2.0, 1.0, 0.0];
        assert!(check_inputs(&g, &inputs(&fine)).is_ok());
        let mut grows = fine;
        grows[6] = 2.5;
        let e = check_inputs(&g, &inputs(&grows)).unwrap_err().to_string();
        assert!(
            e.contains("`c` is declared nonincreasing along T, but holds 2.5 at index [1, 2] after 2 at the index before"),
            "{e}"
        );
    }

    #[test]
    fn out_of_range_is_named() {
        let mut m = good();
        let mut lf = m["logf"].to_f32_vec();
        lf[29] = 0.5;
        m.insert("logf".into(), HostTensor::from_f32(&[2, 3, 5], &lf));
        let e = err(&m);
        assert!(
            e.contains("`logf` holds 0.5 at index [1, 2, 4], outside its declared range [-inf, 0]"),
            "{e}"
        );
        let mut m = good();
        let mut lf = m["logf"].to_f32_vec();
        lf[0] = f32::INFINITY;
        m.insert("logf".into(), HostTensor::from_f32(&[2, 3, 5], &lf));
        assert!(err(&m).contains("`logf` holds inf at index [0, 0, 0] (declared range [-inf, 0])"));
    }

    #[test]
    fn indivisible_group_is_named() {
        let src = b"attention g(q: f32[H, T], k: f32[G, T]) -> f32[H, T] {\n o[h, t] = q[h, t] * k[h / (H / G), t]\n return o\n}";
        let g = foxc_ir::frontend::compile("g.attn", src).unwrap().graph;
        let t = |h: usize| HostTensor::from_f32(&[h, 2], &vec![0.5; h * 2]);
        let mut m = TensorMap::new();
        m.insert("q".into(), t(16));
        m.insert("k".into(), t(3));
        let e = check_inputs(&g, &m).unwrap_err().to_string();
        assert_eq!(e, "H = 16 is not divisible by G = 3 (needed by `h / (H / G)` in k's subscript)");
        m.insert("k".into(), t(4));
        assert!(check_inputs(&g, &m).is_ok());
    }

    /// After fusion the group lives in the attention op (kv_group), not in a gather.
    #[test]
    fn indivisible_kv_group_of_fused_attention_is_named() {
        let sp = Span::default();
        let mut g = Graph::new("gqa");
        let q = g.add_param("q", pos(DType::F32, &["H", "T"]), sp);
        let k = g.add_param("k", pos(DType::F32, &["G", "T"]), sp);
        let mut a = foxc_ir::Attention::new(foxc_ir::Scale::constant(1.0), foxc_ir::Mask::Causal, false);
        a.kv_group = Dim::quotient(Dim::sym("H"), Dim::sym("G"));
        let ty = pos(DType::F32, &["H", "T"]);
        g.output = Some(g.add_multi(Op::Attention(a), vec![ty], &[q.into(), k.into()], sp));
        let t = |h: usize| HostTensor::from_f32(&[h, 2], &vec![0.5; h * 2]);
        let mut m = TensorMap::new();
        m.insert("q".into(), t(6));
        m.insert("k".into(), t(4));
        let e = check_inputs(&g, &m).unwrap_err().to_string();
        assert_eq!(e, "H = 6 is not divisible by G = 4 (needed by `h / (H / G)` in k's subscript)");
        m.insert("k".into(), t(3));
        assert!(check_inputs(&g, &m).is_ok());
    }

    #[test]
    fn truncated_data_is_an_error() {
        let mut m = good();
        m.get_mut("v").unwrap().data.truncate(10);
        assert!(err(&m).contains("`v` has shape [2, 3, 5, 4] but 10 data bytes"));
    }
}
