//! The score hook of a generic attention region (docs/SEMANTICS.md, "attention"): the
//! [`Region`] emitted node by node on one score element, in f32. The f64 interpreter
//! (`foxc_ir::interp::region`) is the definition; the CPU backend's `cpu/region.rs` is the same
//! translation in Cranelift. Transcendentals use the PTX approximations (`ex2`, `lg2`), whose
//! errors (about 2^-22) are far below the bf16 inputs' (2^-8); where a formula would lose
//! that accuracy by cancellation (`log(1 + e)` for small `e`) a short series takes over.
//! Regions that read captured tensors are not handled here (the dispatch refuses them).

use super::score::{ScoreMod, ScorePos};
use crate::nvptx::builder::KernelBuilder;
use foxc_ir::attention::{IndexVar, RNode, Region};
use foxc_ir::{BinaryOp, Dim, UnaryOp};
use inkwell::values::FloatValue;
use inkwell::FloatPredicate;

const LOG2E: f64 = std::f64::consts::LOG2_E;
const LN2: f64 = std::f64::consts::LN_2;

/// A capture-free region with its dims resolved.
#[derive(Clone, Debug)]
pub(crate) struct RegionMod {
    region: Region,
    /// The value of each `RNode::Dim`, by node position (0 elsewhere).
    dims: Vec<f64>,
    /// Heads per batch (`H`), to split the kernel's flat `bh` into `b` and `h`; needed only
    /// when the region reads `b` or `h`.
    heads: Option<u64>,
}

impl RegionMod {
    /// Resolves the dims of `r`; `Err` says what the GPU kernel cannot evaluate.
    pub(crate) fn new(
        r: &Region,
        dim: &dyn Fn(&Dim) -> Option<u64>,
        heads: Option<u64>,
    ) -> Result<RegionMod, String> {
        if let Some(m) = r.malformed() {
            return Err(m);
        }
        let mut dims = vec![0.0; r.nodes.len()];
        for (n, node) in r.nodes.iter().enumerate() {
            match node {
                RNode::Dim(d) => {
                    dims[n] =
                        dim(d).ok_or_else(|| format!("the dim {d} of the score region is not static"))? as f64
                }
                RNode::Capture { .. } => return Err("captured tensors".into()),
                RNode::Index(IndexVar::B | IndexVar::H) if heads.is_none_or(|h| h == 0) => {
                    return Err("a score region reading b or h with a head count that is not static".into())
                }
                _ => {}
            }
        }
        Ok(RegionMod { region: r.clone(), dims, heads })
    }
}

impl RegionMod {
    /// The value of node `n` when it is a constant or a resolved dim.
    fn constant(&self, n: u32) -> Option<f64> {
        match self.region.nodes.get(n as usize)? {
            RNode::Const(c) => Some(*c),
            RNode::Dim(_) => Some(self.dims[n as usize]),
            _ => None,
        }
    }
}

/// FNV-1a, 64 bits: a stable hash for the kernel name (the same region gives the same name in
/// every build, so PTX snapshots are stable).
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, c| (h ^ c as u64).wrapping_mul(0x0100_0000_01b3))
}

impl ScoreMod for RegionMod {
    fn is_identity(&self) -> bool {
        self.region.is_identity()
    }

    /// Empty for the identity (its kernel keeps the plain name), else a hash of the region.
    fn tag(&self) -> String {
        if self.is_identity() {
            return String::new();
        }
        format!("r{:016x}", fnv1a(&format!("{:?}{:?}{:?}", self.region, self.dims, self.heads)))
    }

