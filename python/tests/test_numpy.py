"""The NumPy path of the foxc extension (CPU backend) against foxc's f64 reference interpreter,
on fresh random inputs; errors; the load cache. No GPU needed."""

import math
import pathlib
import re

import numpy as np
import pytest

import foxc

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def random_inputs(attn, rng, B=1, H=2, T=150, D=16):
    """Fresh random tensors for every parameter, by its declared shape and role."""
    dims = {"B": B, "H": H, "T": T, "D": D}
    out = {}
    for name, _dtype, decl in attn.signature:
        shape = [dims[d] for d in decl]
        if name in ("q", "k"):
            a = rng.standard_normal(shape) * 1.5
        elif name == "fgate":
            # Gate logits spread over heads: some heads forget fast (ACP prunes), some slowly.
            a = rng.standard_normal(shape) + np.linspace(-3.0, 4.0, H).reshape(1, H, 1)
        elif name == "slope":
            a = rng.uniform(0.05, 1.0, shape)
        elif name in ("wq", "wk"):
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            a = rng.standard_normal(shape)
        out[name] = a.astype(np.float32)
    return out


def rel_l2(a, b):
    return float(np.linalg.norm((a - b).ravel()) / np.linalg.norm(b.ravel()))


def assert_close_bf16(out, ref):
    """`out` (CPU, f32 arithmetic) against `ref` (interpreter, f64), both rounded to the declared
    bf16 output. The contract (DESIGN.md section 5) allows a relative L2 of 4e-3 for bf16
    outputs; the two agree far closer: they differ where f32 and f64 round to different bf16
    neighbours, plus f32 accumulation."""
    assert rel_l2(out, ref) <= 1e-3, rel_l2(out, ref)
    assert np.abs(out - ref).max() <= 1e-2 * np.abs(ref).max()


CASES = [
    ("fox.attn", {}),
    ("alibi.attn", {}),
    ("causal.attn", {}),
    ("window.attn", {"T": 300}),
    ("fox_qknorm.attn", {}),
]


@pytest.mark.parametrize("example,shape", CASES, ids=[c[0] for c in CASES])
def test_dense_cpu_matches_the_interpreter(example, shape):
    attn = foxc.load(EXAMPLES / example, no_prune=True)
    rng = np.random.default_rng()
    x = random_inputs(attn, rng, **shape)
    out = attn(**x)
    ref = foxc.reference(attn, **x)
    assert out.dtype == np.float32 and out.shape == ref.shape
    assert np.isfinite(out).all()
    assert_close_bf16(out, ref)


@pytest.mark.parametrize("example", ["fox.attn", "alibi.attn", "fox_qknorm.attn"])
def test_pruned_cpu_is_within_the_acp_bound(example):
    log_eps = -10.0
    attn = foxc.load(EXAMPLES / example, log_eps=log_eps)
    assert attn.options[0], "pruning is on"
    # The options name the rule as `foxc rules` and `load(prune_rule=...)` spell it.
    assert attn.options[1:] == (log_eps, "paper")
    assert foxc.load(EXAMPLES / example, prune_rule="tight-causal").options[2] == "tight-causal"
    # ACP inserted its block-boundary node (the kept key-tile range of each query tile).
    assert "block_boundary" in attn.ir()
    assert "block_boundary" not in foxc.load(EXAMPLES / example, no_prune=True).ir()
    rng = np.random.default_rng()
    x = random_inputs(attn, rng, T=256)
    out = attn(**x)
    dense = foxc.load(EXAMPLES / example, no_prune=True)(**x)
    # DESIGN.md section 5: the pruned output differs from the dense one by at most
    # 2 eps max|v| per element; both are rounded to bf16 (neighbours at worst: one ulp, up to
    # 2^-7 relative).
    bound = 2 * math.exp(log_eps) * np.abs(x["v"]).max()
    step = np.maximum(np.abs(out), np.abs(dense)) * 2.0**-7
    assert (np.abs(out - dense) <= bound + step).all()
    # Against the interpreter: the program as written (dense) and the pruned graph.
    assert_close_bf16(out, foxc.reference(attn, **x))
    assert_close_bf16(out, foxc.reference(attn, pruned=True, **x))


@pytest.mark.parametrize("example", ["fox.attn", "alibi.attn", "window.attn"])
def test_one_token_attends_to_itself(example):
    # T = 1: every row's softmax has one entry, so out = v (rounded to the bf16 output).
    attn = foxc.load(EXAMPLES / example)
    x = random_inputs(attn, np.random.default_rng(), B=2, H=3, T=1, D=32)
    out = attn(**x)
    np.testing.assert_array_equal(out, foxc.reference(attn, **x))
    assert (np.abs(out - x["v"]) <= np.abs(x["v"]) * 2.0**-8).all()


