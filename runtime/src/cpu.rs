//! The CPU executor: runs JIT-compiled kernels (entry points handed over as raw addresses, so
//! that this crate never links a compiler) over host tensors.
//!
//! Kernel ABI (mirrors `foxc_codegen::cpu::abi`; change both together and bump [`ABI_VERSION`]):
//!
//! ```text
//! extern "C" fn(args: *const u64, task_begin: u64, task_end: u64, scratch: *mut u8)
//! ```
//! `args[k]` is the address of the `k`-th value of the launch's `operands` (the node's operands,
//! or what the compiler chose to read instead), `args[n + r]` the address of the `r`-th entry
//! of its `results` (dense row-major buffers of the values' dtypes and concrete shapes), and,
//! when `temp_bytes > 0`, the next slot a buffer shared by the launch's tasks. A kernel runs
//! tasks `task_begin..task_end`; distinct tasks write disjoint results (and disjoint parts of
//! the shared buffer), so any partition of the tasks over threads gives the same bits; a
//! `finish` entry, if any, then runs once (tasks `0..1`, one thread) with the same arguments.
//! Scalars folded into a kernel have no buffer; their slots hold 0. `scratch` is private to
//! the calling thread, 64-byte aligned, at least `scratch_bytes` long, with arbitrary contents.

use crate::tensor::{HostTensor, TensorMap};
use foxc_ir::{Graph, Value, ValueId};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

pub const ABI_VERSION: u32 = 2;
pub const SCRATCH_ALIGN: usize = 64;

/// The Rust type of a kernel entry point.
pub type KernelFn = unsafe extern "C" fn(args: *const u64, task_begin: u64, task_end: u64, scratch: *mut u8);

/// One kernel to run: it computes results of node `node` of the graph.
#[derive(Clone, Debug)]
pub struct Launch {
    pub node: ValueId,
    /// The values whose buffers the kernel reads, in `args` order. Each is a parameter, a value
    /// an earlier launch computed, or a rank-0 value folded into the kernel (slot 0).
    pub operands: Vec<Value>,
    /// The results of `node` the kernel writes, one buffer each, in `args` order after the
    /// operands (`[0]` for a single-result op).
    pub results: Vec<u32>,
    /// A [`KernelFn`].
    pub entry: *const u8,
    pub tasks: u64,
    /// Tasks taken per grab of the shared counter.
    pub chunk: u64,
    pub scratch_bytes: usize,
    /// Bytes of a buffer shared by the launch's tasks (0: none); poisoned like the results.
    pub temp_bytes: usize,
    /// A [`KernelFn`] run once after every task (tasks `0..1`), e.g. to add per-task partial
    /// sums in task order.
    pub finish: Option<*const u8>,
}

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// An input tensor is missing or has the wrong dtype or shape.
    #[error("{0}")]
    Input(String),
    /// The launches do not fit the graph (a foxc bug).
    #[error("cpu executor: {0}")]
    Internal(String),
}

/// Element storage, 8-byte aligned.
struct Buf {
    words: Vec<u64>,
    bytes: usize,
}

/// Threads to use: all cores.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// Concrete shape of a value.
pub fn value_shape(g: &Graph, id: ValueId, dims: &BTreeMap<String, u64>) -> Result<Vec<usize>, ExecError> {
    ty_shape(g.ty(id), dims)
}

/// Check that `inputs` holds every parameter of `g` with its dtype and concrete shape.
pub fn check_params(g: &Graph, dims: &BTreeMap<String, u64>, inputs: &TensorMap) -> Result<(), ExecError> {
    for p in &g.params {
        let t = inputs
            .get(&p.name)
            .ok_or_else(|| ExecError::Input(format!("missing input tensor `{}`", p.name)))?;
        let want = value_shape(g, p.node, dims)?;
        if t.dtype != p.ty.dtype || t.shape != want {
            return Err(ExecError::Input(format!(
                "input tensor `{}` is {}{:?}, expected {}{:?} ({})",
                p.name, t.dtype, t.shape, p.ty.dtype, want, p.ty
            )));
        }
        if t.data.len() != t.numel() * t.dtype.size_bytes() {
            return Err(ExecError::Input(format!(
                "input tensor `{}` holds {} bytes, expected {}",
                p.name,
                t.data.len(),
                t.numel() * t.dtype.size_bytes()
            )));
        }
    }
    Ok(())
}

