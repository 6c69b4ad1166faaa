//! Large generated programs (issue 26): a chain of thousands of statements must not overflow the
//! stack, and statements that use the previous one twice (a DAG whose tree is exponential) must
//! cost time and memory linear in the program. Each run is bounded in wall time and, on Linux,
//! in peak memory (the child's VmHWM, polled from /proc while it runs). Nothing is randomized.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
mod common;

/// Generous bounds (debug builds on a loaded CI machine): the fixed compiler takes well under a
/// second for each program in a release build.
const WALL: Duration = Duration::from_secs(30);
const PEAK_KB: u64 = 1 << 20; // 1 GiB

fn tmp(name: &str) -> PathBuf {
    common::tmp("large", name)
}

/// `a1 = x * 1.0001; a2 = a1 * 1.0001; ...` (`dag`: `a2 = a1 + a1; a3 = a2 * a2; ...`, with a
/// tanh after each product so that the values stay finite) over a plain `[A, C]` tensor.
fn plain(n: usize, dag: bool) -> String {
    let mut s = String::from("attention g(q: f32[A, C]) -> f32[A, C] {\n    a1[a, c] = q[a, c] * 0.5\n");
    for i in 2..=n {
        let p = i - 1;
        let e = match (dag, i % 2) {
            (false, _) => format!("a{p}[a, c] * 1.0001"),
            (true, 0) => format!("tanh(a{p}[a, c] + a{p}[a, c])"),
            (true, _) => format!("a{p}[a, c] * a{p}[a, c]"),
        };
        s.push_str(&format!("    a{i}[a, c] = {e}\n"));
    }
    s.push_str(&format!("    return a{n}\n}}\n"));
    s
}

/// The same statements over the scores of a causal attention (recognition extracts them), tanh
/// included so that the values stay finite: without it the scores overflow and `run` refuses the
/// non-finite output (exit 1), which would test the overflow diagnostic, not the DAG.
fn attention(n: usize, dag: bool) -> String {
    let mut s = String::from(
        "attention g(q: bf16[B, H, T, D], k: bf16[B, H, T, D], v: bf16[B, H, T, D]) -> bf16[B, H, T, D] {\n    \
         a1[b, h, i, j] = sum(d, q[b, h, i, d] * k[b, h, j, d]) / sqrt(D)\n",
    );
    for i in 2..=n {
        let p = i - 1;
        let e = match (dag, i % 2) {
            (false, _) => format!("a{p}[b, h, i, j] * 1.0001"),
            (true, 0) => format!("tanh(a{p}[b, h, i, j] + a{p}[b, h, i, j])"),
            (true, _) => format!("a{p}[b, h, i, j] * a{p}[b, h, i, j]"),
        };
        s.push_str(&format!("    a{i}[b, h, i, j] = {e}\n"));
    }
    s.push_str(&format!(
        "    p[b, h, i, j] = softmax(j, causal(i, j, a{n}[b, h, i, j]))\n    \
         out[b, h, i, d] = sum(j, p[b, h, i, j] * v[b, h, j, d])\n    return out\n}}\n"
    ));
    s
}

/// `a1 = ((...(q)...))` with `depth` parentheses.
fn nested(depth: usize) -> String {
    format!(
        "attention g(q: f32[A, C]) -> f32[A, C] {{\n    a1[a, c] = {}q[a, c]{}\n    return a1\n}}\n",
        "(".repeat(depth),
        ")".repeat(depth)
    )
}

struct Ran {
    code: Option<i32>,
    text: String,
    wall: Duration,
    /// Peak resident set of the child in KiB (Linux; 0 elsewhere).
    peak_kb: u64,
}

