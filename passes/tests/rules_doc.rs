//! docs/RULES.md and the rule table (what `foxc rules` prints) stay in sync: every rule has a
//! section headed with its name and its formula exactly as printed, every rule section names a
//! rule of the table, and every statistic is in the statistics table.

use foxc_ir::prune_rule::Stat;
use foxc_passes::rules::RULES;

fn doc() -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/RULES.md");
    std::fs::read_to_string(p).expect("docs/RULES.md")
}

/// `### name — `formula`` from the rule's printed form `name: formula`.
fn heading(printed: &str) -> String {
    let (name, formula) = printed.split_once(": ").expect("printed as `name: formula`");
    format!("### {name} — `{formula}`")
}

#[test]
fn every_rule_has_its_section_with_the_printed_formula() {
    let doc = doc();
    for r in RULES {
        let h = heading(&r.rule().to_string());
        assert!(doc.lines().any(|l| l == h), "docs/RULES.md lacks the heading\n{h}");
    }
}

#[test]
fn every_rule_section_is_a_rule_of_the_table() {
    let doc = doc();
    let rules = &doc[doc.find("## The rules").expect("a rules section")..];
    let rules = &rules[..rules.find("\n## ").expect("a section after the rules")];
    let names: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.strip_prefix("### "))
        .map(|l| l.split(" — ").next().unwrap())
        .collect();
    assert_eq!(names, RULES.iter().map(|r| r.name).collect::<Vec<_>>(), "sections vs the table, in order");
}

#[test]
fn every_statistic_is_documented() {
    let doc = doc();
    for s in Stat::ALL {
        let row = format!("| `{}` |", s.name());
        assert!(doc.contains(&row), "docs/RULES.md statistics table lacks {row}");
    }
}
