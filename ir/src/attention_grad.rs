//! Derivatives of the score region, for `attention_backward` (docs/SEMANTICS.md).
//!
//! The backward needs `dR/dx` and `dR/dcapture` at every kept entry. Rather than a second set
//! of numeric derivative rules, the derivative is itself a [`Region`]: reverse-mode
//! differentiation of the arena, written as new arena nodes after the original ones. The same
//! region evaluator (interpreter) and the same region emitter (backends) that run the forward's
//! `R` then run its derivatives, so each derivative rule is written exactly once, here.

use crate::attention::{Attention, RId, RNode, Region};
use crate::ops::{BinaryOp, UnaryOp};
use crate::types::{DType, Dim, ValueType};
use crate::unary::{Chain, StepBuilder};

/// The derivatives of a region `R`.
#[derive(Clone, Debug, PartialEq)]
pub struct RegionGrad {
    /// `dR/dx` (every `Score` node contributes).
    pub dx: Region,
    /// For each `Capture` node of `R` (by its id in `R`): `dR/d(that read)`. A capture read at
    /// several places has one entry per read; the backward adds them into the capture's gradient.
    pub captures: Vec<(RId, Region)>,
}

/// Builds adjoint nodes in a copy of the arena, folding the trivial cases (`0 * a`, `1 * a`,
/// `a + 0`) so that the identity region's derivative is the constant 1.
struct Builder {
    nodes: Vec<RNode>,
}

impl Builder {
    fn push(&mut self, n: RNode) -> RId {
        self.nodes.push(n);
        (self.nodes.len() - 1) as RId
    }

    fn constant(&self, id: RId) -> Option<f64> {
        match self.nodes[id as usize] {
            RNode::Const(c) => Some(c),
            _ => None,
        }
    }

    fn c(&mut self, v: f64) -> RId {
        self.push(RNode::Const(v))
    }

    fn mul(&mut self, a: RId, b: RId) -> RId {
        match (self.constant(a), self.constant(b)) {
            (Some(1.0), _) => b,
            (_, Some(1.0)) => a,
            _ => self.push(RNode::Binary(BinaryOp::Mul, a, b)),
        }
    }

    fn bin(&mut self, op: BinaryOp, a: RId, b: RId) -> RId {
        self.push(RNode::Binary(op, a, b))
    }

    fn un(&mut self, op: UnaryOp, a: RId) -> RId {
        self.push(RNode::Unary(op, a))
    }

    /// `acc + v`, where `acc` may be absent (zero so far).
    fn accumulate(&mut self, acc: Option<RId>, v: RId) -> RId {
        match acc {
            None => v,
            Some(a) => self.bin(BinaryOp::Add, a, v),
        }
    }
}

impl Region {
    /// Reverse-mode derivatives of the region with respect to `x` and to every capture read.
    /// A derivative that is identically zero is the constant 0.
    pub fn grad(&self) -> RegionGrad {
        let n0 = self.nodes.len();
        let mut b = Builder { nodes: self.nodes.clone() };
        let mut adj: Vec<Option<RId>> = vec![None; n0];
        adj[self.root as usize] = Some(b.c(1.0));
        for n in (0..n0).rev() {
            let Some(g) = adj[n] else { continue };
            let node = self.nodes[n].clone();
            let me = n as RId;
            let send = |b: &mut Builder, adj: &mut Vec<Option<RId>>, to: RId, local: RId| {
                let v = b.mul(g, local);
                adj[to as usize] = Some(b.accumulate(adj[to as usize], v));
            };
            match node {
                RNode::Score | RNode::Index(_) | RNode::Dim(_) | RNode::Const(_) | RNode::Capture { .. } => {}
                RNode::Unary(u, a) => {
                    let local = unary_derivative(&mut b, u, a, me);
                    send(&mut b, &mut adj, a, local);
                }
                RNode::Binary(op, x, y) => {
                    if let Some((dx, dy)) = binary_derivative(&mut b, op, x, y) {
                        send(&mut b, &mut adj, x, dx);
                        send(&mut b, &mut adj, y, dy);
                    }
                }
                RNode::Select(c, x, y) => {
                    // Route the adjoint to the branch taken, with no multiply (an infinite
                    // adjoint must not become NaN on the branch not taken).
                    let z = b.c(0.0);
                    let to_x = b.push(RNode::Select(c, g, z));
                    let to_y = b.push(RNode::Select(c, z, g));
                    adj[x as usize] = Some(b.accumulate(adj[x as usize], to_x));
                    adj[y as usize] = Some(b.accumulate(adj[y as usize], to_y));
                }
            }
        }
        let root_of = |acc: Option<RId>, b: &mut Builder| acc.unwrap_or_else(|| b.c(0.0));
        let mut dx: Option<RId> = None;
        for (n, node) in self.nodes.iter().enumerate() {
            if matches!(node, RNode::Score) {
                if let Some(a) = adj[n] {
                    dx = Some(b.accumulate(dx, a));
                }
            }
        }
        let dx_root = root_of(dx, &mut b);
        let mut caps = Vec::new();
        for (n, node) in self.nodes.iter().enumerate() {
            if matches!(node, RNode::Capture { .. }) {
                let r = root_of(adj[n], &mut b);
                caps.push((n as RId, r));
            }
        }
        let arena = b.nodes;
        let region = |root: RId| Region { nodes: arena.clone(), root };
        RegionGrad { dx: region(dx_root), captures: caps.into_iter().map(|(n, r)| (n, region(r))).collect() }
    }
}