    fn emit<'a, 'ctx>(
        &self,
        b: &KernelBuilder<'a, 'ctx>,
        x: FloatValue<'ctx>,
        at: ScorePos<'ctx>,
    ) -> FloatValue<'ctx> {
        let mut vals: Vec<FloatValue<'ctx>> = Vec::with_capacity(self.region.nodes.len());
        for (n, node) in self.region.nodes.iter().enumerate() {
            let v = |k: u32| vals[k as usize];
            let val = match node {
                RNode::Score => x,
                RNode::Index(var) => {
                    let heads = self.heads.unwrap_or(1) as i64;
                    let ix = match var {
                        IndexVar::B => b.sdivc(at.bh, heads),
                        IndexVar::H => b.sub(at.bh, b.mulc(b.sdivc(at.bh, heads), heads)),
                        IndexVar::I => at.i,
                        IndexVar::J => at.j,
                    };
                    b.sitofp(ix)
                }
                RNode::Dim(_) => b.f32(self.dims[n]),
                RNode::Const(c) => b.f32(*c),
                // RegionMod::new refuses captures before any code is emitted.
                RNode::Capture { .. } => b.f32(f64::NAN),
                RNode::Unary(u, a) => unary(b, *u, v(*a)),
                // Division by a constant (softcap's x / U): a product with the reciprocal,
                // within 1.5 ulp of the quotient, no division in the score loop.
                RNode::Binary(BinaryOp::Div, a, c) if self.constant(*c).is_some_and(|k| k != 0.0) => {
                    b.fmul(v(*a), b.f32(1.0 / self.constant(*c).unwrap_or(1.0)))
                }
                RNode::Binary(op, a, c) => binary(b, *op, v(*a), v(*c)),
                RNode::Select(c, a, e) => {
                    // NaN counts as non-zero, as in the interpreter (`c != 0`).
                    let nz = b.fcmp(FloatPredicate::UNE, v(*c), b.f32(0.0));
                    b.select_f(nz, v(*a), v(*e))
                }
            };
            vals.push(val);
        }
        vals[self.region.root as usize]
    }
}

/// `e^a` as `2^(a log2 e)`.
fn exp<'ctx>(b: &KernelBuilder<'_, 'ctx>, a: FloatValue<'ctx>) -> FloatValue<'ctx> {
    b.ex2(b.fmul(a, b.f32(LOG2E)))
}

/// `1 / a` approximately (`rcp.approx.ftz.f32`, within an ulp; `1 / inf = 0`): the
/// denominators it serves are at least 1, so flushing subnormals changes nothing, and it
/// avoids the IEEE division's slow path in the score loop.
fn rcp<'ctx>(b: &KernelBuilder<'_, 'ctx>, a: FloatValue<'ctx>) -> FloatValue<'ctx> {
    b.call_f("llvm.nvvm.rcp.approx.ftz.f", &[a.into()])
}

/// `ln a` as `log2(a) ln 2` (`-inf` at 0, NaN below, like `f64::ln`).
fn ln<'ctx>(b: &KernelBuilder<'_, 'ctx>, a: FloatValue<'ctx>) -> FloatValue<'ctx> {
    b.fmul(b.lg2(a), b.f32(LN2))
}

/// `ln(1 + e)` for `e` in `[0, 1]`: below 1/64 the series `e - e^2/2 + e^3/3 - e^4/4`
/// (truncation below 2^-30 relative), where `1 + e` would round `e` away; above, `ln(1 + e)`.
fn ln1p_unit<'ctx>(b: &KernelBuilder<'_, 'ctx>, e: FloatValue<'ctx>) -> FloatValue<'ctx> {
    let big = ln(b, b.fadd(e, b.f32(1.0)));
    let mut s = b.f32(-0.25);
    for c in [1.0 / 3.0, -0.5, 1.0] {
        s = b.fma(s, e, b.f32(c));
    }
    let small = b.fmul(s, e);
    let is_small = b.fcmp(FloatPredicate::OLT, e, b.f32(1.0 / 64.0));
    b.select_f(is_small, small, big)
}

/// `log(sigmoid(a)) = min(a, 0) - ln(1 + e^-|a|)`, stable for large `|a|` (NaN stays NaN).
fn logsigmoid<'ctx>(b: &KernelBuilder<'_, 'ctx>, a: FloatValue<'ctx>) -> FloatValue<'ctx> {
    let e = exp(b, b.fneg(b.fabs(a)));
    let m = b.select_f(b.fcmp(FloatPredicate::OLT, a, b.f32(0.0)), a, b.f32(0.0));
    let r = b.fsub(m, ln1p_unit(b, e));
    nan_through(b, a, r)
}

/// `r`, or `a` where `a` is NaN.
fn nan_through<'ctx>(
    b: &KernelBuilder<'_, 'ctx>,
    a: FloatValue<'ctx>,
    r: FloatValue<'ctx>,
) -> FloatValue<'ctx> {
    b.select_f(b.fcmp(FloatPredicate::UNO, a, a), a, r)
}

