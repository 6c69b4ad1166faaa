//! Recognition of any attention variant `sum(j, softmax(j, MASK(E)) * v)` into `Op::Attention`
//! (docs/SEMANTICS.md): the mask becomes an attribute, `E` is split into the region `R` and the
//! decay `c_i - c_j` ([`super::score`]), and the decay terms become one `gate_cumsum`.
//!
//! [`find`] searches the saturated e-graph and returns a [`Recognized`] (e-classes and extracted
//! terms); [`emit`] writes it into the IR.

use super::build::Shifted;
use super::mask::{causal_offset, dim_sum, keep_term, same_offset};
use super::names::shown;
use super::region::{scale_of, RegionBuilder};
use super::score::{extract, reachable, split, sum_of, Terms, T};
use super::{matches, sym_of, var, Builder, Emit, FusedCost, Ren};
use crate::lang::{Attn, AttnGraph, Num};
use crate::{Explanation, PassError};
use egg::{Id, Language, Symbol};
use foxc_ir::attention::{Attention, Mask, Region, Scale};
use foxc_ir::check::infer;
use foxc_ir::index::IndexExpr;
use foxc_ir::{BinaryOp, DType, Dim, GateKind, Graph, Op, Span, UnaryOp, ValueId, ValueType};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The mask of a candidate, before the region exists.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum MaskKind {
    None,
    Causal,
    Window(u64),
    /// `select(c, s, -inf)` (or `select(c, -inf, s)`, `negated`) with a condition other than
    /// the causal one: the class of `c` (the keep-condition term is [`Recognized::mask_term`]).
    Expr {
        cond: Id,
        negated: bool,
    },
}

/// Where the decay `c_i` of one paired term comes from.
#[derive(Clone, Debug)]
pub(crate) enum DecaySrc {
    /// `coef * cumsum(i, g)`: log gate `coef * g[b, h, i]`; `logits` is `z` when `g = logsigmoid(z)`.
    Gate { g: Id, logits: Option<Id> },
    /// `coef * a[h] * i`: log gate `coef * a[h]` (ALiBi).
    Slope { a: Id },
    /// Anything else: stored as it is (the monotonicity pass cannot prove it decays).
    Other { c: Id },
}

/// A recognized attention, as e-classes and extracted terms (the intermediate form between the
/// e-graph and `Op::Attention`).
pub(crate) struct Recognized {
    pub mask: MaskKind,
    /// The condition of an expression mask.
    pub mask_term: Option<T>,
    pub i: Symbol,
    pub j: Symbol,
    pub d: Symbol,
    /// The batch and head indices, and the value feature index.
    pub batch: [Symbol; 2],
    pub e: Symbol,
    /// Multi-query attention: k and v have no head axis (`k[b, j, d]`), one key/value head
    /// shared by every query head.
    pub mqa: bool,
    pub sc: Id,
    pub q: Id,
    pub k: Id,
    pub v: Id,
    /// `R` (with the leaf `x`).
    pub region: T,
    /// `(coef, source)` of every decay term; `c_i` is their sum (read at the query's key position
    /// `i + Tk - Tq`: [`find`] checked the source says so).
    pub decay: Vec<(f64, DecaySrc)>,
    /// The softmax class (for explanations).
    pub softmax: Id,
}

/// Batch axes, value feature index and whether k and v lack the head axis (multi-query) when
/// q, k, v are indexed as attention needs.
fn check_qkv(
    eg: &AttnGraph,
    out_axes: &[Symbol],
    (i, j, d): (Symbol, Symbol, Symbol),
    (q, k, v): (Id, Id, Id),
) -> Result<([Symbol; 2], Symbol, bool), String> {
    let (qa, ka, va) = (&eg[q].data.axes, &eg[k].data.axes, &eg[v].data.axes);
    let (si, sj, sd) = (shown(i), shown(j), shown(d));
    if !(qa.contains(&i) && qa.contains(&d) && !qa.contains(&j)) {
        return Err(format!("the query operand must be indexed by `{si}` and `{sd}` and not by `{sj}`"));
    }
    if !(ka.contains(&j) && ka.contains(&d) && !ka.contains(&i)) {
        return Err(format!("the key operand must be indexed by `{sj}` and `{sd}` and not by `{si}`"));
    }
    let qb: Vec<Symbol> = qa.iter().filter(|a| **a != i && **a != d).cloned().collect();
    let kb: Vec<Symbol> = ka.iter().filter(|a| **a != j && **a != d).cloned().collect();
    // Multi-query: k has q's batch axis but no head axis.
    let mqa = qb.len() == 2 && kb.len() == 1 && qb.contains(&kb[0]);
    if (qb != kb || qb.len() != 2) && !mqa {
        return Err("q and k must share exactly two batch axes (batch and head), or k have only the batch axis (multi-query)".into());
    }
    if out_axes.len() != 4 {
        return Err("the output must have four axes: batch, head, query, feature (in any order)".into());
    }
    if !out_axes.contains(&i) {
        return Err(format!("the output is not indexed by the query index `{si}`"));
    }
    // The batch axes in the output's order (any layout: [B, H, T, D], [B, T, H, D], ...); with
    // multi-query keys, the one k keeps first.
    let mut batch: Vec<Symbol> = out_axes.iter().copied().filter(|a| qb.contains(a)).collect();
    if batch.len() != 2 {
        return Err("the output must be indexed by both batch axes of q (batch and head)".into());
    }
    if mqa && batch[0] != kb[0] {
        batch.swap(0, 1);
    }
    let batch = [batch[0], batch[1]];
    let Some(&e) = out_axes.iter().find(|a| **a != i && !batch.contains(a)) else {
        return Err("the output has no feature axis".into());
    };
    let want_v: BTreeSet<Symbol> = if mqa {
        [batch[0], j, e].into_iter().collect()
    } else {
        [batch[0], batch[1], j, e].into_iter().collect()
    };
    if *va != want_v {
        return Err(format!(
            "the value operand must be indexed by exactly the batch axes{}, `{sj}` and `{}`",
            if mqa { " of k (multi-query: no head axis)" } else { "" },
            shown(e)
        ));
    }
    Ok((batch, e, mqa))
}

