//! The CPU executor: runs JIT-compiled kernels (entry points handed over as raw addresses, so
//! that this crate never links a compiler) over host tensors.
//!
//! Kernel ABI (mirrors `foxc_codegen::cpu::abi`; change both together and bump [`ABI_VERSION`]):
//!
//! ```text
//! extern "C" fn(args: *const u64, task_begin: u64, task_end: u64, scratch: *mut u8)
//! ```
//! `args[k]` is the address of the launch's `k`-th operand buffer, `args[n + r]` the address of
//! its `r`-th result buffer (dense row-major buffers of the plan's dtypes and shapes), and,
//! when `temp_bytes > 0`, the next slot a buffer shared by the launch's tasks. A kernel runs
//! tasks `task_begin..task_end`; distinct tasks write disjoint results (and disjoint parts of
//! the shared buffer), so any partition of the tasks over threads gives the same bits; a
//! `finish` entry, if any, then runs once (tasks `0..1`, one thread) with the same arguments.
//! Scalars folded into a kernel have no buffer; their slots hold 0. `scratch` is private to
//! the calling thread, 64-byte aligned, at least `scratch_bytes` long, with arbitrary contents.
//!
//! The executor reads no IR: a [`CpuPlan`] (built by the driver from the compiled program) names
//! every buffer with its dtype and concrete shape, which input tensor fills it or that a launch
//! writes it, and each launch's operand and result buffers.

use crate::tensor::{HostTensor, TensorMap};
use foxc_ir::DType;
use std::sync::atomic::{AtomicU64, Ordering};

pub const ABI_VERSION: u32 = 2;
pub const SCRATCH_ALIGN: usize = 64;

/// The Rust type of a kernel entry point.
pub type KernelFn = unsafe extern "C" fn(args: *const u64, task_begin: u64, task_end: u64, scratch: *mut u8);

/// A program ready to run: its buffers and its launches, in order.
#[derive(Clone, Debug, Default)]
pub struct CpuPlan {
    pub buffers: Vec<BufferDesc>,
    pub launches: Vec<Launch>,
}

/// A buffer of a plan, sized for the dims the program was compiled for.
#[derive(Clone, Debug, PartialEq)]
pub struct BufferDesc {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub role: BufferRole,
}

/// Where a buffer's contents come from.
#[derive(Clone, Debug, PartialEq)]
pub enum BufferRole {
    /// The input tensor `name`, used in place; `declared` is its declared type as the program
    /// prints it (for messages).
    Input { name: String, declared: String },
    /// Written by a launch (allocated before it, freed after its last reader).
    Computed,
}