fn unary<'ctx>(b: &KernelBuilder<'_, 'ctx>, u: UnaryOp, a: FloatValue<'ctx>) -> FloatValue<'ctx> {
    let one = b.f32(1.0);
    match u {
        UnaryOp::Neg => b.fneg(a),
        UnaryOp::Abs => b.fabs(a),
        UnaryOp::Sqrt => b.sqrt(a),
        UnaryOp::Rsqrt => b.fdiv(one, b.sqrt(a)),
        UnaryOp::Exp => exp(b, a),
        UnaryOp::Log => ln(b, a),
        UnaryOp::Exp2 => b.ex2(a),
        UnaryOp::Log2 => b.lg2(a),
        // tanh |a| = 1 - 2 / (e^(2|a|) + 1) (e^(2|a|) = inf gives exactly 1), sign restored
        // after: the formula's absolute error is about 2^-23, so |a| small loses no more than
        // that absolutely (the score is used absolutely: softcap multiplies it by U).
        UnaryOp::Tanh => {
            let e = exp(b, b.fmul(b.fabs(a), b.f32(2.0)));
            let t = b.fsub(one, b.fmul(b.f32(2.0), rcp(b, b.fadd(e, one))));
            let neg = b.fcmp(FloatPredicate::OLT, a, b.f32(0.0));
            let r = b.select_f(neg, b.fneg(t), t);
            // Keep tanh(+-0) = +-0 and odd small values exact to first order: below 2^-12,
            // tanh a = a to f32 precision.
            let tiny = b.fcmp(FloatPredicate::OLT, b.fabs(a), b.f32(1.0 / 4096.0));
            nan_through(b, a, b.select_f(tiny, a, r))
        }
        // 1 / (1 + e^-a): e^-a = inf gives 0, e^-a = 0 gives 1.
        UnaryOp::Sigmoid => {
            let r = rcp(b, b.fadd(one, exp(b, b.fneg(a))));
            nan_through(b, a, r)
        }
        UnaryOp::LogSigmoid => logsigmoid(b, a),
        UnaryOp::Softplus => b.fneg(logsigmoid(b, b.fneg(a))),
        // max(a, 0) keeping NaN (maxnum would drop it).
        UnaryOp::Relu => b.select_f(b.fcmp(FloatPredicate::OLT, a, b.f32(0.0)), b.f32(0.0), a),
    }
}

