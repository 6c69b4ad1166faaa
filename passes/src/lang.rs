//! The egg language of attention terms, its analysis (free index variables, value intervals,
//! constants) and the spelling-equivalence rewrite rules.
//!
//! Terms use *named* index variables exactly like the DSL: `(in q b h i d)` reads parameter `q`
//! with its axes named `b, h, i, d`; `(sum d x)` reduces `x` over `d`; `(iota i)` is the value of
//! index `i`. Statement results are inlined (with their axes renamed to the use site) before a
//! term is built, so one term is the whole attention expression.

use egg::{
    define_language, rewrite, Analysis, Applier, AstSize, DidMerge, EGraph, Extractor, Id, Language, Pattern,
    PatternAst, RecExpr, Rewrite, Subst, Symbol, Var,
};
use foxc_ir::unary::{nan_hi, nan_lo};
use foxc_ir::UnaryOp;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

/// A numeric literal, stored by its bit pattern so that it can be hashed and ordered.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct Num(u64);

impl Num {
    pub fn new(x: f64) -> Num {
        // One representation for zero, so that -0.0 and 0.0 are one e-node.
        Num(if x == 0.0 { 0.0f64.to_bits() } else { x.to_bits() })
    }
    pub fn get(self) -> f64 {
        f64::from_bits(self.0)
    }
}

impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.get())
    }
}

impl FromStr for Num {
    type Err = ();
    fn from_str(s: &str) -> Result<Num, ()> {
        // Only things that look like numbers: axis names such as `inf` stay symbols.
        let first = s.chars().next().ok_or(())?;
        if !(first.is_ascii_digit() || first == '-' || first == '.') {
            return Err(());
        }
        s.parse::<f64>().map(Num::new).map_err(|_| ())
    }
}

define_language! {
    // Attention terms over named index variables.
    pub enum Attn {
        "+" = Add([Id; 2]),
        "-" = Sub([Id; 2]),
        "*" = Mul([Id; 2]),
        "/" = Div([Id; 2]),
        "recip" = Recip(Id),
        // Every unary built-in (`foxc_ir::unary`), spelled by its mnemonic: `(exp ?x)`,
        // `(neg ?x)`. Nodes sort by variant, then by op in declaration order: extraction breaks
        // cost ties by that order.
        Unary(UnaryOp, [Id; 1]),
        "min" = Min([Id; 2]),
        "max" = Max([Id; 2]),
        "<" = Lt([Id; 2]),
        "<=" = Le([Id; 2]),
        ">" = Gt([Id; 2]),
        ">=" = Ge([Id; 2]),
        "==" = Eq([Id; 2]),
        "!=" = Ne([Id; 2]),
        "select" = Select([Id; 3]),
        "sum" = Sum([Id; 2]),
        "rmax" = RMax([Id; 2]),
        "cumsum" = Cumsum([Id; 2]),
        "softmax" = Softmax([Id; 2]),
        "causal" = Causal([Id; 3]),
        "window" = Window([Id; 4]),
        "rmsnorm" = RmsNorm([Id; 4]),
        "dim" = Dim(Id),
        "iota" = Iota(Id),
        "in" = In(Box<[Id]>),
        // A computed subscript of an `in` leaf: `(ix TEMPLATE v0 v1 ...)`, the template an index
        // expression over `$0, $1, ...` standing for the variables that follow (`$0 / (H / G)`).
        "ix" = Ix(Box<[Id]>),
        Num(Num),
        Symbol(Symbol),
    }
}

/// What the analysis knows about an e-class.
#[derive(Clone, Debug, PartialEq)]
pub struct Data {
    /// The symbol, for symbol leaves (axis and tensor names).
    pub sym: Option<Symbol>,
    /// Free index variables of the value.
    pub axes: BTreeSet<Symbol>,
    /// A sound interval containing every value (bounds may be infinite).
    pub lo: f64,
    pub hi: f64,
    /// The value, when it is a known constant.
    pub konst: Option<f64>,
}

/// The e-graph analysis: free axes, interval bounds (the monotonicity proofs rest on `hi <= 0`
/// of a gate term) and constant folding.
#[derive(Default)]
pub struct AttnAnalysis {
    /// Declared value ranges of the tensors read by `in` leaves.
    pub ranges: BTreeMap<Symbol, (f64, f64)>,
}