/// The source of one decay term `c_i` (class `ci`).
fn decay_src(eg: &AttnGraph, ci: Id, i: Symbol, h: Symbol) -> DecaySrc {
    for m in matches(eg, "(cumsum ?t ?g)", ci) {
        if eg[m[var("?t")]].data.sym == Some(i) {
            let g = m[var("?g")];
            let logits = matches(eg, "(logsigmoid ?z)", g).into_iter().map(|lm| lm[var("?z")]).next();
            return DecaySrc::Gate { g, logits };
        }
    }
    for m in matches(eg, "(* ?a (iota ?t))", ci) {
        let a = m[var("?a")];
        if eg[m[var("?t")]].data.sym == Some(i) && eg[a].data.axes.iter().all(|x| *x == h) {
            return DecaySrc::Slope { a };
        }
    }
    DecaySrc::Other { c: ci }
}

/// How many links of a conjunction [`causal_inside`] looks through (an `or` of kept entries
/// counts as its own links: `select(a, X, select(b, X, -inf))` is one).
const MASK_CHAIN: usize = 8;

/// At most this many causal links come out of one tree.
const MASK_FOUND: usize = 32;

/// A tree of masks with one causal link taken out, added to the e-graph once the search is over
/// (adding to it stops searches).
#[derive(Clone)]
enum Rest {
    At(Id),
    NegInf,
    Select(Id, Box<Rest>, Box<Rest>),
}

/// [`causal_links`]'s answers by class and depth left, and each condition's causal offset.
#[derive(Default)]
struct Links {
    found: HashMap<(Id, usize), Vec<(IndexExpr, Rest)>>,
    causal: HashMap<(Id, bool), Option<IndexExpr>>,
}

/// The causal masks `j <= i + o` inside a tree of masks at `x`, each with the tree rebuilt
/// without it: `(o, the rest's class)`. The tree is of `select(c, X, -inf)` and `select(c, -inf,
/// X)` (`and` and an `or` of dropped entries lower so) and of `select(c, X, Y)` (an `or` of kept
/// entries: `select(a, X, select(b, X, -inf))`). Each link keeps its entry where its own condition
/// allows and is `-inf` elsewhere, so a causal link commutes with the links above it and comes
/// out to fuse whichever place it was written in (`j >= start[b] and j <= i + M - N`; `j <
/// start[b] or j > i` with `-inf` first); out of `select(c, X, Y)` when it is in both `X` and
/// `Y` at the same offset (`(j < 4 or i + M - N - j < W) and j <= i + M - N`: attention sinks
/// beside a window in a prefill). The outermost link is not reported (the caller's own match sees
/// it), nor one more than [`MASK_CHAIN`] links down.
fn causal_inside(eg: &mut AttnGraph, x: Id, i: Symbol, j: Symbol) -> Vec<(IndexExpr, Id)> {
    let found: Vec<(IndexExpr, Rest)> = causal_links(eg, x, (i, j), MASK_CHAIN, &mut Links::default())
        .into_iter()
        .filter(|(_, r)| !matches!(r, Rest::At(_)))
        .collect();
    let ninf = eg.add(Attn::Num(Num::new(f64::NEG_INFINITY)));
    fn add(eg: &mut AttnGraph, r: &Rest, ninf: Id) -> Id {
        match r {
            Rest::At(c) => *c,
            Rest::NegInf => ninf,
            Rest::Select(c, a, b) => {
                let (a, b) = (add(eg, a, ninf), add(eg, b, ninf));
                eg.add(Attn::Select([*c, a, b]))
            }
        }
    }
    let rebuilt = found.iter().map(|(o, r)| (o.clone(), add(eg, r, ninf))).collect();
    eg.rebuild();
    rebuilt
}

/// [`causal_inside`]'s search: every causal link within `depth` links of `at`, the outermost
/// included, each with the rest of the tree. `memo` holds each class's answer by depth (both
/// branches of an `or` reach its entry; a class met again below itself answers nothing).
fn causal_links(
    eg: &AttnGraph,
    at: Id,
    ij: (Symbol, Symbol),
    depth: usize,
    memo: &mut Links,
) -> Vec<(IndexExpr, Rest)> {
    if depth == 0 {
        return vec![];
    }
    if let Some(found) = memo.found.get(&(at, depth)) {
        return found.clone();
    }
    memo.found.insert((at, depth), vec![]);
    let mut found = vec![];
    let ninf = |c: Id| eg[c].data.konst == Some(f64::NEG_INFINITY);
    for node in &eg[at].nodes {
        let Attn::Select([cond, a, b]) = *node else { continue };
        match (ninf(a), ninf(b)) {
            (true, true) => {}
            (false, false) => {
                let inner_b = causal_links(eg, b, ij, depth, memo);
                for (o, ra) in causal_links(eg, a, ij, depth, memo) {
                    for (_, rb) in inner_b.iter().filter(|(ob, _)| same_offset(ob, &o)) {
                        found.push((
                            o.clone(),
                            Rest::Select(cond, Box::new(ra.clone()), Box::new(rb.clone())),
                        ));
                    }
                }
            }
            (kept_ninf, _) => {
                let (s, negated) = if kept_ninf { (b, true) } else { (a, false) };
                let causal = memo.causal.entry((cond, negated)).or_insert_with(|| {
                    extract(eg, cond, None, DIM_COST)
                        .and_then(|(t, _)| causal_offset(&t, negated, ij.0, ij.1))
                });
                if let Some(o) = causal.clone() {
                    found.push((o, Rest::At(s)));
                }
                for (o, r) in causal_links(eg, s, ij, depth - 1, memo) {
                    let (x, y) = if negated { (Rest::NegInf, r) } else { (r, Rest::NegInf) };
                    found.push((o, Rest::Select(cond, Box::new(x), Box::new(y))));
                }
            }
        }
        found.truncate(MASK_FOUND);
    }
    memo.found.insert((at, depth), found.clone());
    found
}

/// Cost of a dim in a region: a `1/sqrt(D)` belongs in the scale attribute.
const DIM_COST: f64 = 10.0;

/// Mask preference: masks that prune first.
fn mask_rank(m: MaskKind) -> u8 {
    match m {
        MaskKind::Causal | MaskKind::Window(_) => 0,
        MaskKind::Expr { .. } => 1,
        MaskKind::None => 2,
    }
}