/// How [`execute_with`] runs a program.
#[derive(Clone, Copy, Debug)]
pub struct ExecOptions {
    pub threads: usize,
    /// Fill every result buffer, shared buffer and per-thread scratch with NaN bits (0xff
    /// bytes) before its kernel runs, so that an element a kernel forgets to write (or a
    /// scratch value it reads before writing) shows up (tests); otherwise they start zeroed.
    pub poison: bool,
}

/// Run `launches` (topological order) of a program compiled for `g` and `dims` on `threads`
/// threads and return the graph's output.
///
/// # Safety
/// Every `entry` must be a live kernel that follows the ABI above and was compiled for exactly
/// this graph and these dims (the executor sizes the buffers from them).
pub unsafe fn execute(
    g: &Graph,
    dims: &BTreeMap<String, u64>,
    launches: &[Launch],
    inputs: &TensorMap,
    threads: usize,
) -> Result<HostTensor, ExecError> {
    execute_with(g, dims, launches, inputs, ExecOptions { threads, poison: false })
}

/// [`execute`] with options: the graph's output.
///
/// # Safety
/// As [`execute`].
pub unsafe fn execute_with(
    g: &Graph,
    dims: &BTreeMap<String, u64>,
    launches: &[Launch],
    inputs: &TensorMap,
    opts: ExecOptions,
) -> Result<HostTensor, ExecError> {
    let out = g.output.ok_or_else(|| ExecError::Internal("graph has no output".into()))?;
    let mut r = execute_outputs(g, dims, launches, inputs, &[Value::of(out)], opts)?;
    r.pop().ok_or_else(|| ExecError::Internal("no output".into()))
}

/// A zero- or NaN-filled (`poison`) buffer of `bytes` bytes, 8-byte aligned.
fn new_buf(bytes: usize, poison: bool) -> Buf {
    let fill = if poison { u64::MAX } else { 0 };
    Buf { words: vec![fill; bytes.div_ceil(8).max(1)], bytes }
}

