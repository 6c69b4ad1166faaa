//! `--prune-rule NAME` accepts every entry of the rule table and nothing else: the op carries
//! the rule (printed with its formula by `--emit opt`), the CPU runs it with `--check`, `mask
//! --rules` draws them all, and an unknown name is a usage error (exit 1) listing the names.

use foxc_passes::rules::RULES;
mod common;
use common::{foxc, mask_png, text, write_inputs};

#[test]
fn an_unknown_rule_is_a_usage_error_listing_the_rules() {
    let o = foxc(&["compile", "examples/fox.attn", "--prune-rule", "loose"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let t = text(&o);
    for r in RULES {
        assert!(t.contains(r.name), "{}: {t}", r.name);
    }
    let o = foxc(&["mask", "examples/fox.attn", "--inputs", "x", "--png", "y", "--rules", "paper,loose"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
}

#[test]
fn every_rule_reaches_the_threshold_op_and_runs_on_the_cpu_with_check() {
    for r in RULES {
        let o = foxc(&["compile", "examples/fox.attn", "--prune-rule", r.name, "--emit", "opt"]);
        assert!(o.status.success(), "{}: {}", r.name, text(&o));
        let want = format!("rule = {}", r.rule());
        assert!(text(&o).contains(&want), "{}: no `{want}` in\n{}", r.name, text(&o));
        let o = foxc(&[
            "run",
            "examples/fox.attn",
            "--backend",
            "cpu",
            "--shape",
            "B=1,H=2,T=300,D=16",
            "--tiles",
            "16x16",
            "--prune-rule",
            r.name,
            "--check",
        ]);
        assert!(o.status.success(), "{}: {}", r.name, text(&o));
        assert!(text(&o).contains("check: ok"), "{}: {}", r.name, text(&o));
        // The report names the rule as the user wrote it.
        assert!(text(&o).contains(&format!("pruning: {} rule", r.name)), "{}: {}", r.name, text(&o));
    }
}

/// `mask --rules` with every rule: one line each, with its kept fraction and max pruned mass.
#[test]
fn mask_draws_every_rule() {
    let dir = std::env::temp_dir().join(format!("foxc-rules-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (input, png) = (dir.join("in.safetensors"), dir.join("m.png"));
    write_inputs("examples/fox.attn", "B=1,H=2,T=512,D=16", &input);
    let names: Vec<&str> = RULES.iter().map(|r| r.name).collect();
    let all = names.join(",");
    let o = mask_png("examples/fox.attn", &input, &png, &["--rules", &all]);
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    for n in names {
        let line = t
            .lines()
            .find(|l| l.split_whitespace().next() == Some(n))
            .unwrap_or_else(|| panic!("no line for {n}: {t}"));
        assert!(line.contains("kept") && line.contains("max pruned mass"), "{line}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `--check-starts` (the GPU kernel's in-kernel starts against the reference's) needs the GPU.
#[test]
fn check_starts_without_the_gpu_is_a_usage_error() {
    let o = foxc(&[
        "run",
        "examples/fox.attn",
        "--backend",
        "cpu",
        "--shape",
        "B=1,H=1,T=64,D=16",
        "--check-starts",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("--backend cuda"), "{}", text(&o));
}

/// `--thresholds`: the user's per-head thresholds, listed by `foxc rules` as no safety proof,
/// printed in the IR and by `--explain`, run by the CPU and drawn by `mask`; a NaN, a positive
/// value, `--prune-rule` beside it and a program of another head count are user errors (exit 1).
#[test]
fn given_thresholds_on_the_cli() {
    let o = foxc(&["rules"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("given[d0, d1, ...]: d_h") && text(&o).contains("NOT a safety proof"),
        "{}",
        text(&o)
    );
    let o =
        foxc(&["compile", "examples/fox.attn", "--thresholds", "-8,-12,-inf", "--emit", "opt", "--explain"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("rule = given[-8, -12, -inf]"), "{}", text(&o));
    assert!(text(&o).contains("not a safety proof"), "{}", text(&o));
    let run = |h: u32, thresholds: &str| {
        foxc(&[
            "run",
            "examples/fox.attn",
            "--backend",
            "cpu",
            "--shape",
            &format!("B=1,H={h},T=200,D=16"),
            "--tiles",
            "16x16",
            &format!("--thresholds={thresholds}"),
        ])
    };
    let o = run(2, "-6,-inf");
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("pruning: given rule"), "{}", text(&o));
    let o = run(3, "-6,-inf");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("2 per-head thresholds") && text(&o).contains("H = 3"), "{}", text(&o));
    for bad in ["-6,nan", "-6,0.5", "-6,x", "-6,inf"] {
        let o = run(2, bad);
        assert_eq!(o.status.code(), Some(1), "{bad}: {}", text(&o));
    }
    let o = foxc(&["compile", "examples/fox.attn", "--thresholds", "-8,-12", "--prune-rule", "tight"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("cannot be used with"), "{}", text(&o));

    let dir = std::env::temp_dir().join(format!("foxc-given-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (input, png) = (dir.join("in.safetensors"), dir.join("m.png"));
    write_inputs("examples/fox.attn", "B=1,H=2,T=256,D=16", &input);
    let o = mask_png("examples/fox.attn", &input, &png, &["--thresholds=-1,-inf"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(png.exists());
    std::fs::remove_dir_all(&dir).ok();
}