def test_bfloat16_arrays_are_taken_as_they_are():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    attn = foxc.load(EXAMPLES / "fox.attn", no_prune=True)
    x = random_inputs(attn, np.random.default_rng())
    xb = {n: (a.astype(ml_dtypes.bfloat16) if n in ("q", "k", "v") else a) for n, a in x.items()}
    # float32 arrays for bf16 parameters are rounded to bf16: the same run bit for bit.
    np.testing.assert_array_equal(attn(**xb), attn(**x))


def test_bad_dtype_names_the_tensor():
    attn = foxc.load(EXAMPLES / "fox.attn")
    x = random_inputs(attn, np.random.default_rng())
    x["k"] = x["k"].astype(np.float64)
    with pytest.raises(ValueError, match="`k`.*float64"):
        attn(**x)


def test_bad_shape_names_the_tensor():
    attn = foxc.load(EXAMPLES / "fox.attn")
    x = random_inputs(attn, np.random.default_rng())
    x["v"] = x["v"][:, :, :-1]
    with pytest.raises(ValueError, match="`v`"):
        attn(**x)


def test_missing_and_unexpected_names():
    attn = foxc.load(EXAMPLES / "fox.attn")
    x = random_inputs(attn, np.random.default_rng())
    fgate = x.pop("fgate")
    with pytest.raises(ValueError, match="fgate"):
        attn(**x)
    with pytest.raises(ValueError, match="`gate`"):
        attn(gate=fgate, fgate=fgate, **x)


def test_nan_input_names_the_tensor():
    attn = foxc.load(EXAMPLES / "fox.attn")
    x = random_inputs(attn, np.random.default_rng())
    x["q"][0, 1, 2, 3] = np.nan
    with pytest.raises(ValueError, match=r"`q`.*NaN"):
        attn(**x)


def test_bad_program_raises_the_diagnostic():
    src = (EXAMPLES / "fox.attn").read_text().replace("logsigmoid(", "logsigmod(")
    with pytest.raises(foxc.CompileError) as e:
        foxc.load(src)
    msg = str(e.value)
    assert isinstance(e.value, ValueError)
    assert "logsigmod" in msg
    line = next(i for i, l in enumerate(src.splitlines(), 1) if "cumsum(t, logsigmod" in l)
    assert re.search(rf"<string>:{line}:\d+", msg), msg


def test_bad_option_is_a_value_error():
    with pytest.raises(ValueError, match="prune_rule"):
        foxc.load(EXAMPLES / "fox.attn", prune_rule="loose")
    with pytest.raises(ValueError, match="log.eps"):
        foxc.load(EXAMPLES / "fox.attn", log_eps=1.0)


def test_second_load_is_a_cache_hit():
    src = (EXAMPLES / "causal.attn").read_text() + "\n# cache test\n"
    before = foxc.cache_info()
    a = foxc.load(src, log_eps=-9.0)
    mid = foxc.cache_info()
    b = foxc.load(src, log_eps=-9.0)
    after = foxc.cache_info()
    assert mid["load_misses"] == before["load_misses"] + 1
    assert after["load_hits"] == mid["load_hits"] + 1
    assert after["load_misses"] == mid["load_misses"]
    assert a is b and a.id == b.id
    # Other options are another program.
    c = foxc.load(src, log_eps=-8.0)
    assert c.id != a.id


def test_program_metadata():
    attn = foxc.load(EXAMPLES / "fox_qknorm.attn")
    assert attn.params == ["q", "k", "v", "fgate", "wq", "wk"]
    assert attn.name == "fox_qknorm"
    assert "rmsnorm" in attn.source
    assert attn.output == ("bf16", ["B", "H", "T", "D"])
    assert "block_boundary" in attn.ir("opt")
    assert "block_boundary" not in attn.ir("ir")


@pytest.mark.parametrize("example,name,at,value", [
    ("fox_loggate.attn", "logf", (0, 0, 40), -np.inf),
    ("alibi.attn", "slope", (1,), np.inf),
])
def test_the_reference_is_right_on_legal_infinities(example, name, at, value):
    """A hard reset (log f = -inf, declared `in [-inf, 0]`) and an ALiBi slope of inf (declared
    `[0, inf]`): the reference takes the kernels' limits (docs/SEMANTICS.md) instead of NaN
    from -inf - -inf and inf * 0, so it agrees with the CPU backend."""
    attn = foxc.load(EXAMPLES / example, no_prune=True)
    rng = np.random.default_rng()
    x = random_inputs(attn, rng, T=96)
    if name == "logf":
        x[name] = -np.abs(x[name]) * 0.1
    x[name][at] = value
    ref = foxc.reference(attn, **x)
    assert np.isfinite(ref).all()
    assert_close_bf16(attn(**x), ref)