pub type AttnGraph = EGraph<Attn, AttnAnalysis>;

/// Interval product; `0 * inf` counts as 0 (a factor that is exactly 0 kills any finite value,
/// and interval ends are limits, never attained infinities of real data).
fn mul_iv(a: (f64, f64), b: (f64, f64)) -> (f64, f64) {
    let m = |x: f64, y: f64| if x == 0.0 || y == 0.0 { 0.0 } else { x * y };
    let c = [m(a.0, b.0), m(a.0, b.1), m(a.1, b.0), m(a.1, b.1)];
    (c.iter().cloned().fold(f64::INFINITY, f64::min), c.iter().cloned().fold(f64::NEG_INFINITY, f64::max))
}

const FULL: (f64, f64) = (f64::NEG_INFINITY, f64::INFINITY);

impl Analysis<Attn> for AttnAnalysis {
    type Data = Data;

    fn make(egraph: &mut AttnGraph, enode: &Attn, _id: Id) -> Data {
        let d = |i: &Id| &egraph[*i].data;
        let iv = |i: &Id| (egraph[*i].data.lo, egraph[*i].data.hi);
        let k = |i: &Id| egraph[*i].data.konst;
        let sym = |i: &Id| egraph[*i].data.sym;
        let union =
            |ids: &[Id]| -> BTreeSet<Symbol> { ids.iter().flat_map(|i| d(i).axes.iter().cloned()).collect() };
        let mut sym_out = None;
        let mut konst = None;
        let (axes, (lo, hi)) = match enode {
            Attn::Num(n) => {
                konst = Some(n.get());
                (BTreeSet::new(), (n.get(), n.get()))
            }
            Attn::Symbol(s) => {
                sym_out = Some(*s);
                (BTreeSet::new(), FULL)
            }
            Attn::Dim(_) => (BTreeSet::new(), (1.0, f64::INFINITY)),
            Attn::Iota(a) => (sym(a).into_iter().collect(), (0.0, f64::INFINITY)),
            Attn::Ix(ch) => (ch[1..].iter().filter_map(sym).collect(), FULL),
            Attn::In(ch) => {
                // A plain subscript is its variable; a computed one brings its variables.
                let axes = ch[1..]
                    .iter()
                    .flat_map(|c| sym(c).map_or_else(|| d(c).axes.clone(), |s| [s].into()))
                    .collect();
                let r = sym(&ch[0]).and_then(|s| egraph.analysis.ranges.get(&s).cloned()).unwrap_or(FULL);
                (axes, r)
            }
            Attn::Add([a, b]) => {
                konst = k(a).zip(k(b)).map(|(x, y)| x + y);
                (union(&[*a, *b]), (nan_lo(iv(a).0 + iv(b).0), nan_hi(iv(a).1 + iv(b).1)))
            }
            Attn::Sub([a, b]) => {
                konst = k(a).zip(k(b)).map(|(x, y)| x - y);
                (union(&[*a, *b]), (nan_lo(iv(a).0 - iv(b).1), nan_hi(iv(a).1 - iv(b).0)))
            }
            Attn::Mul([a, b]) => {
                konst = k(a).zip(k(b)).map(|(x, y)| x * y);
                (union(&[*a, *b]), mul_iv(iv(a), iv(b)))
            }
            Attn::Div([a, b]) => {
                konst = k(a).zip(k(b)).filter(|(_, y)| *y != 0.0).map(|(x, y)| x / y);
                let (blo, bhi) = iv(b);
                let r = if blo > 0.0 || bhi < 0.0 { mul_iv(iv(a), (1.0 / bhi, 1.0 / blo)) } else { FULL };
                (union(&[*a, *b]), r)
            }
            Attn::Recip(a) => {
                konst = k(a).filter(|x| *x != 0.0).map(|x| 1.0 / x);
                let (lo, hi) = iv(a);
                (union(&[*a]), if lo > 0.0 || hi < 0.0 { (1.0 / hi, 1.0 / lo) } else { FULL })
            }
            Attn::Unary(u, [a]) => {
                let def = u.def();
                konst = k(a).filter(|x| def.folds.admits(*x)).map(def.eval);
                (union(&[*a]), (def.interval)(iv(a).0, iv(a).1))
            }
            Attn::Min([a, b]) => {
                konst = k(a).zip(k(b)).map(|(x, y)| x.min(y));
                (union(&[*a, *b]), (iv(a).0.min(iv(b).0), iv(a).1.min(iv(b).1)))
            }
            Attn::Max([a, b]) => {
                konst = k(a).zip(k(b)).map(|(x, y)| x.max(y));
                (union(&[*a, *b]), (iv(a).0.max(iv(b).0), iv(a).1.max(iv(b).1)))
            }
            Attn::Lt(x) | Attn::Le(x) | Attn::Gt(x) | Attn::Ge(x) | Attn::Eq(x) | Attn::Ne(x) => {
                (union(x), (0.0, 1.0))
            }
            Attn::Select([c, a, b]) => (union(&[*c, *a, *b]), (iv(a).0.min(iv(b).0), iv(a).1.max(iv(b).1))),
            Attn::Sum([ax, x]) | Attn::Cumsum([ax, x]) => {
                let mut axes = union(&[*x]);
                if matches!(enode, Attn::Sum(_)) {
                    if let Some(s) = sym(ax) {
                        axes.remove(&s);
                    }
                }
                let (lo, hi) = iv(x);
                let r = if lo >= 0.0 {
                    (0.0, f64::INFINITY)
                } else if hi <= 0.0 {
                    (f64::NEG_INFINITY, 0.0)
                } else {
                    FULL
                };
                (axes, r)
            }
            Attn::RMax([ax, x]) => {
                let mut axes = union(&[*x]);
                if let Some(s) = sym(ax) {
                    axes.remove(&s);
                }
                (axes, iv(x))
            }
            Attn::Softmax([_, x]) => (union(&[*x]), (0.0, 1.0)),
            Attn::Causal([_, _, x]) | Attn::Window([_, _, _, x]) => {
                (union(&[*x]), (f64::NEG_INFINITY, iv(x).1))
            }
            Attn::RmsNorm([_, _, x, _]) => (union(&[*x]), FULL),
        };
        let (lo, hi) = match konst {
            Some(c) if c.is_finite() => (c, c),
            _ => (lo, hi),
        };
        // A NaN end (a NaN literal, what folding leaves of `inf - inf`, through an op that
        // keeps it) knows nothing: the widest end. No NaN reaches the merge, whose change test
        // is `!=`: a NaN, never equal to itself, would count as a change on every visit and
        // the rebuild would go round a cycle forever.
        Data { sym: sym_out, axes, lo: nan_lo(lo), hi: nan_hi(hi), konst: konst.filter(|c| !c.is_nan()) }
    }

