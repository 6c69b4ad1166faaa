//! One-line tests of the spelling rules (egg's `test_fn!` style): each start term must reach its
//! goal under `lang::rules()` with the passes' own limits (no wall-clock limit), and the
//! look-alikes that are NOT equal must not.

use egg::{test_fn, RecExpr};
use foxc_passes::lang::{rules, runner, Attn};

// A hand-written softmax, with and without subtracting the row maximum.
test_fn! { hand_softmax, rules(), runner = runner(12, 20_000),
"(/ (exp (in s i j)) (sum l (exp (in s i l))))" => "(softmax j (in s i j))" }
test_fn! { hand_softmax_max, rules(), runner = runner(12, 20_000),
"(/ (exp (- (in s i j) (rmax m (in s i m)))) (sum l (exp (- (in s i l) (rmax m (in s i m))))))"
=> "(softmax j (in s i j))" }
test_fn! { softmax_shift, rules(), runner = runner(12, 20_000),
"(softmax j (- (causal i j (in s i j)) (rmax m (causal i m (in s i m)))))" => "(softmax j (causal i j (in s i j)))" }

// Masks spelled with select and -inf.
test_fn! { select_le_causal, rules(), runner = runner(12, 20_000),
"(select (<= (iota j) (iota i)) (in s i j) -inf)" => "(causal i j (in s i j))" }
test_fn! { select_gt_causal, rules(), runner = runner(12, 20_000),
"(select (> (iota j) (iota i)) -inf (in s i j))" => "(causal i j (in s i j))" }

// A mask around the causal mask (`select(c and j <= i, s, -inf)`) moves inside it.
test_fn! { mask_into_causal, rules(), runner = runner(12, 20_000),
"(select (>= (iota j) (in start b)) (select (<= (iota j) (iota i)) (in s i j) -inf) -inf)"
=> "(causal i j (select (>= (iota j) (in start b)) (in s i j) -inf))" }

// Both branches of a select under one causal mask (an `or` of masks around `causal`).
test_fn! { causal_out_of_select, rules(), runner = runner(12, 20_000),
"(select (< (iota j) 2) (causal i j (in s i j)) (causal i j (select (< (- (iota i) (iota j)) 3) (in s i j) -inf)))"
=> "(causal i j (select (< (iota j) 2) (in s i j) (select (< (- (iota i) (iota j)) 3) (in s i j) -inf)))" }

// A sliding window spelled as a select inside or around the causal mask.
test_fn! { select_window, rules(), runner = runner(12, 20_000),
"(causal i j (select (< (- (iota i) (iota j)) 3) (in s i j) -inf))" => "(window i j 3 (in s i j))" }
test_fn! { select_window_outside, rules(), runner = runner(12, 20_000),
"(select (< (- (iota i) (iota j)) 3) (causal i j (in s i j)) -inf)" => "(window i j 3 (in s i j))" }
test_fn! { select_window_flip_outside, rules(), runner = runner(12, 20_000),
"(select (>= (- (iota i) (iota j)) 3) -inf (causal i j (in s i j)))" => "(window i j 3 (in s i j))" }

// ALiBi spellings: m (j - i) = -(m i) - -(m j) after distribution.
test_fn! { alibi_distributes, rules(), runner = runner(12, 20_000),
"(* (in m h) (- (iota j) (iota i)))" => "(- (* (in m h) (iota j)) (* (in m h) (iota i)))" }

/// `start` and `other` are not proven equal by the rules: the e-graph of both saturates (every
/// rule applied until nothing changes; a run stopped by a limit would prove nothing) with them
/// in different classes.
fn not_equal(start: &str, other: &str) {
    let s: RecExpr<Attn> = start.parse().unwrap();
    let o: RecExpr<Attn> = other.parse().unwrap();
    let r = runner(SATURATION_ITERS, SATURATION_NODES).with_expr(&s).with_expr(&o).run(&rules());
    assert!(
        matches!(r.stop_reason, Some(egg::StopReason::Saturated)),
        "{start} / {other}: stopped by {:?} before saturation",
        r.stop_reason
    );
    let (a, b) = (r.egraph.find(r.roots[0]), r.egraph.find(r.roots[1]));
    assert_ne!(a, b, "{start} was rewritten to {other}");
}

/// Limits generous enough for the look-alikes below to saturate.
const SATURATION_ITERS: usize = 100;
const SATURATION_NODES: usize = 200_000;

#[test]
fn look_alikes_stay_apart() {
    // The denominator sums another expression: not a softmax.
    not_equal("(/ (exp (in s i j)) (sum l (exp (in t i l))))", "(softmax j (in s i j))");
    // The subtracted maximum depends on j: not a shift.
    not_equal("(softmax j (- (in s i j) (rmax m (in s j m))))", "(softmax j (in s i j))");
    // Keys after the query within 3, or a window of no whole size: not windows.
    not_equal(
        "(causal i j (select (< (- (iota j) (iota i)) 3) (in s i j) -inf))",
        "(window i j 3 (in s i j))",
    );
    not_equal(
        "(causal i j (select (< (- (iota i) (iota j)) 2.5) (in s i j) -inf))",
        "(window i j 2.5 (in s i j))",
    );
    // The mask keeps j >= i: not causal.
    not_equal("(select (>= (iota j) (iota i)) (in s i j) -inf)", "(causal i j (in s i j))");
}