/// One kernel to run.
#[derive(Clone, Debug)]
pub struct Launch {
    /// What the kernel computes, for messages and `FOXC_CPU_PROFILE` (e.g. `12 (attention)`).
    pub label: String,
    /// The buffers the kernel reads, in `args` order; `None`: a rank-0 value folded into the
    /// kernel (slot 0, never read).
    pub operands: Vec<Option<usize>>,
    /// The buffers the kernel writes, in `args` order after the operands.
    pub results: Vec<usize>,
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
    /// The plan is inconsistent (a foxc bug).
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

impl BufferDesc {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn bytes(&self) -> usize {
        self.numel() * self.dtype.size_bytes()
    }
}

/// Check that `inputs` holds the tensor of every input buffer of `plan`, with its dtype and
/// shape.
pub fn check_inputs(plan: &CpuPlan, inputs: &TensorMap) -> Result<(), ExecError> {
    for b in &plan.buffers {
        let BufferRole::Input { name, declared } = &b.role else { continue };
        let t = inputs.get(name).ok_or_else(|| ExecError::Input(format!("missing input tensor `{name}`")))?;
        if t.dtype != b.dtype || t.shape != b.shape {
            return Err(ExecError::Input(format!(
                "input tensor `{name}` is {}{:?}, expected {}{:?} ({declared})",
                t.dtype, t.shape, b.dtype, b.shape
            )));
        }
        if t.data.len() != t.numel() * t.dtype.size_bytes() {
            return Err(ExecError::Input(format!(
                "input tensor `{name}` holds {} bytes, expected {}",
                t.data.len(),
                t.numel() * t.dtype.size_bytes()
            )));
        }
    }
    Ok(())
}

/// How [`execute`] runs a plan.
#[derive(Clone, Copy, Debug)]
pub struct ExecOptions {
    pub threads: usize,
    /// Fill every result buffer, shared buffer and per-thread scratch with NaN bits (0xff
    /// bytes) before its kernel runs, so that an element a kernel forgets to write (or a
    /// scratch value it reads before writing) shows up (tests); otherwise they start zeroed.
    pub poison: bool,
}

/// A zero- or NaN-filled (`poison`) buffer of `bytes` bytes, 8-byte aligned.
fn new_buf(bytes: usize, poison: bool) -> Buf {
    let fill = if poison { u64::MAX } else { 0 };
    Buf { words: vec![fill; bytes.div_ceil(8).max(1)], bytes }
}

/// Run the launches of `plan` in order and return the buffers `outputs`, in order (an input
/// buffer is returned as given). A computed buffer is freed after the last launch that reads
/// it unless it is an output.
///
/// # Safety
/// Every `entry` must be a live kernel that follows the ABI above and was compiled for exactly
/// the buffers of `plan` (their dtypes and shapes).
pub unsafe fn execute(
    plan: &CpuPlan,
    inputs: &TensorMap,
    outputs: &[usize],
    opts: ExecOptions,
) -> Result<Vec<HostTensor>, ExecError> {
    check_inputs(plan, inputs)?;
    let desc = |i: usize| {
        plan.buffers.get(i).ok_or_else(|| ExecError::Internal(format!("buffer {i} is not in the plan")))
    };
    for &o in outputs {
        desc(o)?;
    }
    // Remaining reads of each buffer: a computed one is dropped when its count reaches zero.
    let mut reads = vec![0usize; plan.buffers.len()];
    for l in &plan.launches {
        for &o in l.operands.iter().flatten() {
            desc(o)?;
            reads[o] += 1;
        }
    }
    let keep: std::collections::HashSet<usize> = outputs.iter().copied().collect();
    let mut addr: Vec<Option<u64>> = plan
        .buffers
        .iter()
        .map(|b| match &b.role {
            BufferRole::Input { name, .. } => Some(inputs[name].data.as_ptr() as u64),
            BufferRole::Computed => None,
        })
        .collect();
    let mut bufs: Vec<Option<Buf>> = plan.buffers.iter().map(|_| None).collect();
    for l in &plan.launches {
        let mut args: Vec<u64> = vec![];
        for &o in &l.operands {
            match o {
                None => args.push(0),
                Some(o) => args.push(addr[o].ok_or_else(|| {
                    ExecError::Internal(format!(
                        "operand buffer {o} of {} is not computed before use",
                        l.label
                    ))
                })?),
            }
        }
        for &r in &l.results {
            let d = desc(r)?;
            if d.role != BufferRole::Computed {
                return Err(ExecError::Internal(format!("{} writes input buffer {r}", l.label)));
            }
            let mut b = new_buf(d.bytes(), opts.poison);
            args.push(b.words.as_mut_ptr() as u64);
            addr[r] = Some(b.words.as_ptr() as u64);
            bufs[r] = Some(b);
        }
        let mut temp = (l.temp_bytes > 0).then(|| new_buf(l.temp_bytes, opts.poison));
        if let Some(t) = temp.as_mut() {
            args.push(t.words.as_mut_ptr() as u64);
        }
        let t0 = std::time::Instant::now();
        run_parallel(l, &args, opts.threads, opts.poison);
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
                "cpu kernel {}: {:.3} ms, {} tasks",
                l.label,
                t0.elapsed().as_secs_f64() * 1e3,
                l.tasks
            );
        }
        for &o in l.operands.iter().flatten() {
            reads[o] -= 1;
            if reads[o] == 0 && !keep.contains(&o) && bufs[o].is_some() {
                bufs[o] = None;
                addr[o] = None;
            }
        }
    }
    let mut res = vec![];
    for &o in outputs {
        let d = &plan.buffers[o];
        if let BufferRole::Input { name, .. } = &d.role {
            res.push(inputs[name].clone());
            continue;
        }
        let b = bufs[o]
            .as_ref()
            .ok_or_else(|| ExecError::Internal(format!("output buffer {o} is not computed by a kernel")))?;
        // SAFETY: `words` holds at least `bytes` initialized bytes; u8 has no alignment needs.
        let data: Vec<u8> =
            unsafe { std::slice::from_raw_parts(b.words.as_ptr() as *const u8, b.bytes) }.to_vec();
        res.push(HostTensor { dtype: d.dtype, shape: d.shape.clone(), data });
    }
    Ok(res)
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