def test_a_source_that_is_not_utf8_is_a_compile_error_with_its_position(tmp_path):
    p = tmp_path / "bad.attn"
    p.write_bytes(b"attention x(q: f32[B]) -> f32[B] {\n  \xff\xfe return q\n}\n")
    with pytest.raises(foxc.CompileError, match=r"(?s)invalid UTF-8.*bad.attn:2:3"):
        foxc.load(p)
    with pytest.raises(foxc.CompileError, match="invalid UTF-8"):
        foxc.load(str(p))


def test_an_int32_start_is_taken_and_compared():
    """`start: i32[B]` (examples/fox_leftpad.attn) takes an int32 array; the pruned CPU run
    matches the interpreter, rows before each start are 0, and a float array for it is refused."""
    attn = foxc.load(EXAMPLES / "fox_leftpad.attn")
    rng = np.random.default_rng()
    x = random_inputs(attn, rng, B=2, T=200)
    x["start"] = np.array([rng.integers(1, 60), rng.integers(60, 190)], dtype=np.int32)
    out = attn(**x)
    assert_close_bf16(out, foxc.reference(attn, pruned=True, **x))
    for b, s in enumerate(x["start"]):
        assert (out[b, :, :s] == 0).all() and np.abs(out[b, :, s:]).max() > 0
    x["start"] = x["start"].astype(np.float32)
    with pytest.raises(ValueError, match="`start` is declared i32"):
        attn(**x)


def test_an_int64_start_reads_as_its_int32_value(tmp_path):
    """`start: i64[B]` takes int64 arrays (NumPy's and torch's default integers), read as i32
    saturating: the same bits as the i32 program; 2^32 + 5 masks every key (it does not wrap
    to 5); the signature says i64; an int32 array for it is refused."""
    # Without the declared range [0, 256]: starts beyond it are the point.
    text = (EXAMPLES / "fox_leftpad.attn").read_text().replace(" in [0, 256]", "")
    wide, narrow = (tmp_path / "leftpad_i64.attn"), (tmp_path / "leftpad_i32.attn")
    wide.write_text(text.replace("start: i32[B]", "start: i64[B]"))
    narrow.write_text(text)
    wide, narrow = foxc.load(wide), foxc.load(narrow)
    assert ("start", "i64", ["B"]) in wide.signature
    rng = np.random.default_rng()
    x = random_inputs(narrow, rng, B=2, T=200)
    x["start"] = np.array([rng.integers(1, 190), 2**31 - 1], dtype=np.int32)
    x64 = dict(x, start=np.array([x["start"][0], 2**32 + 5], dtype=np.int64))
    out = wide(**x64)
    assert (out == narrow(**x)).all()
    assert (out[1] == 0).all() and np.abs(out[0]).max() > 0
    assert_close_bf16(out, foxc.reference(wide, **x64))
    with pytest.raises(ValueError, match="`start` is declared i64"):
        wide(**x)


def test_float16_arrays_run_an_f16_program():
    """bench/fox_f16.attn (f16 q, k, v and output) takes float16 arrays, and float32 ones rounded
    to f16 (the same bits out); the CPU's fused f16 kernels against the interpreter on the same
    inputs; a bf16 program takes float16 arrays as it takes float32 ones (converted)."""
    attn = foxc.load(ROOT / "bench" / "fox_f16.attn")
    assert [t for _, t, _ in attn.signature] == ["f16", "f16", "f16", "f32"]
    rng = np.random.default_rng()
    x32 = random_inputs(attn, rng, B=1, H=3, T=200)
    x16 = {n: (a.astype(np.float16) if n in ("q", "k", "v") else a) for n, a in x32.items()}
    out = attn(**x16)
    assert np.array_equal(out, attn(**x32)), "float32 arrays are rounded to the declared f16"
    ref = foxc.reference(attn, **x16)
    # Both rounded to the f16 output: they differ where f32 and f64 round to different f16
    # neighbours (2^-11 relative), plus f32 accumulation.
    assert rel_l2(out, ref) <= 1e-3, rel_l2(out, ref)
    assert np.abs(out - ref).max() <= 2.0**-10 * np.abs(ref).max()
    bf16 = foxc.load(EXAMPLES / "fox.attn")
    assert np.array_equal(bf16(**x16), bf16(**{n: a.astype(np.float32) for n, a in x16.items()}))