/// `d u(a) / d a`, given the node `me = u(a)`: the op's derivative (`crate::unary`) as the
/// local factor the adjoint is multiplied by.
fn unary_derivative(b: &mut Builder, u: UnaryOp, a: RId, me: RId) -> RId {
    let d = &u.def().derivative;
    let Ok(s) = d.build(b, a, me);
    match d.chain {
        Chain::Scale(x) => s.arg(x),
        Chain::Divide(x) => {
            let one = b.c(1.0);
            b.bin(BinaryOp::Div, one, s.arg(x))
        }
        Chain::Negate => b.c(-1.0),
        Chain::Where { cond, .. } => s.arg(cond),
        Chain::Sign { pos, neg, .. } => b.bin(BinaryOp::Sub, s.arg(pos), s.arg(neg)),
    }
}

/// The region builder builds derivative steps infallibly.
impl StepBuilder for Builder {
    type Value = RId;
    type Error = std::convert::Infallible;
    fn step_const(&mut self, c: f64) -> Result<RId, Self::Error> {
        Ok(self.c(c))
    }
    fn step_unary(&mut self, op: UnaryOp, x: RId) -> Result<RId, Self::Error> {
        Ok(self.un(op, x))
    }
    fn step_binary(&mut self, op: BinaryOp, x: RId, y: RId) -> Result<RId, Self::Error> {
        Ok(self.bin(op, x, y))
    }
}

/// `(d/dx, d/dy)` of `op(x, y)`; `None` for comparisons (no derivative).
fn binary_derivative(b: &mut Builder, op: BinaryOp, x: RId, y: RId) -> Option<(RId, RId)> {
    Some(match op {
        BinaryOp::Add => (b.c(1.0), b.c(1.0)),
        BinaryOp::Sub => (b.c(1.0), b.c(-1.0)),
        BinaryOp::Mul => (y, x),
        BinaryOp::Div => {
            let one = b.c(1.0);
            let dx = b.bin(BinaryOp::Div, one, y);
            let q = b.bin(BinaryOp::Div, x, y);
            let q = b.bin(BinaryOp::Div, q, y);
            (dx, b.un(UnaryOp::Neg, q))
        }
        // The operand picked gets the gradient; the first one on ties.
        BinaryOp::Min => (b.bin(BinaryOp::Le, x, y), b.bin(BinaryOp::Gt, x, y)),
        BinaryOp::Max => (b.bin(BinaryOp::Ge, x, y), b.bin(BinaryOp::Lt, x, y)),
        BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge | BinaryOp::Eq | BinaryOp::Ne => {
            return None
        }
    })
}