fn vm_hwm(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// `foxc ARGS` with the program `src` written to `name` (its path replaces `{}` in `args`).
fn run(name: &str, src: &str, args: &[&str]) -> Ran {
    let path = tmp(name);
    std::fs::write(&path, src).unwrap();
    let p = path.to_str().unwrap();
    let args: Vec<&str> = args.iter().map(|a| if *a == "{}" { p } else { a }).collect();
    let t = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_foxc"))
        .args(&args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("foxc runs");
    let pid = child.id();
    // Drain the pipes on threads (a large output must not block the child).
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let o = std::thread::spawn(move || {
        let mut v = vec![];
        std::io::Read::read_to_end(&mut out, &mut v).ok();
        v
    });
    let e = std::thread::spawn(move || {
        let mut v = vec![];
        std::io::Read::read_to_end(&mut err, &mut v).ok();
        v
    });
    let mut peak_kb = 0;
    let status = loop {
        if let Some(kb) = vm_hwm(pid) {
            peak_kb = peak_kb.max(kb);
        }
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        // Far past a bound: stop it rather than wait (or exhaust the machine's memory).
        if t.elapsed() > WALL * 4 || peak_kb > 2 * PEAK_KB {
            child.kill().ok();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let wall = t.elapsed();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.join().unwrap()),
        String::from_utf8_lossy(&e.join().unwrap())
    );
    Ran { code: status.code(), text, wall, peak_kb }
}

fn assert_bounded(what: &str, r: &Ran) {
    eprintln!("{what}: exit {:?}, {:.2} s, peak {} KiB", r.code, r.wall.as_secs_f64(), r.peak_kb);
    // FOXC_TEST_WALL_S lowers the wall bound (to show the bound failing; never raises it).
    let wall = std::env::var("FOXC_TEST_WALL_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .map(Duration::from_secs_f64)
        .map_or(WALL, |w| w.min(WALL));
    assert!(r.wall < wall, "{what}: took {:?} (bound {wall:?})", r.wall);
    if cfg!(target_os = "linux") {
        assert!(r.peak_kb < PEAK_KB, "{what}: peak RSS {} KiB (bound {PEAK_KB} KiB)", r.peak_kb);
    }
}

/// Bounds first: a run stopped for its time or memory fails on that bound, not on its exit.
fn assert_ok(what: &str, r: &Ran) {
    assert_bounded(what, r);
    assert_eq!(r.code, Some(0), "{what}: {}", &r.text[r.text.len().saturating_sub(4000)..]);
}

const CPU: [&str; 5] = ["run", "{}", "--backend", "cpu", "--check"];

fn cpu_run(name: &str, src: &str, shape: &str) -> Ran {
    let mut args = CPU.to_vec();
    args.extend(["--shape", shape]);
    run(name, src, &args)
}

#[test]
fn a_chain_of_7000_statements_compiles_and_runs() {
    let src = plain(7000, false);
    assert_ok(
        "chain 7000, compile --emit opt",
        &run("chain.attn", &src, &["compile", "{}", "--emit", "opt"]),
    );
    assert_ok("chain 7000, run --check", &cpu_run("chain.attn", &src, "A=2,C=3"));
}

#[test]
fn a_chain_of_7000_statements_in_the_scores_compiles_and_runs() {
    let src = attention(7000, false);
    assert_ok("attention chain 7000, run --check", &cpu_run("achain.attn", &src, "B=1,H=1,T=8,D=4"));
}

#[test]
fn doubling_dags_stay_linear() {
    for n in [22, 200] {
        let src = plain(n, true);
        let r = cpu_run("dag.attn", &src, "A=2,C=3");
        assert_ok(&format!("dag {n}, run --check"), &r);
    }
    // In the scores of an attention: recognition extracts the region as a DAG and prints it with
    // shared operations named once.
    for n in [22, 200] {
        let src = attention(n, true);
        let r = run("adag.attn", &src, &["compile", "{}", "--emit", "opt"]);
        assert_ok(&format!("attention dag {n}, compile --emit opt"), &r);
        assert!(r.text.len() < 200 * n + 20_000, "attention dag {n}: {} bytes of IR", r.text.len());
        let r = cpu_run("adag.attn", &src, "B=1,H=1,T=8,D=4");
        assert_ok(&format!("attention dag {n}, run --check"), &r);
    }
}

/// `parser::MAX_NESTING` (100) counts the statement's expression and the subscript too: 98
/// parentheses are the deepest that compile, 99 are a diagnostic naming the limit (exit 1).
#[test]
fn nesting_up_to_the_limit_runs_and_past_it_is_a_diagnostic() {
    let r = cpu_run("nest98.attn", &nested(98), "A=2,C=3");
    assert_ok("98 parentheses", &r);
    let r = cpu_run("nest99.attn", &nested(99), "A=2,C=3");
    assert_eq!(r.code, Some(1), "99 parentheses: {}", r.text);
    assert!(r.text.contains("nested too deeply") && r.text.contains("at most 100"), "{}", r.text);
    assert_bounded("99 parentheses", &r);
}