/// ` + M - N` (empty for 0): an offset as it follows `i` in a message.
fn signed(o: &IndexExpr) -> String {
    if dim_sum(o) == (BTreeMap::new(), 0) {
        return String::new();
    }
    let text = o.to_string();
    match text.strip_prefix('-') {
        Some(rest) => format!(" - {rest}"),
        None => format!(" + {text}"),
    }
}

/// `Tk - Tq` as an offset: the key position of query row 0 when queries sit at the end.
fn end_offset(tq: &Dim, tk: &Dim) -> IndexExpr {
    IndexExpr { dim_terms: vec![(tk.clone(), 1), (tq.clone(), -1)], ..IndexExpr::constant(0) }
}

/// Search the saturated root class for attention; `Err` says why the best candidate failed.
pub(crate) fn find(
    eg: &mut AttnGraph,
    root: Id,
    out_axes: &[Symbol],
    leaves: &BTreeMap<Symbol, ValueId>,
    subscripts: &BTreeMap<Symbol, IndexExpr>,
    shifted: &BTreeMap<Id, Shifted>,
    dims: &BTreeMap<Symbol, Dim>,
) -> Result<Recognized, (String, Id)> {
    // (mask, its diagonal's offset, i, j, masked scores, v, softmax class)
    let mut cands: Vec<(MaskKind, IndexExpr, Symbol, Symbol, Id, Id, Id)> = vec![];
    let zero = IndexExpr::constant(0);
    for m in matches(eg, "(sum ?j (* (softmax ?j ?x) ?v))", root) {
        let Some(j) = sym_of(eg, &m, "?j") else { continue };
        let (x, v) = (m[var("?x")], m[var("?v")]);
        let sm = eg.lookup(Attn::Softmax([m[var("?j")], x])).unwrap_or(x);
        for mm in matches(eg, "(causal ?i ?j ?s)", x) {
            if let (Some(i), Some(jj)) = (sym_of(eg, &mm, "?i"), sym_of(eg, &mm, "?j")) {
                if jj == j {
                    cands.push((MaskKind::Causal, zero.clone(), i, j, mm[var("?s")], v, sm));
                }
            }
        }
        for mm in matches(eg, "(window ?i ?j ?w ?s)", x) {
            let w = eg[mm[var("?w")]].data.konst.filter(|w| *w >= 1.0 && w.fract() == 0.0);
            if let (Some(i), Some(jj), Some(w)) = (sym_of(eg, &mm, "?i"), sym_of(eg, &mm, "?j"), w) {
                if jj == j {
                    cands.push((MaskKind::Window(w as u64), zero.clone(), i, j, mm[var("?s")], v, sm));
                }
            }
        }
        // Without a mask naming it, the query axis is the output's third (the head-first
        // layout) unless v carries that axis (then it is a batch axis: `out[b, i, h, d]`, v
        // `[b, j, h, d]`); then the one output axis v does not carry, besides j, if there is
        // exactly one. Never a second guess where the first can be right, so a head-first
        // program (multi-query ones too) is read as before.
        let v_axes = &eg[v].data.axes;
        let guess = match out_axes.get(2) {
            Some(&first) if !v_axes.contains(&first) => Some(first),
            Some(_) => {
                let mut rest = out_axes.iter().filter(|a| !v_axes.contains(a) && **a != j);
                match (rest.next(), rest.next()) {
                    (Some(&only), None) => Some(only),
                    _ => None,
                }
            }
            None => None,
        };
        if let Some(i) = guess {
            for (pattern, negated) in [("(select ?c ?s -inf)", false), ("(select ?c -inf ?s)", true)] {
                for mm in matches(eg, pattern, x) {
                    let (cond, s) = (mm[var("?c")], mm[var("?s")]);
                    if eg[s].data.konst == Some(f64::NEG_INFINITY) {
                        continue;
                    }
                    // A condition that is exactly `j <= i + o` (o a sum of dims) is the causal mask
                    // of queries at key positions `i + o`.
                    let causal =
                        extract(eg, cond, None, DIM_COST).and_then(|(t, _)| causal_offset(&t, negated, i, j));
                    // A shifted one is also an expression mask, in case the shift is not the
                    // queries' position (`j < i` on square attention: `j <= i - 1`).
                    let shifted = causal.as_ref().is_some_and(|o| !same_offset(o, &zero));
                    let not_causal = causal.is_none();
                    if let Some(o) = causal {
                        cands.push((MaskKind::Causal, o, i, j, s, v, sm));
                    }
                    if shifted || not_causal {
                        cands.push((MaskKind::Expr { cond, negated }, zero.clone(), i, j, s, v, sm));
                    }
                }
            }
            for (o, rest) in causal_inside(eg, x, i, j) {
                cands.push((MaskKind::Causal, o, i, j, rest, v, sm));
            }
            cands.push((MaskKind::None, zero.clone(), i, j, x, v, sm));
        }
    }
    cands.sort_by_key(|c| mask_rank(c.0));
    let mut best: Option<((u8, f64, f64), Recognized)> = None;
    // Why no candidate fused: the reason from the candidate that got furthest (stage 0: no dot
    // product, 1: q/k/v indexing, 2: scale, 3: region), the best-ranked mask first.
    let mut why: Option<(u8, String, Id)> = None;
    let mut note = |stage: u8, msg: String, at: Id| {
        if why.as_ref().is_none_or(|(s0, _, _)| stage > *s0) {
            why = Some((stage, msg, at));
        }
    };
    for (mask, mask_offset, i, j, s, v, sm) in cands {
        // Every `scale * sum(d, q * k)` below the scores is a candidate `x`.
        let mut dots: Vec<(Id, Id, Symbol, Id, Id)> = vec![];
        let one = eg.add(Attn::Num(Num::new(1.0)));
        eg.rebuild();
        let one = eg.find(one);
        for c in reachable(eg, s, None) {
            for m in matches(eg, "(* ?sc (sum ?d (* ?q ?k)))", c) {
                if let Some(d) = sym_of(eg, &m, "?d") {
                    dots.push((c, m[var("?sc")], d, m[var("?q")], m[var("?k")]));
                }
            }
            for m in matches(eg, "(sum ?d (* ?q ?k))", c) {
                if let Some(d) = sym_of(eg, &m, "?d") {
                    dots.push((c, one, d, m[var("?q")], m[var("?k")]));
                }
            }
        }
        if dots.is_empty() {
            note(0, "the scores contain no dot product `sum(d, q * k)`".into(), s);
        }
        for (x, sc, d, q, k) in dots {
            let (batch, e, mqa) = match check_qkv(eg, out_axes, (i, j, d), (q, k, v)) {
                Ok(b) => b,
                Err(w) => {
                    note(1, w, s);
                    continue;
                }
            };
            if !eg[sc].data.axes.is_empty() {
                note(2, "the scale of `q . k` depends on an index".into(), s);
                continue;
            }
            let Some((term, cost)) = extract(eg, s, Some(x), DIM_COST) else { continue };
            let causal = matches!(mask, MaskKind::Causal | MaskKind::Window(_));
            let parts = split(eg, &term, (i, j), batch, shifted, causal.then_some(&mask_offset));
            eg.rebuild();
            let Some(region) = sum_of(&parts.region).filter(T::uses_x) else {
                note(2, "the scores do not use `q . k`".into(), s);
                continue;
            };
            // The region must be expressible (captures are checked, not emitted, here).
            let mut rb = RegionBuilder::new([batch[0], batch[1], i, j], leaves, subscripts);
            let mut dry = |_: &T, _: &[Symbol]| Ok(ValueId::end());
            if let Err(w) = rb.add(eg, &region, &mut dry) {
                note(3, w, s);
                continue;
            }
            let mask_term = match mask {
                MaskKind::Expr { cond: c, negated } => match extract(eg, c, None, DIM_COST) {
                    Some((t, _)) => {
                        let t = keep_term(t, negated);
                        if let Err(w) = rb.add(eg, &t, &mut dry) {
                            note(3, format!("the mask condition cannot be computed per entry: {w}"), c);
                            continue;
                        }
                        Some(t)
                    }
                    None => continue,
                },
                _ => None,
            };
            // Prefer the simplest scale, q and k (the user's `q . k / sqrt(D)`), then the
            // simplest region.
            let size = |c: Id| extract(eg, c, None, 1.0).map(|e| e.1).unwrap_or(f64::INFINITY);
            let sc_cost = size(sc);
            let key = (mask_rank(mask), cost + 2.0 * (sc_cost + size(q) + size(k)), sc_cost);
            if best.as_ref().is_some_and(|(k0, _)| *k0 <= key) {
                continue;
            }
            // Under a causal mask the fused op reads the decay at the mask's diagonal. A decay
            // written at another query position, `c(i + o') - c(j)` under `j <= i + o`, differs
            // from `c(i + o) - c(j)` by `c(i + o') - c(i + o)`, the same for every key of the
            // row: the softmax and its gradients are the same (ALiBi's `m[h] * (j - i)` against
            // a cache is its ramp at the key position plus `m[h] * (M - N)`). Without a mask the
            // decay's position is the queries' own and must be the fused op's (below).
            let decay_offset = parts.offset.clone().unwrap_or_else(|| zero.clone());
            let offset = if causal { mask_offset.clone() } else { decay_offset };
            // The fused op puts query row i at key position i + Tk - Tq (docs/SEMANTICS.md):
            // the source's must be that one wherever it matters (a causal mask or a decay).
            let end = match (dims.get(&i), dims.get(&j)) {
                (Some(tq), Some(tk)) => end_offset(tq, tk),
                _ => zero.clone(),
            };
            if (causal || !parts.decay.is_empty()) && !same_offset(&offset, &end) {
                note(
                    3,
                    format!(
                        "the query row i sits at key position i{}, not at i{} (queries aligned to the end \
                         of the keys, which is what the fused attention computes)",
                        signed(&offset),
                        signed(&end)
                    ),
                    s,
                );
                continue;
            }
            let decay: Terms = parts.decay;
            let classes: Vec<(f64, Id)> = decay.into_iter().map(|(c, t)| (c, t.class_in(eg))).collect();
            eg.rebuild();
            let decay =
                classes.into_iter().map(|(c, ci)| (c, decay_src(eg, eg.find(ci), i, batch[1]))).collect();
            let rec = Recognized {
                mask,
                mask_term,
                i,
                j,
                d,
                batch,
                e,
                mqa,
                sc,
                q,
                k,
                v,
                region,
                decay,
                softmax: sm,
            };
            best = Some((key, rec));
        }
    }
    match best {
        Some((_, r)) => Ok(r),
        None => Err(why.map(|(_, w, at)| (w, at)).unwrap_or_else(|| super::diagnose(eg, root))),
    }
}