    fn merge(&mut self, a: &mut Data, b: Data) -> DidMerge {
        // Equal values: intersect what is known about them. The bounds are f64 arithmetic
        // without outward rounding, so two derivations of one value can differ in the last bits
        // and miss each other (`x + x` and `2 * x` of a point interval): an empty intersection
        // means that, and the class keeps its interval (either is right to rounding). Not the
        // hull: an interval that could grow again would make the analysis oscillate on cycles.
        // An end moves only by more than rounding: on a cycle such as `x = 21 * (x / 21)` each
        // visit's rounding would otherwise shave an ulp off the interval and report a change,
        // and the rebuild would go round the cycle ~2^52 times (a fuzz program hung in it). The
        // end kept is the wider, still sound.
        let before = a.clone();
        let moves = |old: f64, new: f64| !old.is_finite() || (new - old).abs() > 1e-9 * old.abs().max(1.0);
        let lo = if b.lo > a.lo && moves(a.lo, b.lo) { b.lo } else { a.lo };
        let hi = if b.hi < a.hi && moves(a.hi, b.hi) { b.hi } else { a.hi };
        if lo <= hi {
            (a.lo, a.hi) = (lo, hi);
        }
        if a.konst.is_none() {
            a.konst = b.konst;
        }
        if a.sym.is_none() {
            a.sym = b.sym;
        }
        let changed = *a != before;
        DidMerge(changed, *a != b)
    }

    fn modify(egraph: &mut AttnGraph, id: Id) {
        // Constant folding: a class with a known finite value also holds the literal.
        if let Some(c) = egraph[id].data.konst {
            if !c.is_nan() && egraph[id].data.axes.is_empty() {
                let n = egraph.add(Attn::Num(Num::new(c)));
                egraph.union(id, n);
            }
        }
    }
}