fn binary<'ctx>(
    b: &KernelBuilder<'_, 'ctx>,
    op: BinaryOp,
    x: FloatValue<'ctx>,
    y: FloatValue<'ctx>,
) -> FloatValue<'ctx> {
    let pred = match op {
        BinaryOp::Add => return b.fadd(x, y),
        BinaryOp::Sub => return b.fsub(x, y),
        BinaryOp::Mul => return b.fmul(x, y),
        BinaryOp::Div => return b.fdiv(x, y),
        // minnum / maxnum drop a NaN operand; the interpreter propagates it.
        BinaryOp::Min | BinaryOp::Max => {
            let r = if op == BinaryOp::Min { b.fmin(x, y) } else { b.fmax(x, y) };
            let nan = b.fcmp(FloatPredicate::UNO, x, y);
            return b.select_f(nan, b.fadd(x, y), r);
        }
        BinaryOp::Lt => FloatPredicate::OLT,
        BinaryOp::Le => FloatPredicate::OLE,
        BinaryOp::Gt => FloatPredicate::OGT,
        BinaryOp::Ge => FloatPredicate::OGE,
        BinaryOp::Eq => FloatPredicate::OEQ,
        BinaryOp::Ne => FloatPredicate::UNE,
    };
    b.select_f(b.fcmp(pred, x, y), b.f32(1.0), b.f32(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvptx::builder::ParamTy;
    use foxc_ir::DType;
    use inkwell::context::Context;

    /// The softcap region `20 tanh(x / 20) - h * (i - j) / H` (b, h, i, j and a dim all read)
    /// emitted once into a tiny kernel `(x, i, j, bh, out)`: its LLVM IR, node by node.
    fn region_ir(r: &Region, heads: u64) -> String {
        let ctx = Context::create();
        let m = ctx.create_module("t");
        let params = [
            ("x", ParamTy::F32),
            ("i", ParamTy::I32),
            ("j", ParamTy::I32),
            ("bh", ParamTy::I32),
            ("out", ParamTy::Ptr),
        ];
        let b = KernelBuilder::kernel(&ctx, &m, "region", &params).unwrap();
        let rm = RegionMod::new(r, &|d| d.eval(&|s| (s == "H").then_some(heads)), Some(heads)).unwrap();
        let at = ScorePos { i: b.param_int(1), j: b.param_int(2), bh: b.param_int(3) };
        let y = rm.emit(&b, b.param_f32(0), at);
        b.store_f(DType::F32, b.param_ptr(4), b.i64(0), y);
        let f = b.finish().unwrap();
        inkwell::values::AnyValue::print_to_string(&f).to_string()
    }

    fn softcap_alibi() -> Region {
        let mut r = Region::new();
        let x = r.push(RNode::Score);
        let c = r.push(RNode::Const(20.0));
        let d = r.push(RNode::Binary(BinaryOp::Div, x, c));
        let t = r.push(RNode::Unary(UnaryOp::Tanh, d));
        let cap = r.push(RNode::Binary(BinaryOp::Mul, c, t));
        let h = r.push(RNode::Index(IndexVar::H));
        let hh = r.push(RNode::Dim(Dim::sym("H")));
        let slope = r.push(RNode::Binary(BinaryOp::Div, h, hh));
        let i = r.push(RNode::Index(IndexVar::I));
        let j = r.push(RNode::Index(IndexVar::J));
        let dist = r.push(RNode::Binary(BinaryOp::Sub, i, j));
        let bias = r.push(RNode::Binary(BinaryOp::Mul, slope, dist));
        r.push(RNode::Binary(BinaryOp::Sub, cap, bias));
        r
    }

    #[test]
    fn softcap_alibi_region_llvm_ir_snapshot() {
        insta::assert_snapshot!("nvptx_region_softcap_alibi", region_ir(&softcap_alibi(), 4));
    }

    /// Every unary and binary op and a select emit (and the module verifies).
    #[test]
    fn every_node_kind_emits() {
        let unaries = [
            UnaryOp::Neg,
            UnaryOp::Abs,
            UnaryOp::Exp,
            UnaryOp::Log,
            UnaryOp::Sqrt,
            UnaryOp::Rsqrt,
            UnaryOp::Tanh,
            UnaryOp::Sigmoid,
            UnaryOp::Relu,
            UnaryOp::Exp2,
            UnaryOp::Log2,
            UnaryOp::Softplus,
            UnaryOp::LogSigmoid,
        ];
        let binaries = [
            BinaryOp::Add,
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Div,
            BinaryOp::Min,
            BinaryOp::Max,
            BinaryOp::Lt,
            BinaryOp::Le,
            BinaryOp::Gt,
            BinaryOp::Ge,
            BinaryOp::Eq,
            BinaryOp::Ne,
        ];
        let mut r = Region::new();
        let mut acc = r.push(RNode::Score);
        for u in unaries {
            let y = r.push(RNode::Unary(u, acc));
            acc = r.push(RNode::Binary(BinaryOp::Add, acc, y));
        }
        let b = r.push(RNode::Index(IndexVar::B));
        for op in binaries {
            acc = r.push(RNode::Binary(op, acc, b));
        }
        let x = r.push(RNode::Score);
        r.push(RNode::Select(acc, x, b));
        let ir = region_ir(&r, 2);
        for needle in
            ["ex2.approx", "lg2.approx", "llvm.sqrt.f32", "fcmp une", "fcmp uno", "minnum", "maxnum"]
        {
            assert!(ir.contains(needle), "{needle} missing:\n{ir}");
        }
    }

    #[test]
    fn captures_and_unknown_heads_are_refused() {
        let mut r = Region::new();
        let x = r.push(RNode::Score);
        let h = r.push(RNode::Index(IndexVar::H));
        r.push(RNode::Binary(BinaryOp::Add, x, h));
        let e = RegionMod::new(&r, &|_| None, None).unwrap_err();
        assert!(e.contains("head count"), "{e}");
        let mut r = Region::new();
        r.push(RNode::Dim(Dim::sym("W")));
        let e = RegionMod::new(&r, &|_| None, None).unwrap_err();
        assert!(e.contains("dim W"), "{e}");
        let mut r = Region::new();
        r.push(RNode::Capture { k: 0, index: vec![] });
        assert_eq!(RegionMod::new(&r, &|_| None, None).unwrap_err(), "captured tensors");
    }

    #[test]
    fn identity_keeps_the_plain_kernel_name() {
        let id = RegionMod::new(&Region::identity(), &|_| None, None).unwrap();
        assert!(id.is_identity() && id.tag().is_empty());
        let cap = RegionMod::new(&softcap_alibi(), &|_| Some(4), Some(4)).unwrap();
        assert!(!cap.is_identity());
        assert_eq!(cap.tag().len(), 17);
    }
}