impl Emit<'_, '_> {
    /// Store the named value `v` positionally in `order`, broadcasting missing axes.
    fn store_named(&mut self, mut v: ValueId, order: &[Symbol], span: Span) -> Result<ValueId, String> {
        for a in order {
            if self.g.ty(v).axis(a.as_str()).is_none() {
                let dim = self
                    .b
                    .dims
                    .get(a)
                    .cloned()
                    .ok_or_else(|| format!("unknown size of axis `{}`", shown(*a)))?;
                let ty = ValueType { dtype: DType::F32, axes: vec![foxc_ir::Axis::new(a.as_str(), dim)] };
                let io = self.g.add(Op::Iota { axis: a.to_string() }, ty, &[], span);
                let zero = self.node(Op::Const(0.0), &[], span)?;
                let z = self.node(Op::Binary(BinaryOp::Mul), &[zero, io], span)?;
                v = self.node(Op::Binary(BinaryOp::Add), &[v, z], span)?;
            }
        }
        let axes = order.iter().map(|s| s.to_string()).collect();
        self.node(Op::Store { axes }, &[v], span)
    }

    /// Class `c` (read in `order = [b, j, d]`, no head axis) as a positional `[B, 1, T, D]`
    /// tensor: one key/value head (a copy with a unit head axis).
    fn one_head(&mut self, c: Id, order: [Symbol; 3], span: Span) -> Result<ValueId, String> {
        const HEAD: &str = "__kv_head";
        let x = self.emit(c)?;
        let ty = ValueType { dtype: DType::F32, axes: vec![foxc_ir::Axis::new(HEAD, Dim::Const(1))] };
        let io = self.g.add(Op::Iota { axis: HEAD.to_string() }, ty, &[], span);
        let zero = self.node(Op::Const(0.0), &[], span)?;
        let z = self.node(Op::Binary(BinaryOp::Mul), &[zero, io], span)?;
        let x = self.node(Op::Binary(BinaryOp::Add), &[x, z], span)?;
        let axes = vec![order[0].to_string(), HEAD.to_string(), order[1].to_string(), order[2].to_string()];
        self.node(Op::Store { axes }, &[x], span)
    }