/// Run `launches` and return the values `outputs`, in order (a parameter is returned as
/// given). A buffer is freed after the last launch that reads it unless it is an output.
///
/// # Safety
/// As [`execute`].
pub unsafe fn execute_outputs(
    g: &Graph,
    dims: &BTreeMap<String, u64>,
    launches: &[Launch],
    inputs: &TensorMap,
    outputs: &[Value],
    opts: ExecOptions,
) -> Result<Vec<HostTensor>, ExecError> {
    let threads = opts.threads;
    check_params(g, dims, inputs)?;
    let keep: std::collections::HashSet<Value> = outputs.iter().copied().collect();
    // Remaining reads of each value: a buffer is dropped when its count reaches zero.
    let mut reads: HashMap<Value, usize> = HashMap::new();
    for l in launches {
        for &o in &l.operands {
            *reads.entry(o).or_default() += 1;
        }
    }
    let mut addr: HashMap<Value, u64> = HashMap::new();
    for p in &g.params {
        addr.insert(Value::of(p.node), inputs[&p.name].data.as_ptr() as u64);
    }
    let mut bufs: HashMap<Value, Buf> = HashMap::new();
    for l in launches {
        let mut args: Vec<u64> = vec![];
        for &o in &l.operands {
            // A scalar the compiler folded into the kernel has no buffer (ABI: slot 0, never read).
            match addr.get(&o) {
                Some(a) => args.push(*a),
                None if o.result == 0 && g.ty(o.node).rank() == 0 => args.push(0),
                None => {
                    return Err(ExecError::Internal(format!(
                        "operand {}#{} of {} is not computed before use",
                        o.node.index(),
                        o.result,
                        g.op(l.node).mnemonic()
                    )))
                }
            }
        }
        for &r in &l.results {
            let v = Value { node: l.node, result: r };
            let ty = g
                .result_ty(l.node, r)
                .ok_or_else(|| ExecError::Internal(format!("node {} has no result {r}", l.node.index())))?;
            let shape = ty_shape(ty, dims)?;
            let mut b = new_buf(shape.iter().product::<usize>() * ty.dtype.size_bytes(), opts.poison);
            args.push(b.words.as_mut_ptr() as u64);
            addr.insert(v, b.words.as_ptr() as u64);
            bufs.insert(v, b);
        }
        let mut temp = (l.temp_bytes > 0).then(|| new_buf(l.temp_bytes, opts.poison));
        if let Some(t) = temp.as_mut() {
            args.push(t.words.as_mut_ptr() as u64);
        }
        let t0 = std::time::Instant::now();
        run_parallel(l, &args, threads, opts.poison);
        if let Some(f) = l.finish {
            let mut scratch = vec![if opts.poison { 0xff } else { 0 }; l.scratch_bytes + SCRATCH_ALIGN];
            let off = scratch.as_ptr().align_offset(SCRATCH_ALIGN);
            let f: KernelFn = std::mem::transmute::<*const u8, KernelFn>(f);
            f(args.as_ptr(), 0, 1, scratch.as_mut_ptr().wrapping_add(off));
        }
        drop(temp);
        // FOXC_CPU_PROFILE=1 prints the wall time of every kernel launch to stderr.
        if std::env::var_os("FOXC_CPU_PROFILE").is_some() {
            eprintln!(
                "cpu kernel {} ({}): {:.3} ms, {} tasks",
                l.node.index(),
                g.op(l.node).mnemonic(),
                t0.elapsed().as_secs_f64() * 1e3,
                l.tasks
            );
        }
        for o in &l.operands {
            if let Some(c) = reads.get_mut(o) {
                *c -= 1;
                if *c == 0 && !keep.contains(o) {
                    bufs.remove(o);
                    addr.remove(o);
                }
            }
        }
    }
    let mut res = vec![];
    for &o in outputs {
        let ty = g.result_ty(o.node, o.result).ok_or_else(|| {
            ExecError::Internal(format!("node {} has no result {}", o.node.index(), o.result))
        })?;
        if let Some(p) = g.params.iter().find(|p| Value::of(p.node) == o) {
            res.push(inputs[&p.name].clone());
            continue;
        }
        let b = bufs.get(&o).ok_or_else(|| {
            ExecError::Internal(format!("output {}#{} is not computed by a kernel", o.node.index(), o.result))
        })?;
        // SAFETY: `words` holds at least `bytes` initialized bytes; u8 has no alignment needs.
        let data: Vec<u8> =
            unsafe { std::slice::from_raw_parts(b.words.as_ptr() as *const u8, b.bytes) }.to_vec();
        res.push(HostTensor { dtype: ty.dtype, shape: ty_shape(ty, dims)?, data });
    }
    Ok(res)
}

fn ty_shape(ty: &foxc_ir::ValueType, dims: &BTreeMap<String, u64>) -> Result<Vec<usize>, ExecError> {
    ty.dims()
        .map(|d| {
            d.eval(&|s| dims.get(s).copied())
                .map(|x| x as usize)
                .ok_or_else(|| ExecError::Input(format!("dimension `{d}` is not bound to a size")))
        })
        .collect()
}

/// Run one kernel over its task space: workers take `chunk` tasks at a time from a shared counter.
unsafe fn run_parallel(l: &Launch, args: &[u64], threads: usize, poison: bool) {
    let f: KernelFn = std::mem::transmute::<*const u8, KernelFn>(l.entry);
    let counter = AtomicU64::new(0);
    let chunk = l.chunk.max(1);
    let args_addr = args.as_ptr() as usize;
    let (tasks, scratch_bytes) = (l.tasks, l.scratch_bytes);
    let work = || {
        let mut scratch = vec![if poison { 0xffu8 } else { 0 }; scratch_bytes + SCRATCH_ALIGN];
        let off = scratch.as_ptr().align_offset(SCRATCH_ALIGN);
        let sp = scratch.as_mut_ptr().wrapping_add(off);
        loop {
            let s = counter.fetch_add(chunk, Ordering::Relaxed);
            if s >= tasks {
                break;
            }
            let e = (s + chunk).min(tasks);
            // SAFETY: the caller of `execute` vouches for the kernel; args outlive the scope.
            unsafe { f(args_addr as *const u64, s, e, sp) };
        }
    };
    let nthreads = threads.max(1).min(l.tasks.div_ceil(chunk) as usize);
    if nthreads <= 1 {
        work();
        return;
    }
    std::thread::scope(|sc| {
        for _ in 1..nthreads {
            sc.spawn(work);
        }
        work();
    });
}