fn var(s: &str) -> Var {
    s.parse().expect("valid variable")
}

/// `?d` does not occur free in `?s`: moving `?s` across a reduction over `?d` is sound.
fn not_free(d: &'static str, s: &'static str) -> impl Fn(&mut AttnGraph, Id, &Subst) -> bool {
    let (dv, sv) = (var(d), var(s));
    move |eg, _, subst| match eg[subst[dv]].data.sym {
        Some(dsym) => !eg[subst[sv]].data.axes.contains(&dsym),
        None => false,
    }
}

/// `?x > 0` by the interval analysis (so `sqrt` and `rsqrt` of it are real and finite).
fn positive(x: &'static str) -> impl Fn(&mut AttnGraph, Id, &Subst) -> bool {
    let xv = var(x);
    move |eg, _, subst| eg[subst[xv]].data.lo > 0.0
}

/// `?w` is a whole constant >= 1 (a window's size).
fn window_size(w: &'static str) -> impl Fn(&mut AttnGraph, Id, &Subst) -> bool {
    let wv = var(w);
    move |eg, _, subst| {
        eg[subst[wv]].data.konst.is_some_and(|k| k >= 1.0 && k.fract() == 0.0 && k < 2f64.powi(53))
    }
}

/// The rewrite rules, as data: spellings that change form but not meaning.
pub fn rules() -> Vec<Rewrite<Attn, AttnAnalysis>> {
    let mut r: Vec<Rewrite<Attn, AttnAnalysis>> = vec![
        // Commutativity and associativity of + and *.
        rewrite!("add-comm"; "(+ ?a ?b)" => "(+ ?b ?a)"),
        rewrite!("add-assoc-l"; "(+ ?a (+ ?b ?c))" => "(+ (+ ?a ?b) ?c)"),
        rewrite!("add-assoc-r"; "(+ (+ ?a ?b) ?c)" => "(+ ?a (+ ?b ?c))"),
        rewrite!("mul-comm"; "(* ?a ?b)" => "(* ?b ?a)"),
        rewrite!("mul-assoc-l"; "(* ?a (* ?b ?c))" => "(* (* ?a ?b) ?c)"),
        rewrite!("mul-assoc-r"; "(* (* ?a ?b) ?c)" => "(* ?a (* ?b ?c))"),
        // Subtraction and negation.
        rewrite!("sub-add-neg"; "(- ?a ?b)" => "(+ ?a (neg ?b))"),
        rewrite!("add-neg-sub"; "(+ ?a (neg ?b))" => "(- ?a ?b)"),
        rewrite!("neg-neg"; "(neg (neg ?a))" => "?a"),
        rewrite!("neg-sub"; "(neg (- ?a ?b))" => "(- ?b ?a)"),
        rewrite!("neg-add"; "(neg (+ ?a ?b))" => "(+ (neg ?a) (neg ?b))"),
        rewrite!("neg-mul-l"; "(neg (* ?a ?b))" => "(* (neg ?a) ?b)"),
        rewrite!("neg-mul-in"; "(* (neg ?a) ?b)" => "(neg (* ?a ?b))"),
        rewrite!("mul-neg-one"; "(* -1 ?a)" => "(neg ?a)"),
        rewrite!("distribute"; "(* ?a (+ ?b ?c))" => "(+ (* ?a ?b) (* ?a ?c))"),
        rewrite!("distribute-sub"; "(* ?a (- ?b ?c))" => "(- (* ?a ?b) (* ?a ?c))"),
        // Where the scale sits: `/x` is `* recip(x)`, `/sqrt(D)` is `* rsqrt(D)`.
        rewrite!("div-recip"; "(/ ?a ?b)" => "(* ?a (recip ?b))"),
        rewrite!("recip-sqrt"; "(recip (sqrt ?a))" => "(rsqrt ?a)"),
        rewrite!("rsqrt-recip"; "(rsqrt ?a)" => "(recip (sqrt ?a))"),
        rewrite!("mul-one"; "(* 1 ?a)" => "?a"),
        // Log-gate spellings: log(sigmoid z) = logsigmoid z = -softplus(-z).
        rewrite!("log-sigmoid"; "(log (sigmoid ?z))" => "(logsigmoid ?z)"),
        rewrite!("neg-softplus-neg"; "(neg (softplus (neg ?z)))" => "(logsigmoid ?z)"),
        rewrite!("min-zero"; "(min 0 ?z)" => "(min ?z 0)"),
        // Masks: select(j <= i, s, -inf) is causal(i, j, s).
        rewrite!("select-le-causal"; "(select (<= (iota ?j) (iota ?i)) ?s -inf)" => "(causal ?i ?j ?s)"),
        rewrite!("select-ge-causal"; "(select (>= (iota ?i) (iota ?j)) ?s -inf)" => "(causal ?i ?j ?s)"),
        rewrite!("select-gt-causal"; "(select (> (iota ?j) (iota ?i)) -inf ?s)" => "(causal ?i ?j ?s)"),
        rewrite!("select-lt-causal"; "(select (< (iota ?i) (iota ?j)) -inf ?s)" => "(causal ?i ?j ?s)"),
        // A mask around the causal mask, as `select(c and j <= i, s, -inf)` lowers: the two masks
        // commute (both keep s where both hold), and the causal one outside is what fuses.
        rewrite!("mask-into-causal"; "(select ?c (causal ?i ?j ?s) -inf)" => "(causal ?i ?j (select ?c ?s -inf))"),
        // Both branches under the same causal mask (`select(c1 or c2, causal(s), -inf)` lowers to
        // `select(c1, causal(s), causal(select(c2, s, -inf)))`): -inf either way above the
        // diagonal.
        rewrite!("causal-out-of-select"; "(select ?c (causal ?i ?j ?a) (causal ?i ?j ?b))" => "(causal ?i ?j (select ?c ?a ?b))"),
        // The same for a window: `select(j >= start[b], window(i, j, W, s), -inf)`, and a window
        // spelled with `and` after another condition (`j >= start[b] and i - j < W and j <= i`).
        rewrite!("mask-into-window"; "(select ?c (window ?i ?j ?w ?s) -inf)" => "(window ?i ?j ?w (select ?c ?s -inf))"),
    ];
    // A sliding window spelled as a select inside the causal mask: `i - j < W` (also `j > i - W`,
    // or `-inf` where `i - j >= W`) for a whole constant `W >= 1` is `window(i, j, W, s)`
    // (`j <= i && i - j < W`). The conditions compare indices, never NaN, so the flipped
    // select is the same mask.
    // (A keep-select outside the causal mask moves inside it by `mask-into-causal`.)
    for (name, from) in [
        ("select-window", "(causal ?i ?j (select (< (- (iota ?i) (iota ?j)) ?w) ?s -inf))"),
        ("select-window-gt", "(causal ?i ?j (select (> (iota ?j) (- (iota ?i) ?w)) ?s -inf))"),
        ("select-window-flip", "(causal ?i ?j (select (>= (- (iota ?i) (iota ?j)) ?w) -inf ?s))"),
        ("select-window-flip-out", "(select (>= (- (iota ?i) (iota ?j)) ?w) -inf (causal ?i ?j ?s))"),
    ] {
        r.push(rewrite!(name; {pat(from)} => "(window ?i ?j ?w ?s)" if window_size("?w")));
    }
    // The window's condition second in a conjunction (`c and i - j < W`): both keep-selects keep
    // `s` where both hold, so they commute and the window comes out.
    r.push(rewrite!("select-window-second";
        {pat("(causal ?i ?j (select ?c (select (< (- (iota ?i) (iota ?j)) ?w) ?s -inf) -inf))")}
        => "(window ?i ?j ?w (select ?c ?s -inf))" if window_size("?w")));
    // A hand-written softmax: exp(a) / sum(l, exp(a with j renamed to l)) is softmax(j, a), and
    // subtracting a row maximum (free of j) does not change a softmax over j.
    r.push(rewrite!("hand-softmax"; "(* (exp ?a) (recip (sum ?l (exp ?b))))" => {HandSoftmax}));
    r.push(rewrite!("softmax-shift"; "(softmax ?j (- ?a (rmax ?l ?m)))" => "(softmax ?j ?a)" if not_free("?j", "?m")));
    // A factor free of the reduced axis moves out of the reduction (the scale of q or k).
    r.push(rewrite!("rsqrt-square"; "(* (rsqrt ?x) (rsqrt ?x))" => "(recip ?x)" if positive("?x")));
    r.push(rewrite!("sqrt-square"; "(* (sqrt ?x) (sqrt ?x))" => "?x" if positive("?x")));
    // Inside a causal (or windowed) mask, a sum of log-gates over (j, i] is c[i] - c[j].
    let window_sum = "(sum ?l (select (< (iota ?j) (iota ?l)) (select (<= (iota ?l) (iota ?i)) ?g 0) 0))";
    r.push(rewrite!("causal-gate-sum"; {pat(&format!("(causal ?i ?j (+ ?x {window_sum}))"))} => {GateSumToCumsum { window: false }}));
    r.push(rewrite!("window-gate-sum"; {pat(&format!("(window ?i ?j ?w (+ ?x {window_sum}))"))} => {GateSumToCumsum { window: true }}));
    // A factor free of the cumsum axis moves into the cumsum (a scaled gate: 2 * (c[i] - c[j])).
    r.push(rewrite!("cumsum-factor-in"; "(* ?a (cumsum ?t ?g))" => "(cumsum ?t (* ?a ?g))" if not_free("?t", "?a")));
    r.push(rewrite!("sum-factor-out"; "(sum ?d (* ?s ?x))" => "(* ?s (sum ?d ?x))" if not_free("?d", "?s")));
    r
}