    /// `coef * v` as a named value.
    fn scaled(&mut self, coef: f64, v: ValueId, span: Span) -> Result<ValueId, String> {
        if coef == 1.0 {
            return Ok(v);
        }
        if coef == -1.0 {
            return self.node(Op::Unary(UnaryOp::Neg), &[v], span);
        }
        let c = self.node(Op::Const(coef), &[], span)?;
        self.node(Op::Binary(BinaryOp::Mul), &[c, v], span)
    }

    /// The positional `[B, H, T]` decay operand `c` of the recognized terms.
    /// `keys` is the key index: a ramp's `c` is over key positions (the queries' may be fewer).
    fn decay(
        &mut self,
        terms: &[(f64, DecaySrc)],
        order: [Symbol; 3],
        keys: Symbol,
    ) -> Result<Option<ValueId>, String> {
        let [bb, hh, _] = order;
        let span_of = |me: &Self, id: Id| me.b.span_of(id).unwrap_or(me.span);
        match terms {
            [] => return Ok(None),
            [(c, DecaySrc::Gate { g, logits })] if *c == 1.0 => {
                let span = span_of(self, *g);
                if let Some(z) = logits.filter(|z| self.b.eg[*z].data.axes.iter().all(|a| order.contains(a)))
                {
                    let zp = self.positional(z, &order, span)?;
                    return self
                        .node(Op::GateCumsum { kind: GateKind::Logits, split_rows: false }, &[zp], span)
                        .map(Some);
                }
                let gp = self.positional(*g, &order, span)?;
                return self
                    .node(Op::GateCumsum { kind: GateKind::LogGate, split_rows: false }, &[gp], span)
                    .map(Some);
            }
            [(c, DecaySrc::Slope { a })] => {
                // log f = c * a[h] = -m[h]: the Slope operand is m = -c * a.
                let span = span_of(self, *a);
                self.span = span;
                let m = if *c == -1.0 {
                    self.positional(*a, &[hh], span)?
                } else {
                    let av = self.emit(*a)?;
                    let mv = self.scaled(-c, av, span)?;
                    self.store_named(mv, &[hh], span)?
                };
                let dim = |me: &Self, s: &Symbol| {
                    me.b.dims.get(s).cloned().ok_or_else(|| format!("unknown size of axis `{}`", shown(*s)))
                };
                let ty = ValueType::tensor(DType::F32, [dim(self, &bb)?, dim(self, &hh)?, dim(self, &keys)?]);
                return Ok(Some(self.g.add(
                    Op::GateCumsum { kind: GateKind::Slope, split_rows: false },
                    ty,
                    &[m],
                    span,
                )));
            }
            // A c that is neither (a parameter declared nonincreasing, say): read in place when
            // it is a parameter in this order, not copied (the monotonicity pass decides).
            [(c, DecaySrc::Other { c: ci })] if *c == 1.0 => {
                let span = span_of(self, *ci);
                return self.positional(*ci, &order, span).map(Some);
            }
            _ => {}
        }
        // Several terms: one cumsum of the summed log gates, or (if a term is not a gate) the
        // summed c itself.
        let gates = terms.iter().all(|(_, s)| !matches!(s, DecaySrc::Other { .. }));
        let mut acc: Option<ValueId> = None;
        let mut span = self.span;
        for (c, s) in terms {
            let id = match s {
                DecaySrc::Gate { g, .. } if gates => *g,
                DecaySrc::Slope { a } if gates => {
                    // The gate of a ramp a[h] * i is a[h]; its c is a[h] * i (as a term, below).
                    *a
                }
                DecaySrc::Gate { .. } | DecaySrc::Slope { .. } | DecaySrc::Other { .. } => {
                    return self.decay_stored(terms, order, keys).map(Some);
                }
            };
            span = span_of(self, id);
            let v = self.emit(id)?;
            let v = self.scaled(*c, v, span)?;
            acc = Some(match acc {
                None => v,
                Some(a) => self.node(Op::Binary(BinaryOp::Add), &[a, v], span)?,
            });
        }
        let sum = acc.ok_or("no decay term")?;
        let gp = self.store_named(sum, &order, span)?;
        self.node(Op::GateCumsum { kind: GateKind::LogGate, split_rows: false }, &[gp], span).map(Some)
    }

    /// `c = sum coef * c_k` stored positionally (not provably decaying).
    fn decay_stored(
        &mut self,
        terms: &[(f64, DecaySrc)],
        order: [Symbol; 3],
        keys: Symbol,
    ) -> Result<ValueId, String> {
        let mut acc: Option<ValueId> = None;
        let span = self.span;
        for (c, s) in terms {
            let id = match s {
                DecaySrc::Other { c } => *c,
                // A gate or ramp among non-gates: its c_i term itself.
                DecaySrc::Gate { g, .. } => {
                    let gv = self.emit(*g)?;
                    let v =
                        self.node(Op::Cumsum { axis: order[2].to_string(), reverse: false }, &[gv], span)?;
                    let v = self.scaled(*c, v, span)?;
                    acc = Some(match acc {
                        None => v,
                        Some(a) => self.node(Op::Binary(BinaryOp::Add), &[a, v], span)?,
                    });
                    continue;
                }
                DecaySrc::Slope { a } => {
                    let av = self.emit(*a)?;
                    // Over key positions, as every `c` (the axis keeps the query's name).
                    let dim = self.b.dims.get(&keys).cloned().ok_or("unknown size of the key axis")?;
                    let ty = ValueType {
                        dtype: DType::F32,
                        axes: vec![foxc_ir::Axis::new(order[2].as_str(), dim)],
                    };
                    let io = self.g.add(Op::Iota { axis: order[2].to_string() }, ty, &[], span);
                    let v = self.node(Op::Binary(BinaryOp::Mul), &[av, io], span)?;
                    let v = self.scaled(*c, v, span)?;
                    acc = Some(match acc {
                        None => v,
                        Some(a) => self.node(Op::Binary(BinaryOp::Add), &[a, v], span)?,
                    });
                    continue;
                }
            };
            let v = self.emit(id)?;
            let v = self.scaled(*c, v, span)?;
            acc = Some(match acc {
                None => v,
                Some(a) => self.node(Op::Binary(BinaryOp::Add), &[a, v], span)?,
            });
        }
        let sum = acc.ok_or("no decay term")?;
        self.store_named(sum, &order, span)
    }
}

