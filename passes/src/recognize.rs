//! Recognition of attention with egg: any `sum(j, softmax(j, MASK(E)) * v)` becomes one
//! `attention` node (docs/SEMANTICS.md, section `attention`).
//!
//! 1. [`build`]: the statement that produces the graph output is inlined into one egg term over
//!    named index variables: statement results read as `c[b, h, i]` are replaced by their
//!    defining expression with the statement's axes renamed to the use site; indices a statement
//!    binds itself (`sum(d, ...)`) get names private to that statement (`d'N`, never shown:
//!    [`names`]).
//! 2. The e-graph is saturated with the spelling rules of [`crate::lang::rules`] (iteration and
//!    node limits only).
//! 3. [`fuse::find`] searches the root class for the attention shape and splits the masked
//!    scores into the region and the decay terms ([`score`]); [`fuse::emit`] writes the
//!    `attention` node ([`region`]: the region and its captures, [`emit`]: e-classes back into
//!    IR values). [`bound`] gives ACP the bound of a region.

pub mod bound;
mod build;
mod emit;
mod fuse;
mod mask;
mod names;
mod region;
mod score;

pub use bound::{attention_bound, score_bound, CaptureInfo};
pub(crate) use build::{Builder, Ren};
pub(crate) use emit::{Emit, FusedCost};

use crate::lang::{pat, Attn, AttnGraph};
use crate::{Explanation, PassContext, PassError};
use egg::{Id, Searcher, Subst, Symbol};
use foxc_ir::{Graph, ValueId};
use names::shown;

/// The recognition pass: the output statement becomes one `attention` node, or an explanation
/// says why not.
/// The source span of each node of the new node's score region goes to `cx.region_spans`.
pub(crate) fn recognize(g: &mut Graph, cx: &mut PassContext) -> Result<Option<ValueId>, PassError> {
    let fused = fuse::run(g, &mut cx.explanations)?;
    Ok(fused.map(|(node, spans)| {
        cx.region_spans.insert(node, spans);
        node
    }))
}

/// Whether the e-graph of the output statement saturates within recognition's node and iteration
/// limits (so that what recognition finds does not depend on the limits), and its size.
pub fn saturates(g: &Graph) -> Option<(bool, usize)> {
    let out = g.output?;
    let store = if matches!(g.op(out), foxc_ir::Op::Cast) { g.operands(out)[0] } else { out };
    let (b, _, stop) = fuse::saturate(g, store).ok()?;
    Some((matches!(stop, egg::StopReason::Saturated), b.eg.total_size()))
}

/// Recognition alone (for tests of recognition before the other passes run): the explanations.
pub fn recognize_attention(g: &mut Graph) -> Result<Vec<Explanation>, PassError> {
    let mut ex = vec![];
    fuse::run(g, &mut ex)?;
    Ok(ex)
}

fn var(s: &str) -> egg::Var {
    s.parse().expect("variable literal")
}

fn sym_of(eg: &AttnGraph, s: &Subst, v: &str) -> Option<Symbol> {
    eg[s[var(v)]].data.sym
}

fn matches(eg: &AttnGraph, pattern: &str, class: Id) -> Vec<Subst> {
    pat(pattern).search_eclass(eg, class).map(|m| m.substs).unwrap_or_default()
}

/// Why the output expression is not attention, pointing at the class to blame.
fn diagnose(eg: &AttnGraph, root: Id) -> (String, Id) {
    if let Some(m) = matches(eg, "(sum ?j (* (softmax ?a ?x) ?v))", root).into_iter().next() {
        let (a, jj) = (eg[m[var("?a")]].data.sym, eg[m[var("?j")]].data.sym);
        // Blame the softmax itself.
        let x = eg.lookup(Attn::Softmax([m[var("?a")], m[var("?x")]])).unwrap_or(m[var("?x")]);
        let sx = m[var("?x")];
        if a != jj {
            let name = |s: Option<Symbol>| s.map(shown).unwrap_or_default();
            return (
                format!(
                    "softmax is taken over `{}` but the values are summed over `{}`: not attention over keys, \
                     so it is neither fused nor pruned",
                    name(a),
                    name(jj)
                ),
                x,
            );
        }
        let masked = !matches(eg, "(causal ?i ?jm ?s)", sx).is_empty()
            || !matches(eg, "(window ?i ?jm ?w ?s)", sx).is_empty();
        if !masked {
            return (
                format!(
                    "softmax over `{}` is not causally masked: every key is visible, so no key tile can be skipped \
                     (mask it with causal(i, j, s) or window(i, j, W, s))",
                    a.map(shown).unwrap_or_default()
                ),
                x,
            );
        }
        return ("the mask's key index is not the softmax axis".into(), x);
    }
    ("the output is not `sum(j, softmax(j, mask(scores)) * v)`".into(), root)
}