/// Rename symbol `from` to `to` in a term.
pub fn rename(e: &RecExpr<Attn>, from: Symbol, to: Symbol) -> RecExpr<Attn> {
    let nodes: Vec<Attn> = e
        .as_ref()
        .iter()
        .map(|n| match n {
            Attn::Symbol(s) if *s == from => Attn::Symbol(to),
            other => other.clone(),
        })
        .collect();
    RecExpr::from(nodes)
}

/// `mask(i, j, x + sum(l, [j < l <= i] g[l]))` => `mask(i, j, x + (cumsum(i, g[i]) - cumsum(j, g[j])))`.
/// Exact wherever the mask keeps an entry (`j <= i`): the sum over `(j, i]` is `C_i - C_j` with
/// `C` the inclusive cumsum of `g`. Elsewhere both sides are masked to `-inf`, so the rule is
/// sound only with the mask around it, which the pattern requires.
struct GateSumToCumsum {
    window: bool,
}

impl Applier<Attn, AttnAnalysis> for GateSumToCumsum {
    fn apply_one(
        &self,
        eg: &mut AttnGraph,
        eclass: Id,
        subst: &Subst,
        _ast: Option<&PatternAst<Attn>>,
        _rule: Symbol,
    ) -> Vec<Id> {
        let sym = |v: &str| eg[subst[var(v)]].data.sym;
        let (Some(i), Some(j), Some(l)) = (sym("?i"), sym("?j"), sym("?l")) else { return vec![] };
        let g = subst[var("?g")];
        if i == j || l == i || l == j || eg[g].data.axes.contains(&i) || eg[g].data.axes.contains(&j) {
            return vec![];
        }
        let gt = Extractor::new(eg, AstSize).find_best(g).1;
        let (gi, gj) = (eg.add_expr(&rename(&gt, l, i)), eg.add_expr(&rename(&gt, l, j)));
        let (si, sj) = (eg.add(Attn::Symbol(i)), eg.add(Attn::Symbol(j)));
        let ci = eg.add(Attn::Cumsum([si, gi]));
        let cj = eg.add(Attn::Cumsum([sj, gj]));
        let diff = eg.add(Attn::Sub([ci, cj]));
        let s = eg.add(Attn::Add([subst[var("?x")], diff]));
        let out = if self.window {
            eg.add(Attn::Window([si, sj, subst[var("?w")], s]))
        } else {
            eg.add(Attn::Causal([si, sj, s]))
        };
        if eg.union(eclass, out) {
            vec![out]
        } else {
            vec![]
        }
    }
}