/// `x[b, h / G, j, d]` (class `c`, read in `order = [b, h, j, d]`) with `x` a positional
/// tensor: the tensor and the group size `G`.
fn grouped(b: &Builder, c: Id, order: [Symbol; 4]) -> Option<(ValueId, Dim)> {
    let eg = &b.eg;
    eg[c].nodes.iter().find_map(|n| {
        let Attn::In(ch) = n else { return None };
        if ch.len() != 5 {
            return None;
        }
        let plain = |k: usize| eg[ch[k]].data.sym == Some(order[k - 1]);
        if !(plain(1) && plain(3) && plain(4)) {
            return None;
        }
        let ix = eg[ch[2]].nodes.iter().find(|m| matches!(m, Attn::Ix(_)))?;
        let ixc = ix.children();
        let template = b.subscripts.get(&eg[ixc[0]].data.sym?)?;
        let group = match (
            template.terms.as_slice(),
            template.dim_terms.is_empty(),
            template.constant,
            &template.div,
        ) {
            ([(v, 1)], true, 0, Some(g)) if v == "$0" => g.clone(),
            _ => return None,
        };
        if ixc.len() != 2 || eg[ixc[1]].data.sym != Some(order[1]) {
            return None;
        }
        let leaf = *b.leaves.get(&eg[ch[0]].data.sym?)?;
        (b.g.ty(leaf).rank() == 4 && b.g.ty(leaf).is_positional()).then_some((leaf, group))
    })
}