impl Attention {
    /// The result types of `attention_backward` with these attributes, for operands of types
    /// `ops` = the forward's operands, then `out`, `lse`, `dout` (docs/SEMANTICS.md,
    /// "attention_backward"): `dq`, `dk`, `dv`, then `dc` if `decay`, then one gradient per float
    /// capture, shaped like what they differentiate: `dq`, `dk`, `dv` in `grad_dtype`, the rest
    /// f32.
    pub fn backward_result_types(&self, ops: &[&ValueType]) -> Result<Vec<ValueType>, String> {
        if ops.len() < self.fixed_operands() + 3 {
            return Err(format!(
                "attention_backward takes at least {} operands, has {}",
                self.fixed_operands() + 3,
                ops.len()
            ));
        }
        if self.epilogue.is_some() {
            // The gradient passes move the epilogue out of the forward (its ops are
            // differentiated as the rest of the program); the backward has none to undo.
            return Err("attention_backward has no epilogue".into());
        }
        let (fwd, rest) = ops.split_at(ops.len() - 3);
        let want = self.result_types(fwd)?;
        let (out, lse, dout) = (rest[0], rest[1], rest[2]);
        let dims = |t: &ValueType| t.dims().cloned().collect::<Vec<Dim>>();
        if !out.dtype.is_float() || !out.is_positional() || dims(out) != dims(&want[0]) {
            return Err(format!("attention_backward's out must be the forward's {}, found {out}", want[0]));
        }
        if *lse != want[1] {
            return Err(format!("attention_backward's lse must be {}, found {lse}", want[1]));
        }
        if !dout.dtype.is_float() || !dout.is_positional() || dims(dout) != dims(&want[0]) {
            return Err(format!(
                "attention_backward's dout must be shaped like out {}, found {dout}",
                want[0]
            ));
        }
        if !self.grad_dtype.is_float() {
            return Err(format!(
                "attention_backward's grads dtype must be floating point, found {}",
                self.grad_dtype
            ));
        }
        let f32_like = |t: &ValueType| ValueType::tensor(DType::F32, t.dims().cloned());
        let grad_like = |t: &ValueType| ValueType::tensor(self.grad_dtype, t.dims().cloned());
        let mut res = vec![grad_like(fwd[0]), grad_like(fwd[1]), grad_like(fwd[2])];
        if self.decay {
            res.push(f32_like(fwd[3]));
        }
        for c in &fwd[self.fixed_operands()..] {
            if c.dtype.is_float() {
                res.push(f32_like(c));
            }
        }
        Ok(res)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::IndexExpr;

    /// Evaluate a region with `x` and one capture value (test-only; the interpreter has the
    /// real evaluator).
    fn eval(r: &Region, x: f64, cap: f64) -> f64 {
        let mut v = vec![0.0; r.nodes.len()];
        for (n, node) in r.nodes.iter().enumerate() {
            v[n] = match node {
                RNode::Score => x,
                RNode::Capture { .. } => cap,
                RNode::Const(c) => *c,
                RNode::Index(_) | RNode::Dim(_) => 3.0,
                RNode::Unary(u, a) => crate::interp::unary(*u, v[*a as usize]),
                RNode::Binary(o, a, c) => {
                    let (p, q) = (v[*a as usize], v[*c as usize]);
                    match o {
                        BinaryOp::Add => p + q,
                        BinaryOp::Sub => p - q,
                        BinaryOp::Mul => p * q,
                        BinaryOp::Div => p / q,
                        BinaryOp::Min => p.min(q),
                        BinaryOp::Max => p.max(q),
                        BinaryOp::Lt => (p < q) as u8 as f64,
                        BinaryOp::Le => (p <= q) as u8 as f64,
                        BinaryOp::Gt => (p > q) as u8 as f64,
                        BinaryOp::Ge => (p >= q) as u8 as f64,
                        BinaryOp::Eq => (p == q) as u8 as f64,
                        BinaryOp::Ne => (p != q) as u8 as f64,
                    }
                }
                RNode::Select(c, a, b) => {
                    if v[*c as usize] != 0.0 {
                        v[*a as usize]
                    } else {
                        v[*b as usize]
                    }
                }
            };
        }
        v[r.root as usize]
    }

    fn check_fd(r: &Region, x: f64, cap: f64) {
        let g = r.grad();
        let h = 1e-6;
        let fdx = (eval(r, x + h, cap) - eval(r, x - h, cap)) / (2.0 * h);
        let dx = eval(&g.dx, x, cap);
        assert!((fdx - dx).abs() < 1e-6 * (1.0 + dx.abs()), "d/dx: fd {fdx} vs {dx} at x = {x}");
        let fdc = (eval(r, x, cap + h) - eval(r, x, cap - h)) / (2.0 * h);
        let dc: f64 = g.captures.iter().map(|(_, cr)| eval(cr, x, cap)).sum();
        assert!((fdc - dc).abs() < 1e-6 * (1.0 + dc.abs()), "d/dcap: fd {fdc} vs {dc} at x = {x}");
    }

    /// The backward undoes no epilogue: the gradient passes move it out of the forward first,
    /// and an `attention_backward` that carries one is malformed.
    #[test]
    fn a_backward_with_an_epilogue_does_not_verify() {
        use crate::attention::{Attention, Mask, Scale};
        use crate::types::{DType, Dim, ValueType};
        let d4 = |t| ValueType::tensor(t, ["B", "H", "T", "D"].map(Dim::sym));
        let lse = ValueType::tensor(DType::F32, ["B", "H", "T"].map(Dim::sym));
        let (q, out) = (d4(DType::BF16), d4(DType::F32));
        let ops = [&q, &q, &q, &out, &lse, &q];
        let mut a = Attention::new(Scale::constant(1.0), Mask::Causal, false);
        assert!(a.backward_result_types(&ops).is_ok());
        a.epilogue = Some(Region::identity());
        let e = a.backward_result_types(&ops).unwrap_err();
        assert!(e.contains("no epilogue"), "{e}");
    }

    #[test]
    fn identity_derivative_is_one() {
        let g = Region::identity().grad();
        assert_eq!(g.dx.nodes[g.dx.root as usize], RNode::Const(1.0));
        assert!(g.captures.is_empty());
    }

    #[test]
    fn every_rule_matches_finite_differences() {
        let unaries = UnaryOp::ALL;
        let binaries =
            [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Min, BinaryOp::Max];
        let iv = IndexExpr {
            terms: vec![("j".into(), 1)],
            dim_terms: vec![],
            constant: 0,
            div: None,
            clamps: vec![],
        };
        for &u in &unaries {
            for &bo in &binaries {
                // u(x * cap) (op) (x + cap): x and the capture reach the root along two paths.
                let mut r = Region::new();
                let x = r.push(RNode::Score);
                let c = r.push(RNode::Capture { k: 0, index: vec![iv.clone()] });
                let xc = r.push(RNode::Binary(BinaryOp::Mul, x, c));
                let ux = r.push(RNode::Unary(u, xc));
                let s = r.push(RNode::Binary(BinaryOp::Add, x, c));
                r.push(RNode::Binary(bo, ux, s));
                for &(xv, cv) in &[(0.7, 1.3), (1.9, 0.4), (0.3, 2.2)] {
                    check_fd(&r, xv, cv);
                }
            }
        }
    }

    #[test]
    fn softcap_and_select() {
        // 20 tanh(x / 20), then select(x > 1, that, cap * x).
        let mut r = Region::new();
        let x = r.push(RNode::Score);
        let a = r.push(RNode::Const(20.0));
        let d = r.push(RNode::Binary(BinaryOp::Div, x, a));
        let t = r.push(RNode::Unary(UnaryOp::Tanh, d));
        let sc = r.push(RNode::Binary(BinaryOp::Mul, a, t));
        let one = r.push(RNode::Const(1.0));
        let cond = r.push(RNode::Binary(BinaryOp::Gt, x, one));
        let iv = IndexExpr {
            terms: vec![("i".into(), 1)],
            dim_terms: vec![],
            constant: 0,
            div: None,
            clamps: vec![],
        };
        let c = r.push(RNode::Capture { k: 0, index: vec![iv] });
        let cx = r.push(RNode::Binary(BinaryOp::Mul, c, x));
        r.push(RNode::Select(cond, sc, cx));
        for &xv in &[-3.0, 0.5, 1.5, 30.0] {
            check_fd(&r, xv, 0.8);
        }
    }
}