/// `exp(a) * recip(sum(l, exp(b)))` => `softmax(j, a)` when `b` is `a` with one of its indices `j`
/// renamed to the summed index `l` (the denominator sums the numerator over `j`). Exact wherever the
/// row has a finite entry; a row of all `-inf` is 0/0 = NaN on the left and 0 on the right (the
/// fused op's empty row), which no causal or windowed mask produces (`j = i` is always kept).
struct HandSoftmax;

impl Applier<Attn, AttnAnalysis> for HandSoftmax {
    fn apply_one(
        &self,
        eg: &mut AttnGraph,
        eclass: Id,
        subst: &Subst,
        _ast: Option<&PatternAst<Attn>>,
        _rule: Symbol,
    ) -> Vec<Id> {
        let (a, b) = (subst[var("?a")], eg.find(subst[var("?b")]));
        let Some(l) = eg[subst[var("?l")]].data.sym else { return vec![] };
        if eg[a].data.axes.contains(&l) || !eg[b].data.axes.contains(&l) {
            return vec![];
        }
        // The softmax index: free in the numerator, absent from the denominator's summand.
        let cands: Vec<Symbol> =
            eg[a].data.axes.iter().filter(|s| !eg[b].data.axes.contains(s)).cloned().collect();
        for j in cands {
            let mut fuel = ALPHA_FUEL;
            if !alpha_eq(eg, a, b, &mut vec![(j, l)], &mut fuel) {
                continue;
            }
            let sj = eg.add(Attn::Symbol(j));
            let sm = eg.add(Attn::Softmax([sj, a]));
            return if eg.union(eclass, sm) { vec![sm] } else { vec![] };
        }
        vec![]
    }
}

