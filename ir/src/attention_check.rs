//! The typing rule of `Op::Attention`: operand types against the attributes, and the two
//! result types. The verifier and every pass that builds an attention node use it.

use crate::attention::{Attention, IndexVar, Mask, Prune, RNode, Region};
use crate::types::{DType, Dim, ValueType};

fn dims(t: &ValueType) -> Vec<Dim> {
    t.dims().cloned().collect()
}

fn positional(t: &ValueType, rank: usize, what: &str) -> Result<Vec<Dim>, String> {
    if !t.is_positional() || t.rank() != rank {
        return Err(format!("attention's {what} must be a positional rank-{rank} tensor, found {t}"));
    }
    Ok(dims(t))
}

fn float(t: &ValueType, what: &str) -> Result<(), String> {
    if t.dtype.is_float() {
        Ok(())
    } else {
        Err(format!("attention's {what} must be floating point, found {t}"))
    }
}

/// Every capture `k` used in `r` exists and is read with one index per axis.
fn check_region(r: &Region, captures: &[&ValueType], what: &str) -> Result<(), String> {
    check_region_of("attention", r, captures, what)
}

/// [`check_region`] of region `what` of an `owner` op (its errors say so).
pub(crate) fn check_region_of(
    owner: &str,
    r: &Region,
    captures: &[&ValueType],
    what: &str,
) -> Result<(), String> {
    if let Some(m) = r.malformed() {
        return Err(format!("{owner}'s {what} region: {m}"));
    }
    for n in &r.nodes {
        if let RNode::Capture { k, index } = n {
            let t = captures.get(*k).ok_or_else(|| {
                format!("{owner}'s {what} reads capture {k}, but the node has {} captures", captures.len())
            })?;
            if !t.is_positional() || t.rank() != index.len() {
                return Err(format!(
                    "{owner}'s {what} indexes capture {k} ({t}) with {} subscripts",
                    index.len()
                ));
            }
            if t.dtype == DType::Bool && matches!(what, "score" | "epilogue" | "f") {
                return Err(format!("{owner}'s {what} reads the bool capture {k} as a number"));
            }
        }
    }
    Ok(())
}

impl Attention {
    /// The result types `[out, lse]` for operands of types `ops` (positional order), or why the
    /// operands do not fit the attributes (docs/SEMANTICS.md, "attention").
    pub fn result_types(&self, ops: &[&ValueType]) -> Result<Vec<ValueType>, String> {
        let fixed = self.fixed_operands();
        if ops.len() < fixed {
            return Err(format!("attention takes at least {fixed} operands, has {}", ops.len()));
        }
        let q = positional(ops[0], 4, "q")?;
        let k = positional(ops[1], 4, "k")?;
        let v = positional(ops[2], 4, "v")?;
        for (t, w) in [(ops[0], "q"), (ops[1], "k"), (ops[2], "v")] {
            float(t, w)?;
        }
        // Queries may be fewer than keys (aligned to the end of them: the module doc of
        // crate::attention).
        if k[0] != q[0] || k[3] != q[3] {
            return Err(format!("attention: k {} does not match q {} in B and D", ops[1], ops[0]));
        }
        if v[..3] != k[..3] {
            return Err(format!("attention: v {} and k {} differ in [B, H, T]", ops[2], ops[1]));
        }
        // With a group, `H = kv_group * Hk` is checked when dims are bound.
        if self.kv_group == Dim::Const(1) && k[1] != q[1] {
            return Err(format!(
                "attention: k {} has other heads than q {} and kv_group = 1",
                ops[1], ops[0]
            ));
        }
        if self.kv_group == Dim::Const(0) {
            return Err("attention: kv_group must not be 0".into());
        }
        let bht = q[..3].to_vec();
        let mut p = 3;
        if self.decay {
            let c = positional(ops[p], 3, "decay c")?;
            float(ops[p], "decay c")?;
            // One c per query head and key position (the query row i reads it at i + offset).
            if c != [q[0].clone(), q[1].clone(), k[2].clone()] {
                return Err(format!(
                    "attention's decay c must be [B, H] of q and [T] of k, found {}",
                    ops[p]
                ));
            }
            p += 1;
        }
        if self.has_decay_lo() {
            // c_lo carries c's rounding residual: the same type as c.
            if ops[p] != ops[p - 1] {
                return Err(format!(
                    "attention's c_lo must be typed like c {}, found {}",
                    ops[p - 1],
                    ops[p]
                ));
            }
            p += 1;
        }
        if let Some(t) = self.tiles {
            if t.bm == 0 || t.bn == 0 {
                return Err(format!("attention: tiles must be non-empty, found {}x{}", t.bm, t.bn));
            }
        }
        if self.prune != Prune::Dense {
            let t = self.tiles.ok_or("a pruned attention needs tiles")?;
            if !self.decay {
                return Err("a pruned attention needs the decay operand c".into());
            }
            if !self.mask.is_causal() {
                return Err("a pruned attention needs a causal or window mask".into());
            }
            let (dtype, what) =
                if self.prune == Prune::Start { (DType::I32, "start") } else { (DType::F32, "delta") };
            let want = ValueType::tensor(
                dtype,
                [q[0].clone(), q[1].clone(), Dim::Tiles(Box::new(q[2].clone()), t.bm)],
            );
            if *ops[p] != want {
                return Err(format!("attention's {what} must be {want}, found {}", ops[p]));
            }
            p += 1;
        }
        let captures = &ops[p..];
        check_region(&self.score, captures, "score")?;
        if let Mask::Expr(r) = &self.mask {
            check_region(r, captures, "mask")?;
            if r.uses_score() {
                return Err("attention's mask region must not use the score x".into());
            }
        }
        if let Some(e) = &self.keys_from {
            check_region(e, captures, "keys_from")?;
            let reads_j = |n: &RNode| match n {
                RNode::Index(v) => *v == IndexVar::J,
                RNode::Capture { index, .. } => index.iter().any(|x| x.vars().contains(&"j")),
                _ => false,
            };
            if e.uses_score() || e.nodes.iter().any(reads_j) {
                return Err("attention's keys_from bound must not use the score x or the key index j".into());
            }
        }
        if let Some(e) = &self.epilogue {
            check_region(e, captures, "epilogue")?;
        }
        if let Mask::Window(0) = self.mask {
            return Err("attention: window must be at least 1".into());
        }
        if !self.out_dtype.is_float() {
            return Err(format!("attention's out dtype must be floating point, found {}", self.out_dtype));
        }
        if let Some(e) = self.scale.malformed() {
            return Err(format!("attention: {e}"));
        }
        let out = ValueType::tensor(self.out_dtype, [q[0].clone(), q[1].clone(), q[2].clone(), v[3].clone()]);
        let lse = ValueType::tensor(DType::F32, bht);
        Ok(vec![out, lse])
    }
}
