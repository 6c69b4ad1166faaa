//! `foxc rules`: the pruning rule table (passes/src/rules.rs), with each formula and why it is
//! safe, and the statistics formulas may read.

use foxc_driver::Error;
use foxc_ir::prune_rule::Stat;
use foxc_passes::rules::RULES;

/// Wrap `text` at `width` columns with `indent` before every line.
fn wrap(text: &str, width: usize, indent: &str) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for w in text.split_whitespace() {
        if !line.is_empty() && indent.len() + line.len() + 1 + w.len() > width {
            out.push_str(&format!("{indent}{line}\n"));
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(w);
    }
    if !line.is_empty() {
        out.push_str(&format!("{indent}{line}\n"));
    }
    out
}

pub fn rules() -> Result<(), Error> {
    println!("foxc pruning rules (--prune-rule NAME; default {}); proofs in docs/RULES.md\n", RULES[0].name);
    for r in RULES {
        println!("{}", r.rule());
        print!("{}", wrap(r.summary, 100, "  "));
        print!("{}", wrap(&format!("safe because: {}", r.soundness), 100, "  "));
        println!();
    }
    // The user's own thresholds: beside the table, without a safety argument.
    println!("{}[d0, d1, ...]: {}", foxc_ir::prune_rule::GIVEN, Stat::Given.name());
    print!("{}", wrap(foxc_passes::rules::GIVEN_SUMMARY, 100, "  "));
    print!("{}", wrap(&format!("NOT a safety proof: {}", foxc_passes::rules::GIVEN_NOTE), 100, "  "));
    println!();
    println!("statistics (per head; q_i and s_ii per row, the tile's minimum is taken):");
    for s in Stat::ALL {
        println!("  {:<9} {}", s.name(), s.meaning());
    }
    println!("  U(x)      the score region's bound on |R| given |scale q.k| <= x (identity: x)");
    Ok(())
}