/// Write the recognized attention into the IR; returns the attention node and the source span
/// of each node of its score region.
/// Why [`emit`] built no attention node.
pub(crate) enum EmitFail {
    /// The recognized operands do not fit the fused op (e.g. keys of another length than the
    /// queries): the program stays unfused, with this as its explanation (and hint).
    Unfusable(String, Option<&'static str>),
    /// A bug in the emitter.
    Internal(String),
}

impl From<String> for EmitFail {
    fn from(e: String) -> Self {
        EmitFail::Internal(e)
    }
}

impl From<&str> for EmitFail {
    fn from(e: &str) -> Self {
        EmitFail::Internal(e.to_string())
    }
}

pub(crate) fn emit(em: &mut Emit, r: &Recognized, span: Span) -> Result<(ValueId, Vec<Span>), EmitFail> {
    let [bb, hh] = r.batch;
    let mut q = em.positional(r.q, &[bb, hh, r.i, r.d], span)?;
    // Grouped-query attention: k and v read at head `h / G'` are the `[B, H / G', T, D]` tensors
    // themselves, with kv_group G'.
    let gk = grouped(em.b, r.k, [bb, hh, r.j, r.d]);
    let gv = grouped(em.b, r.v, [bb, hh, r.j, r.e]);
    let (k, v, kv_group) = match (gk, gv) {
        // Multi-query: k and v as one kv head (`[B, 1, T, D]`), shared by all H query heads.
        _ if r.mqa => {
            let heads = em.b.dims.get(&hh).cloned().ok_or("unknown size of the head axis")?;
            (em.one_head(r.k, [bb, r.j, r.d], span)?, em.one_head(r.v, [bb, r.j, r.e], span)?, heads)
        }
        (Some((k, g1)), Some((v, g2))) if g1 == g2 => (k, v, g1),
        _ => (
            em.positional(r.k, &[bb, hh, r.j, r.d], span)?,
            em.positional(r.v, &[bb, hh, r.j, r.e], span)?,
            Dim::Const(1),
        ),
    };
    // A scale that is neither a number nor `c / sqrt(D)` multiplies q (for the GPU targets the
    // `fold-q-scale` pass moves it into the attribute as its q factor).
    let scale = match scale_of(&em.b.eg, r.sc) {
        Some(s) => s,
        None => {
            // `s (q . k) = (s q) . k` holds for a finite `s` only: with `s = inf` the source's
            // score is an infinity of the dot's sign, the product's a sum of infinities of
            // mixed signs (NaN). Such a program stays unfused and computes what it says.
            let d = &em.b.eg[r.sc].data;
            if d.konst.is_some_and(|c| !c.is_finite()) || d.lo == f64::INFINITY || d.hi == f64::NEG_INFINITY {
                return Err(EmitFail::Unfusable(
                    "the scale of `q . k` is infinite: moving it onto q would turn each score (an infinity of the dot's sign) into a sum of infinities of both signs, NaN".into(),
                    None,
                ));
            }
            let s = em.emit(r.sc)?;
            q = em.node(Op::Binary(BinaryOp::Mul), &[q, s], span)?;
            Scale::constant(1.0)
        }
    };
    // (find checked that the source puts the queries at the end of the keys.)
    let c = em.decay(&r.decay, [bb, hh, r.i], r.j)?;
    em.span = span;
    // The region, its captures computed outside where needed.
    let b = em.b;
    let mut rb = RegionBuilder::new([bb, hh, r.i, r.j], &b.leaves, &b.subscripts);
    let mut mat = |t: &T, order: &[Symbol]| -> Result<ValueId, String> {
        let class = t.class.ok_or("a computed score term has no e-class")?;
        let sp = b.span_of(class).unwrap_or(span);
        em.positional(class, order, sp)
    };
    let root = rb.add(&b.eg, &r.region, &mut mat)?;
    let (score, classes) = rb.take(root);
    let spans = region_spans(&score, &classes, &|c| b.span_of(c), span);
    let mask_region = match &r.mask_term {
        Some(t) => {
            let root = rb.add(&b.eg, t, &mut mat)?;
            Some(rb.take(root).0)
        }
        None => None,
    };
    let captures = rb.captures;
    let mask = match r.mask {
        MaskKind::None => Mask::None,
        MaskKind::Causal => Mask::Causal,
        MaskKind::Window(w) => Mask::Window(w),
        MaskKind::Expr { .. } => Mask::Expr(mask_region.ok_or("an expression mask without its condition")?),
    };
    let mut a = Attention::new(scale, mask, c.is_some());
    a.score = score;
    a.kv_group = kv_group;
    let mut operands: Vec<ValueId> = vec![q, k, v];
    operands.extend(c);
    operands.extend(captures);
    let hint = "the fused attention reads k and v of one length, queries aligned to the end of the keys";
    Ok((em.g.add_attention(a, &operands, span).map_err(|why| EmitFail::Unfusable(why, Some(hint)))?, spans))
}

/// The source span of each node of `r`: that of the IR value its e-class was built from; a node
/// the score split built (no class) covers its operands; `whole` when nothing is known.
fn region_spans(
    r: &Region,
    classes: &[Option<Id>],
    span_of: &dyn Fn(Id) -> Option<Span>,
    whole: Span,
) -> Vec<Span> {
    let mut spans: Vec<Span> = Vec::with_capacity(r.nodes.len());
    for (n, node) in r.nodes.iter().enumerate() {
        let own = classes.get(n).copied().flatten().and_then(span_of);
        let covered = Region::args(node).into_iter().map(|a| spans[a as usize]).reduce(Span::join);
        spans.push(own.or(covered).unwrap_or(whole));
    }
    spans
}

/// The recognition pass: replace the output statement by one `attention` node (result 0 takes
/// the statement's uses). Programs that are not attention get an explanation and stay as they are.
/// Returns the attention node and the source span of each node of its score region.
pub(crate) fn run(
    g: &mut Graph,
    ex: &mut Vec<Explanation>,
) -> Result<Option<(ValueId, Vec<Span>)>, PassError> {
    let Some(out) = g.output else { return Ok(None) };
    if !g.find(|op| matches!(op, Op::Attention(_))).is_empty() {
        return Ok(None);
    }
    let store = if matches!(g.op(out), Op::Cast) { g.operands(out)[0] } else { out };
    let Op::Store { axes: out_axes } = g.op(store).clone() else {
        ex.push(Explanation {
            message: "not recognized as attention: the output is not an index-notation statement".into(),
            span: g.node(out).span,
            hint: None,
        });
        return Ok(None);
    };
    // The builder reads a snapshot (same node ids) while the graph is rewritten.
    let snapshot = g.clone();
    let g_ro: &Graph = &snapshot;
    let (mut b, root, _) = match saturate(g_ro, store) {
        Ok(s) => s,
        Err((msg, span)) => {
            ex.push(Explanation { message: format!("not recognized as attention: {msg}"), span, hint: None });
            return Ok(None);
        }
    };
    let out_syms: Vec<Symbol> = out_axes.iter().map(|a| Symbol::from(a.as_str())).collect();
    let store_span = g_ro.node(store).span;
    let (leaves, subscripts, shifted, dims) =
        (b.leaves.clone(), b.subscripts.clone(), b.shifted.clone(), b.dims.clone());
    let rec = match find(&mut b.eg, root, &out_syms, &leaves, &subscripts, &shifted, &dims) {
        Ok(r) => r,
        Err(_) if !inner_attentions(&mut b, root, &out_syms).is_empty() => {
            // The output is a function of attentions (an output gate, a difference of two):
            // fuse each, and compute the rest from their outputs.
            return epilogue(g, g_ro, &mut b, (store, root), &out_axes, ex);
        }
        Err((why, at)) => {
            b.eg.rebuild();
            let span = b.span_of(at).unwrap_or(store_span);
            ex.push(Explanation {
                message: format!("not recognized as attention: {why}"),
                span,
                hint: Some(
                    "foxc fuses `sum(j, softmax(j, MASK(E)) * v)` where E uses `scale * sum(d, q * k)`"
                        .into(),
                ),
            });
            return Ok(None);
        }
    };
    b.eg.rebuild();
    explain_unmasked(&b, &rec, store_span, ex);
    let store_name = g_ro.node(store).name.clone();
    let extractor = egg::Extractor::new(&b.eg, FusedCost);
    let mut em = Emit { g, b: &b, ex: extractor, span: store_span, memo: HashMap::new() };
    let Some((node, spans)) = emit_one(&mut em, &rec, store_span, ex)? else { return Ok(None) };
    let canonical: Vec<Symbol> = vec![rec.batch[0], rec.batch[1], rec.i, rec.e];
    let out = if canonical == out_syms {
        node
    } else {
        // Another layout ([B, T, H, D]): the attention's [B, H, T, Dv] output, transposed.
        relayout(g, node, &canonical, &out_axes, store_span)
            .map_err(|e| PassError::Internal(format!("laying out the attention's output: {e}")))?
    };
    replace_output(g, store, out, store_name);
    Ok(Some((node, spans)))
}

/// Says that attention `rec` is not pruned when its softmax is not causally masked.
fn explain_unmasked(b: &Builder, rec: &Recognized, at: Span, ex: &mut Vec<Explanation>) {
    if matches!(rec.mask, MaskKind::None | MaskKind::Expr { .. }) {
        let span = b.span_of(rec.softmax).unwrap_or(at);
        ex.push(Explanation {
            message: format!(
                "not pruned: softmax over `{}` is not causally masked: keys after the query are visible, so the \
                 decay argument does not hold and no key tile can be skipped (fused as dense attention)",
                shown(rec.j)
            ),
            span,
            hint: Some("mask it with causal(i, j, s) or window(i, j, W, s) if the model is causal".into()),
        });
    }
}

/// The attention node of `rec` (and its region spans); `None`, with an explanation at `span`,
/// when it cannot be fused (the operands emitted so far have no users: they are dropped and
/// the program stays as written).
fn emit_one(
    em: &mut Emit,
    rec: &Recognized,
    span: Span,
    ex: &mut Vec<Explanation>,
) -> Result<Option<(ValueId, Vec<Span>)>, PassError> {
    match emit(em, rec, span) {
        Ok(x) => Ok(Some(x)),
        Err(EmitFail::Unfusable(why, hint)) => {
            em.g.remove_dead();
            ex.push(Explanation { message: format!("not fused: {why}"), span, hint: hint.map(String::from) });
            Ok(None)
        }
        Err(EmitFail::Internal(e)) => Err(PassError::Internal(format!("emitting the fused attention: {e}"))),
    }
}

/// The output statement `store` replaced by `out`, which takes its name; dead values dropped.
fn replace_output(g: &mut Graph, store: ValueId, out: ValueId, name: Option<String>) {
    g.node_mut(out).name = name;
    g.replace_all_uses(store, out);
    g.remove_dead();
}

/// Attention output `node` (positional `[B, H, T, Dv]`, read as `canonical`) stored in the axis
/// order `out_axes`.
fn relayout(
    g: &mut Graph,
    node: ValueId,
    canonical: &[Symbol],
    out_axes: &[String],
    span: Span,
) -> Result<ValueId, String> {
    let named = bind_as(g, node, canonical, span);
    let ty = infer(&Op::Store { axes: out_axes.to_vec() }, &[g.ty(named)])?.ok_or("cannot type the store")?;
    Ok(g.add(Op::Store { axes: out_axes.to_vec() }, ty, &[named], span))
}

/// Positional `node` with its axes named `names`, in order.
fn bind_as(g: &mut Graph, node: ValueId, names: &[Symbol], span: Span) -> ValueId {
    let ty = g.ty(node).clone();
    let axes: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let named = ValueType {
        dtype: ty.dtype,
        axes: axes.iter().zip(ty.dims()).map(|(a, d)| foxc_ir::Axis::new(a, d.clone())).collect(),
    };
    g.add(Op::Bind { axes }, named, &[node], span)
}

/// The attentions inside the output expression `root` (not the root itself): every reachable
/// class that is `sum(j, softmax(j, ..) * v)` over the output's axes and that recognition
/// accepts, outermost first, none inside another.
fn inner_attentions(b: &mut Builder, root: Id, out: &[Symbol]) -> Vec<(Id, Recognized)> {
    let axes: BTreeSet<Symbol> = out.iter().copied().collect();
    let (leaves, subscripts, shifted, dims) =
        (b.leaves.clone(), b.subscripts.clone(), b.shifted.clone(), b.dims.clone());
    let cands: Vec<Id> = reachable(&b.eg, root, None)
        .into_iter()
        .filter(|&c| c != b.eg.find(root) && b.eg[c].data.axes == axes)
        .filter(|&c| !matches(&b.eg, "(sum ?j (* (softmax ?j ?x) ?v))", c).is_empty())
        .collect();
    let mut found: Vec<(Id, Recognized)> = vec![];
    for c in cands {
        let c = b.eg.find(c);
        if found.iter().any(|(f, _)| reachable(&b.eg, *f, None).contains(&c)) {
            continue;
        }
        if let Ok(r) = find(&mut b.eg, c, out, &leaves, &subscripts, &shifted, &dims) {
            b.eg.rebuild();
            found.retain(|(f, _)| !reachable(&b.eg, c, None).contains(f));
            found.push((c, r));
        }
    }
    found
}

/// Fuse the attentions inside the output expression and emit the expression around them: each
/// attention's class reads the attention's output (bound to the output's axes), the rest is
/// emitted as ordinary ops. Returns the attentions and their region spans.
fn epilogue(
    g: &mut Graph,
    g_ro: &Graph,
    b: &mut Builder,
    (store, root): (ValueId, Id),
    out_axes: &[String],
    ex: &mut Vec<Explanation>,
) -> Result<Option<(ValueId, Vec<Span>)>, PassError> {
    let out_syms: Vec<Symbol> = out_axes.iter().map(|a| Symbol::from(a.as_str())).collect();
    let found = inner_attentions(b, root, &out_syms);
    b.eg.rebuild();
    let store_span = g_ro.node(store).span;
    let store_name = g_ro.node(store).name.clone();
    let extractor = egg::Extractor::new(&b.eg, FusedCost);
    let mut em = Emit { g, b, ex: extractor, span: store_span, memo: HashMap::new() };
    let mut first: Option<(ValueId, Vec<Span>)> = None;
    for (class, rec) in &found {
        let span = b.span_of(*class).unwrap_or(store_span);
        explain_unmasked(b, rec, span, ex);
        let Some((node, spans)) = emit_one(&mut em, rec, span, ex)? else { return Ok(None) };
        let bound = bind_as(em.g, node, &[rec.batch[0], rec.batch[1], rec.i, rec.e], span);
        em.memo.insert(b.eg.find(*class), bound);
        first.get_or_insert((node, spans));
    }
    let value = em.emit(root).map_err(|e| PassError::Internal(format!("emitting the epilogue: {e}")))?;
    let out = em
        .node(Op::Store { axes: out_axes.to_vec() }, &[value], store_span)
        .map_err(|e| PassError::Internal(format!("storing the epilogue: {e}")))?;
    replace_output(g, store, out, store_name);
    ex.push(Explanation {
        message: format!(
            "fused {} attention{} inside the output expression; the rest of it is computed from {} output (in the attention's store where the fuse-epilogue pass says so, else as separate ops)",
            found.len(),
            if found.len() == 1 { "" } else { "s" },
            if found.len() == 1 { "its" } else { "their" }
        ),
        span: store_span,
        hint: None,
    });
    Ok(first)
}

/// The term of statement `store`'s expression, saturated with the spelling rules: the builder
/// (holding the e-graph), the root class, and why the runner stopped.
pub(crate) fn saturate(
    g: &Graph,
    store: ValueId,
) -> Result<(Builder<'_>, Id, egg::StopReason), (String, Span)> {
    let mut b = Builder::new(g);
    let root = b.term(g.operands(store)[0], &Ren::top())?;
    let eg = std::mem::take(&mut b.eg);
    let runner = crate::lang::runner(RUN_ITERS, RUN_NODES).with_egraph(eg).run(&crate::lang::rules());
    let stop = runner.stop_reason.clone().unwrap_or(egg::StopReason::Saturated);
    b.eg = runner.egraph;
    b.eg.rebuild();
    let root = b.eg.find(root);
    Ok((b, root, stop))
}

/// Saturation limits of recognition: enough for every example and spelling to saturate or to
/// contain its attention shape (tests/spellings), independent of the machine's speed.
pub(crate) const RUN_ITERS: usize = 12;
pub(crate) const RUN_NODES: usize = 40_000;