/// Work limit of one [`alpha_eq`] question (node pairs visited).
const ALPHA_FUEL: usize = 20_000;

/// Whether class `a`, with the free indices renamed by `ren` (innermost last), is the value of
/// class `b` up to the names of indices bound inside them (by `sum` and `max` reductions): the
/// numerator and the denominator of a softmax written in one statement bind their own names.
/// Gives up (false) when `fuel` runs out.
pub fn alpha_eq(eg: &AttnGraph, a: Id, b: Id, ren: &mut Vec<(Symbol, Symbol)>, fuel: &mut usize) -> bool {
    let (a, b) = (eg.find(a), eg.find(b));
    if a == b && !ren.iter().any(|(from, to)| from != to && eg[a].data.axes.contains(from)) {
        return true;
    }
    if let (Some(x), Some(y)) = (eg[a].data.sym, eg[b].data.sym) {
        let mapped = ren.iter().rev().find(|(from, _)| *from == x).map(|(_, to)| *to).unwrap_or(x);
        return mapped == y;
    }
    for na in &eg[a].nodes {
        for nb in &eg[b].nodes {
            if *fuel == 0 {
                return false;
            }
            *fuel -= 1;
            // Same node kind, same data (the op of a unary node), same arity.
            if !na.matches(nb) {
                continue;
            }
            if let (Attn::Num(x), Attn::Num(y)) = (na, nb) {
                if x == y {
                    return true;
                }
                continue;
            }
            let ok = match (na, nb) {
                (Attn::Sum([xa, ba]), Attn::Sum([xb, bb])) | (Attn::RMax([xa, ba]), Attn::RMax([xb, bb])) => {
                    match (eg[*xa].data.sym, eg[*xb].data.sym) {
                        (Some(x), Some(y)) => {
                            ren.push((x, y));
                            let r = alpha_eq(eg, *ba, *bb, ren, fuel);
                            ren.pop();
                            r
                        }
                        _ => false,
                    }
                }
                _ => {
                    na.children().iter().zip(nb.children()).all(|(ca, cb)| alpha_eq(eg, *ca, *cb, ren, fuel))
                }
            };
            if ok {
                return true;
            }
        }
    }
    false
}

/// The equality-saturation runner of every pass: limits on iterations and e-nodes only, never on
/// wall-clock time, so that results do not depend on the machine's load.
pub fn runner(iters: usize, nodes: usize) -> egg::Runner<Attn, AttnAnalysis> {
    egg::Runner::default()
        .with_iter_limit(iters)
        .with_node_limit(nodes)
        .with_time_limit(std::time::Duration::MAX)
}

/// Parse a pattern written in this module (the patterns are literals: a failure is a bug).
pub fn pat(s: &str) -> Pattern<Attn> {
    s.parse().expect("pattern literal parses")
}
