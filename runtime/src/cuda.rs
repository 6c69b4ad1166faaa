//! A thin CUDA runtime over cudarc's driver API (loaded at run time: a binary built with it
//! starts on machines without CUDA and reports that there is none).
//!
//! It knows nothing of LLVM or of the compiler: a [`Program`] is PTX text plus a list of
//! device buffers and kernel launches with concrete arguments and geometry. The facade builds
//! it from the NVPTX backend's artifact once the dimensions are bound.
//!
//! Every driver call returns a `Result`; every error says what was being done.

use crate::tensor_map::TensorMapArg;
use cudarc::driver::sys;
use cudarc::driver::{result, CudaContext, CudaEvent, CudaStream, DriverError};
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::{Arc, Mutex};

mod graph;
use graph::PlanGraph;
pub use graph::Submission;

/// What went wrong, and whether the user can fix it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CudaErrorKind {
    /// No CUDA driver library on this machine.
    NoDriver,
    /// A driver but no usable GPU.
    NoDevice,
    /// A request the program itself got wrong (unknown kernel, wrong input size).
    Invalid,
    /// The driver reported an error (a launch failure, out of memory, a PTX the driver rejects).
    Driver,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct CudaError {
    pub kind: CudaErrorKind,
    pub message: String,
}

impl CudaError {
    fn new(kind: CudaErrorKind, message: impl Into<String>) -> CudaError {
        CudaError { kind, message: message.into() }
    }
}

/// Adds context to a driver error.
trait Ctx<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T, CudaError>;
}

impl<T> Ctx<T> for Result<T, DriverError> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T, CudaError> {
        self.map_err(|e| {
            let detail = e.error_string().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            CudaError::new(CudaErrorKind::Driver, format!("CUDA error while {}: {e:?} {detail}", what()))
        })
    }
}

/// A kernel argument with its concrete value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ArgDesc {
    /// The device pointer of buffer `n` of the program.
    Buffer(usize),
    I32(i32),
    I64(i64),
    F32(f32),
    /// A TMA tensor map over a buffer of the program, encoded at each launch from the
    /// buffer's pointer and passed by value (128 bytes).
    TensorMap(TensorMapArg),
}

/// One kernel launch.
#[derive(Clone, Debug, PartialEq)]
pub struct LaunchDesc {
    pub kernel: String,
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    /// Dynamic shared memory in bytes.
    pub shared_bytes: u32,
    pub args: Vec<ArgDesc>,
    /// Buffers set to zero (on the stream) right before this launch.
    pub zero_first: Vec<usize>,
    /// The earlier launches (indices into the plan) whose results this one reads: it starts
    /// only after all of them; launches independent of each other may run concurrently.
    pub deps: Vec<usize>,
}

/// The byte poisoned buffers are filled with: 0xFF..FF is a NaN in f32, bf16 and f16.
const POISON: u8 = 0xFF;

/// How a buffer is filled before a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferInit {
    /// Copied from input number `n` of [`Session::upload`].
    Input(usize),
    /// Filled with [`POISON`] bytes (NaN in every float dtype), so an element that no kernel
    /// writes shows up in the output instead of passing as a stale value.
    Poison,
    /// Zeroed: counters that the kernels expect zero at their first launch and leave zero.
    Zero,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferDesc {
    pub bytes: usize,
    pub init: BufferInit,
    /// For error messages.
    pub label: String,
}

/// A complete GPU program: one PTX module, its buffers and its launches in order.
#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    pub ptx: String,
    pub buffers: Vec<BufferDesc>,
    pub launches: Vec<LaunchDesc>,
    /// The buffers read back as the results, in order (several for a gradient program).
    pub outputs: Vec<usize>,
}

/// What the device is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub name: String,
    pub compute_capability: (i32, i32),
    pub multiprocessors: i32,
    pub total_mem: usize,
}

/// Whether a CUDA driver library can be loaded here (no panic when there is none).
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the library by its usual names.
    unsafe { sys::is_culib_present() }
}

/// The context and stream on device 0.
pub struct CudaRuntime {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
}

impl CudaRuntime {
    /// Opens device 0. Without a driver: a [`CudaErrorKind::NoDriver`] error, never a panic.
    pub fn new() -> Result<CudaRuntime, CudaError> {
        if !driver_present() {
            return Err(CudaError::new(
                CudaErrorKind::NoDriver,
                "no CUDA driver found (libcuda.so could not be loaded): the cuda backend needs an NVIDIA GPU and its driver; use --backend cpu",
            ));
        }
        let n = CudaContext::device_count().map_err(|e| {
            CudaError::new(CudaErrorKind::NoDevice, format!("the CUDA driver found no usable GPU ({e:?})"))
        })?;
        if n < 1 {
            return Err(CudaError::new(CudaErrorKind::NoDevice, "the CUDA driver reports no GPU"));
        }
        let ctx = CudaContext::new(0).ctx(|| "creating a context on GPU 0".into())?;
        let stream = ctx.new_stream().ctx(|| "creating a stream".into())?;
        Ok(CudaRuntime { ctx, stream })
    }

    pub fn device_info(&self) -> Result<DeviceInfo, CudaError> {
        device_info(&self.ctx)
    }

    /// Loads the program's PTX, resolves its kernels and allocates its buffers.
    pub fn load(&self, program: &Program) -> Result<Session<'_>, CudaError> {
        self.ctx.bind_to_thread().ctx(|| "binding the context".into())?;
        let module = Module::load(&program.ptx)?;
        let functions = resolve_functions(&module, &program.launches)?;
        let mut buffers = Vec::with_capacity(program.buffers.len());
        for (i, b) in program.buffers.iter().enumerate() {
            buffers.push(
                DeviceBuffer::alloc(b.bytes)
                    .ctx(|| format!("allocating {} bytes for buffer {i} ({})", b.bytes, b.label))?,
            );
        }
        for l in &program.launches {
            for a in &l.args {
                let buffer = match a {
                    ArgDesc::Buffer(n) => Some(*n),
                    ArgDesc::TensorMap(m) => Some(m.buffer),
                    _ => None,
                };
                if let Some(n) = buffer {
                    if n >= buffers.len() {
                        return Err(CudaError::new(
                            CudaErrorKind::Invalid,
                            format!("kernel {} uses buffer {n}, which does not exist", l.kernel),
                        ));
                    }
                }
            }
            if l.zero_first.iter().any(|n| *n >= buffers.len()) {
                return Err(CudaError::new(
                    CudaErrorKind::Invalid,
                    format!("kernel {} zeroes a buffer that does not exist", l.kernel),
                ));
            }
        }
        if let Some(n) = program.outputs.iter().find(|&&n| n >= buffers.len()) {
            return Err(CudaError::new(CudaErrorKind::Invalid, format!("output buffer {n} does not exist")));
        }
        Ok(Session {
            rt: self,
            program: program.clone(),
            _module: module,
            functions,
            buffers,
            lanes: Mutex::new(Lanes::new()),
            graph: Mutex::new(None),
            submission: Submission::from_env(),
        })
    }
}

/// Looks up every kernel the launches name in `module` and allows the dynamic shared memory
/// they ask for.
fn resolve_functions(
    module: &Module,
    launches: &[LaunchDesc],
) -> Result<HashMap<String, sys::CUfunction>, CudaError> {
    let mut functions = HashMap::new();
    for l in launches {
        if functions.contains_key(&l.kernel) {
            continue;
        }
        let c = CString::new(l.kernel.as_str())
            .map_err(|_| CudaError::new(CudaErrorKind::Invalid, format!("bad kernel name {:?}", l.kernel)))?;
        // SAFETY: the module is loaded and outlives the function handles (both kept together).
        let f = unsafe { result::module::get_function(module.0, c) }
            .ctx(|| format!("looking up kernel {} in the PTX module", l.kernel))?;
        if l.shared_bytes > 48 * 1024 {
            // SAFETY: f is a valid function of a loaded module.
            unsafe {
                result::function::set_function_attribute(
                    f,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    l.shared_bytes as i32,
                )
            }
            .ctx(|| format!("allowing {} bytes of dynamic shared memory for {}", l.shared_bytes, l.kernel))?;
        }
        functions.insert(l.kernel.clone(), f);
    }
    Ok(functions)
}

/// How the runtime runs a plan's independent launches at the same time ([`crate::lanes`]): its
/// own streams and events, and the schedule of the last plan it ran (computed once per plan,
/// not on every run).
struct Lanes {
    handles: LaneHandles,
    /// Everything on the caller's stream in plan order (`FOXC_SERIAL_LAUNCHES=1`: to compare).
    serial: bool,
    /// The launches' dependency lists and their schedule.
    plan: Option<(Vec<Vec<usize>>, crate::lanes::Schedule)>,
}

impl Lanes {
    fn new() -> Lanes {
        let serial = std::env::var("FOXC_SERIAL_LAUNCHES").is_ok_and(|v| v == "1");
        Lanes { handles: LaneHandles { streams: vec![], events: vec![] }, serial, plan: None }
    }
}

/// The schedule of `launches`: `cached`'s when it was made for the same dependency lists, else a
/// new one, kept in `cached`.
fn schedule_of<'a>(
    cached: &'a mut Option<(Vec<Vec<usize>>, crate::lanes::Schedule)>,
    launches: &[LaunchDesc],
    serial: bool,
) -> Result<&'a crate::lanes::Schedule, CudaError> {
    let same = cached.as_ref().is_some_and(|(deps, _)| {
        deps.len() == launches.len() && deps.iter().zip(launches).all(|(d, l)| *d == l.deps)
    });
    if !same {
        let deps: Vec<Vec<usize>> = launches.iter().map(|l| l.deps.clone()).collect();
        let plan =
            crate::lanes::schedule(&deps, serial).map_err(|e| CudaError::new(CudaErrorKind::Invalid, e))?;
        *cached = Some((deps, plan));
    }
    cached
        .as_ref()
        .map(|(_, plan)| plan)
        .ok_or_else(|| CudaError::new(CudaErrorKind::Invalid, "no launch schedule"))
}

/// The lanes' streams and events: created on first use, in the context current then, and reused.
struct LaneHandles {
    /// Streams of lanes 1.. (non-blocking: no implicit order with the legacy default stream;
    /// the events order everything).
    streams: Vec<sys::CUstream>,
    events: Vec<sys::CUevent>,
}

// SAFETY: plain driver handles, used only while their context is current and under the Mutex
// that owns them.
unsafe impl Send for LaneHandles {}

impl LaneHandles {
    /// Stream of `lane` (0: the caller's).
    fn stream(&mut self, lane: usize, caller: sys::CUstream) -> Result<sys::CUstream, CudaError> {
        if lane == 0 {
            return Ok(caller);
        }
        while self.streams.len() < lane {
            let s = result::stream::create(result::stream::StreamKind::NonBlocking)
                .ctx(|| "creating a stream for concurrent launches".into())?;
            self.streams.push(s);
        }
        Ok(self.streams[lane - 1])
    }

    /// Event number `n` (created on first use, without timing).
    fn event(&mut self, n: usize) -> Result<sys::CUevent, CudaError> {
        while self.events.len() <= n {
            let e = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                .ctx(|| "creating an event for concurrent launches".into())?;
            self.events.push(e);
        }
        Ok(self.events[n])
    }
}

impl Drop for LaneHandles {
    fn drop(&mut self) {
        // SAFETY: created by this struct and destroyed once; errors at teardown are ignored.
        for &e in &self.events {
            let _ = unsafe { result::event::destroy(e) };
        }
        for &s in &self.streams {
            let _ = unsafe { result::stream::destroy(s) };
        }
    }
}

/// Enqueues `launches` as a fork/join on `stream` and the runtime's other lanes
/// ([`crate::lanes::schedule`]): each launch starts after the launches it depends on; to the
/// caller the whole plan runs in order on `stream`. Buffer `n` of the program is the device
/// memory at `ptrs[n]` of `sizes[n]` bytes.
///
/// # Safety
/// Every pointer must be live device memory of at least its size in the current context, and
/// every launch's arguments must match its kernel's parameters.
unsafe fn enqueue_launches(
    functions: &HashMap<String, sys::CUfunction>,
    launches: &[LaunchDesc],
    ptrs: &[sys::CUdeviceptr],
    sizes: &[usize],
    stream: sys::CUstream,
    lanes: &Mutex<Lanes>,
) -> Result<(), CudaError> {
    let mut guard = lanes.lock().map_err(|_| CudaError::new(CudaErrorKind::Invalid, "lanes poisoned"))?;
    let Lanes { handles: lanes, serial, plan } = &mut *guard;
    let plan = schedule_of(plan, launches, *serial)?;
    // Event 0: the fork (what the caller enqueued before); event 1 + i: after launch i.
    let forks = plan.forks();
    if forks {
        let fork = lanes.event(0)?;
        // SAFETY: a live event and the caller's stream.
        unsafe { result::event::record(fork, stream) }.ctx(|| "recording the fork event".into())?;
    }
    let mut forked = [false; crate::lanes::LANES];
    forked[0] = true;
    for (i, (l, step)) in launches.iter().zip(&plan.steps).enumerate() {
        let s = lanes.stream(step.lane, stream)?;
        if !forked[step.lane] {
            forked[step.lane] = true;
            let fork = lanes.event(0)?;
            // SAFETY: live stream and event.
            unsafe { result::stream::wait_event(s, fork, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT) }
                .ctx(|| "waiting for the fork event".into())?;
        }
        for &w in &step.waits {
            let e = lanes.event(1 + w)?;
            // SAFETY: live stream and event (recorded right after launch w, earlier).
            unsafe { result::stream::wait_event(s, e, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT) }
                .ctx(|| format!("making {} wait for {}", l.kernel, launches[w].kernel))?;
        }
        // SAFETY: forwarded from the caller's contract.
        unsafe { enqueue_one(functions, l, ptrs, sizes, s) }?;
        if plan.record_after[i] {
            let e = lanes.event(1 + i)?;
            // SAFETY: live stream and event.
            unsafe { result::event::record(e, s) }
                .ctx(|| format!("recording an event after {}", l.kernel))?;
        }
    }
    for &j in &plan.join {
        let e = lanes.event(1 + j)?;
        // SAFETY: live stream and event (recorded after launch j above).
        unsafe { result::stream::wait_event(stream, e, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT) }
            .ctx(|| "joining the concurrent launches".into())?;
    }
    Ok(())
}

/// Enqueues one launch (its zeroing first) on `stream`.
///
/// # Safety
/// As [`enqueue_launches`].
unsafe fn enqueue_one(
    functions: &HashMap<String, sys::CUfunction>,
    l: &LaunchDesc,
    ptrs: &[sys::CUdeviceptr],
    sizes: &[usize],
    stream: sys::CUstream,
) -> Result<(), CudaError> {
    let missing = |n: usize, kernel: &str| {
        CudaError::new(
            CudaErrorKind::Invalid,
            format!("kernel {kernel} uses buffer {n}, which does not exist"),
        )
    };
    for &z in &l.zero_first {
        let (p, bytes) = (*ptrs.get(z).ok_or_else(|| missing(z, &l.kernel))?, sizes[z]);
        // SAFETY: within the allocation (the caller's contract), on the given stream.
        unsafe { result::memset_d8_async(p, 0, bytes, stream) }
            .ctx(|| format!("zeroing buffer {z} before {}", l.kernel))?;
    }
    let f = *functions.get(&l.kernel).ok_or_else(|| {
        CudaError::new(CudaErrorKind::Invalid, format!("kernel {} was not loaded", l.kernel))
    })?;
    // Each argument lives in its own 8-byte slot; the driver reads the low bytes
    // (little-endian) for 4-byte arguments. Tensor maps (128 bytes) live in `maps`,
    // filled before any pointer into either vector is taken.
    let mut slots = Vec::with_capacity(l.args.len());
    let mut maps = Vec::new();
    for a in &l.args {
        slots.push(match *a {
            ArgDesc::Buffer(n) => *ptrs.get(n).ok_or_else(|| missing(n, &l.kernel))?,
            ArgDesc::I32(v) => v as u32 as u64,
            ArgDesc::I64(v) => v as u64,
            ArgDesc::F32(v) => v.to_bits() as u64,
            ArgDesc::TensorMap(m) => {
                let p = *ptrs.get(m.buffer).ok_or_else(|| missing(m.buffer, &l.kernel))?;
                let map = m.encode(p).map_err(|e| {
                    CudaError::new(CudaErrorKind::Invalid, format!("kernel {}: {e}", l.kernel))
                })?;
                maps.push(map);
                (maps.len() - 1) as u64
            }
        });
    }
    let mut args: Vec<*mut c_void> = Vec::with_capacity(l.args.len());
    for (a, s) in l.args.iter().zip(slots.iter_mut()) {
        args.push(match a {
            ArgDesc::TensorMap(_) => &mut maps[*s as usize] as *mut sys::CUtensorMap as *mut c_void,
            _ => s as *mut u64 as *mut c_void,
        });
    }
    // SAFETY: f belongs to a loaded module; the argument list matches the kernel's
    // parameters as the backend declared them; the buffers are live (the caller's contract).
    unsafe { result::launch_kernel(f, l.grid, l.block, l.shared_bytes, stream, &mut args) }.ctx(|| {
        format!(
            "launching {} (grid {:?}, block {:?}, {} B shared)",
            l.kernel, l.grid, l.block, l.shared_bytes
        )
    })?;
    Ok(())
}

/// A loaded module (unloaded on drop).
struct Module(sys::CUmodule);

impl Module {
    fn load(ptx: &str) -> Result<Module, CudaError> {
        let src = CString::new(ptx)
            .map_err(|_| CudaError::new(CudaErrorKind::Invalid, "the PTX text holds a NUL byte"))?;
        let mut log = vec![0u8; 16 * 1024];
        let mut opts = [
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        ];
        let mut vals: [*mut c_void; 2] = [log.as_mut_ptr() as *mut c_void, log.len() as *mut c_void];
        let mut m = std::mem::MaybeUninit::uninit();
        // SAFETY: src is NUL-terminated PTX; the option arrays have matching lengths and the log
        // buffer outlives the call.
        let r = unsafe {
            sys::cuModuleLoadDataEx(
                m.as_mut_ptr(),
                src.as_ptr() as *const c_void,
                2,
                opts.as_mut_ptr(),
                vals.as_mut_ptr(),
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]).into_owned();
            return Err(CudaError::new(
                CudaErrorKind::Driver,
                format!("the CUDA driver rejected the PTX module ({r:?}): {}", text.trim()),
            ));
        }
        // SAFETY: the call succeeded, so the module handle is initialized.
        Ok(Module(unsafe { m.assume_init() }))
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: loaded by Module::load and unloaded once; errors at teardown are ignored.
        let _ = unsafe { result::module::unload(self.0) };
    }
}

/// Device memory (freed on drop).
struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    bytes: usize,
}

impl DeviceBuffer {
    fn alloc(bytes: usize) -> Result<DeviceBuffer, DriverError> {
        // Zero-sized tensors still get a valid, distinct pointer.
        let n = bytes.max(16);
        // SAFETY: plain device allocation in the current context.
        let ptr = unsafe { result::malloc_sync(n) }?;
        Ok(DeviceBuffer { ptr, bytes })
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by malloc_sync and freed once.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// A program loaded on the device with its buffers.
pub struct Session<'rt> {
    rt: &'rt CudaRuntime,
    program: Program,
    /// With [`Submission::Graph`]: the plan captured on the first run. Declared before the
    /// module and the buffers so it is destroyed first.
    graph: Mutex<Option<PlanGraph>>,
    submission: Submission,
    _module: Module,
    functions: HashMap<String, sys::CUfunction>,
    buffers: Vec<DeviceBuffer>,
    lanes: Mutex<Lanes>,
}

impl Session<'_> {
    fn stream(&self) -> sys::CUstream {
        self.rt.stream.cu_stream()
    }

    /// Copies the inputs into their buffers, zeroes the counters and poisons every other buffer.
    pub fn upload(&mut self, inputs: &[&[u8]]) -> Result<(), CudaError> {
        for (i, (b, d)) in self.buffers.iter().zip(&self.program.buffers).enumerate() {
            match d.init {
                BufferInit::Input(n) => {
                    let src = inputs.get(n).ok_or_else(|| {
                        CudaError::new(
                            CudaErrorKind::Invalid,
                            format!("input {n} ({}) was not given", d.label),
                        )
                    })?;
                    if src.len() != b.bytes {
                        return Err(CudaError::new(
                            CudaErrorKind::Invalid,
                            format!(
                                "input {} has {} bytes, the program expects {}",
                                d.label,
                                src.len(),
                                b.bytes
                            ),
                        ));
                    }
                    // SAFETY: the buffer holds at least b.bytes bytes.
                    unsafe { result::memcpy_htod_sync(b.ptr, src) }
                        .ctx(|| format!("copying input {} to the GPU", d.label))?;
                }
                BufferInit::Poison => self.fill(i, POISON)?,
                BufferInit::Zero => self.fill(i, 0)?,
            }
        }
        Ok(())
    }

    /// Poisons every buffer that [`Self::upload`] poisons, again, and leaves the inputs and
    /// the counters as the previous run left them: a second run then shows whether the plan
    /// computes everything again from what its kernels leave behind.
    pub fn repoison(&mut self) -> Result<(), CudaError> {
        for i in 0..self.buffers.len() {
            if self.program.buffers[i].init == BufferInit::Poison {
                self.fill(i, POISON)?;
            }
        }
        Ok(())
    }

    /// Sets every byte of buffer `i` to `byte` (synchronously).
    fn fill(&self, i: usize, byte: u8) -> Result<(), CudaError> {
        let (b, d) = (&self.buffers[i], &self.program.buffers[i]);
        // SAFETY: within the allocation.
        unsafe { result::memset_d8_sync(b.ptr, byte, b.bytes) }
            .ctx(|| format!("filling buffer {i} ({}) with {byte:#04x}", d.label))
    }

    /// Enqueues the whole plan on the stream (asynchronous): its launches, or one launch of its
    /// graph ([`Submission`]; captured on the first run).
    pub fn enqueue(&self) -> Result<(), CudaError> {
        if self.submission == Submission::Launches {
            return self.enqueue_launches();
        }
        let g = self.captured()?;
        match g.as_ref() {
            Some(graph) => graph.launch(self.stream()),
            None => Err(CudaError::new(CudaErrorKind::Invalid, "the plan's graph was not captured")),
        }
    }

    /// The plan's graph, captured now if it was not yet (nothing runs on the GPU meanwhile).
    fn captured(&self) -> Result<std::sync::MutexGuard<'_, Option<PlanGraph>>, CudaError> {
        let mut g =
            self.graph.lock().map_err(|_| CudaError::new(CudaErrorKind::Invalid, "graph poisoned"))?;
        if g.is_none() {
            // The lanes' streams and events are made before the capture (none while capturing).
            {
                let mut lanes = self
                    .lanes
                    .lock()
                    .map_err(|_| CudaError::new(CudaErrorKind::Invalid, "lanes poisoned"))?;
                for lane in 1..crate::lanes::LANES {
                    lanes.handles.stream(lane, self.stream())?;
                }
                lanes.handles.event(self.program.launches.len())?;
            }
            *g = Some(PlanGraph::capture(self.stream(), || self.enqueue_launches())?);
        }
        Ok(g)
    }

    /// Enqueues every launch of the plan (the fork/join of [`enqueue_launches`]).
    fn enqueue_launches(&self) -> Result<(), CudaError> {
        let ptrs: Vec<sys::CUdeviceptr> = self.buffers.iter().map(|b| b.ptr).collect();
        let sizes: Vec<usize> = self.buffers.iter().map(|b| b.bytes).collect();
        // SAFETY: every buffer is a live allocation of its size, owned by self.
        unsafe {
            enqueue_launches(
                &self.functions,
                &self.program.launches,
                &ptrs,
                &sizes,
                self.stream(),
                &self.lanes,
            )
        }
    }

    /// Waits for the stream; reports any asynchronous kernel fault.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.rt.stream.synchronize().ctx(|| "running the kernels (a kernel faulted)".into())
    }

    /// Runs the plan once and returns its time in milliseconds: CUDA events around its
    /// submission (the launches, or the graph's one launch). The GPU is idle at the start event,
    /// so with [`Submission::Launches`] the host's submission of each launch can count.
    pub fn timed_run(&self) -> Result<f64, CudaError> {
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start: CudaEvent = self.rt.ctx.new_event(flags).ctx(|| "creating an event".into())?;
        let end: CudaEvent = self.rt.ctx.new_event(flags).ctx(|| "creating an event".into())?;
        if self.submission == Submission::Graph {
            // Captured before the start event: the host's capture is not the plan's time.
            drop(self.captured()?);
        }
        start.record(&self.rt.stream).ctx(|| "recording the start event".into())?;
        self.enqueue()?;
        end.record(&self.rt.stream).ctx(|| "recording the end event".into())?;
        self.synchronize()?;
        let ms = start.elapsed_ms(&end).ctx(|| "reading the event timer".into())?;
        Ok(ms as f64)
    }

    /// Copies buffer `n` back.
    pub fn download(&self, n: usize) -> Result<Vec<u8>, CudaError> {
        let b = self
            .buffers
            .get(n)
            .ok_or_else(|| CudaError::new(CudaErrorKind::Invalid, format!("buffer {n} does not exist")))?;
        self.synchronize()?;
        let mut out = vec![0u8; b.bytes];
        // SAFETY: out has exactly b.bytes bytes.
        unsafe { result::memcpy_dtoh_sync(&mut out, b.ptr) }.ctx(|| format!("copying buffer {n} back"))?;
        Ok(out)
    }

    /// Copies the program's outputs back, in the order of [`Program::outputs`].
    pub fn download_outputs(&self) -> Result<Vec<Vec<u8>>, CudaError> {
        self.program.outputs.iter().map(|&n| self.download(n)).collect()
    }
}

/// A PTX module loaded in the primary context of one device, launched on memory and a stream
/// that the caller owns (a framework such as PyTorch): no allocation, no copy, no host
/// synchronization. Loading happens once; [`ExternalModule::enqueue`] only launches.
pub struct ExternalModule {
    ctx: Arc<CudaContext>,
    module: Module,
    functions: HashMap<String, sys::CUfunction>,
    lanes: Mutex<Lanes>,
}

// SAFETY: a CUmodule and its CUfunctions are plain driver handles, valid in any thread once their
// context is current; every use below makes the module's context current first, and the
// handles are never mutated after loading.
unsafe impl Send for ExternalModule {}
unsafe impl Sync for ExternalModule {}

/// Restores the calling thread's previous current context on drop (the caller's framework may
/// rely on it).
struct ContextGuard(Option<sys::CUcontext>);

impl ContextGuard {
    /// Remembers the thread's current context (initializing the driver first).
    fn save() -> Result<ContextGuard, CudaError> {
        result::init().ctx(|| "initializing the CUDA driver".into())?;
        Ok(ContextGuard(result::ctx::get_current().ctx(|| "reading the current context".into())?))
    }

    /// Remembers the current context and makes `ctx` current.
    fn enter(ctx: &CudaContext) -> Result<ContextGuard, CudaError> {
        let g = ContextGuard::save()?;
        ctx.bind_to_thread().ctx(|| format!("binding the context of GPU {}", ctx.ordinal()))?;
        Ok(g)
    }
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        if let Some(prev) = self.0 {
            // SAFETY: `prev` was current on this thread a moment ago and is still retained by
            // its owner; an error here leaves our context current, which is also valid.
            let _ = unsafe { result::ctx::set_current(prev) };
        }
    }
}

impl ExternalModule {
    /// Loads `ptx` on device `ordinal` (its primary context, the one CUDA runtime users such as
    /// PyTorch share) and resolves the kernels `launches` name.
    pub fn load(ordinal: usize, ptx: &str, launches: &[LaunchDesc]) -> Result<ExternalModule, CudaError> {
        if !driver_present() {
            return Err(CudaError::new(
                CudaErrorKind::NoDriver,
                "no CUDA driver found (libcuda.so could not be loaded)",
            ));
        }
        // CudaContext::new makes the device's context current: restore the caller's after.
        let _guard = ContextGuard::save()?;
        let ctx = CudaContext::new(ordinal).map_err(|e| {
            CudaError::new(CudaErrorKind::NoDevice, format!("cannot open GPU {ordinal}: {e:?}"))
        })?;
        let module = Module::load(ptx)?;
        let functions = resolve_functions(&module, launches)?;
        Ok(ExternalModule { ctx, module, functions, lanes: Mutex::new(Lanes::new()) })
    }

    pub fn device_info(&self) -> Result<DeviceInfo, CudaError> {
        device_info(&self.ctx)
    }

    /// Enqueues `launches` on `stream`; buffer `n` of the plan is the caller's device memory at
    /// `ptrs[n]`, `sizes[n]` bytes. Asynchronous: faults surface at the caller's next sync.
    ///
    /// # Safety
    /// Every pointer must be live memory of at least its size on this module's device, `stream`
    /// a live stream of that device (or null), and `launches` the plan this module's PTX was
    /// compiled with.
    pub unsafe fn enqueue(
        &self,
        launches: &[LaunchDesc],
        ptrs: &[u64],
        sizes: &[usize],
        stream: u64,
    ) -> Result<(), CudaError> {
        if ptrs.len() != sizes.len() {
            return Err(CudaError::new(CudaErrorKind::Invalid, "one size per buffer pointer"));
        }
        let _guard = ContextGuard::enter(&self.ctx)?;
        let _ = &self.module;
        // SAFETY: forwarded from the caller's contract.
        unsafe {
            enqueue_launches(&self.functions, launches, ptrs, sizes, stream as sys::CUstream, &self.lanes)
        }
    }
}

impl Drop for ExternalModule {
    fn drop(&mut self) {
        // The lanes' streams and events go with the module's context current (the caller's
        // thread may have another one current).
        if let Ok(_guard) = ContextGuard::enter(&self.ctx) {
            if let Ok(mut lanes) = self.lanes.lock() {
                drop(std::mem::replace(&mut *lanes, Lanes::new()));
            }
        }
    }
}

fn device_info(ctx: &CudaContext) -> Result<DeviceInfo, CudaError> {
    let name = ctx.name().ctx(|| "reading the device name".into())?;
    let compute_capability = ctx.compute_capability().ctx(|| "reading the compute capability".into())?;
    let multiprocessors = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .ctx(|| "reading the multiprocessor count".into())?;
    let total_mem = ctx.total_mem().ctx(|| "reading the memory size".into())?;
    Ok(DeviceInfo { name, compute_capability, multiprocessors, total_mem })
}

/// What device `ordinal` is (its compute capability picks the kernels' target).
pub fn device_info_of(ordinal: usize) -> Result<DeviceInfo, CudaError> {
    if !driver_present() {
        return Err(CudaError::new(
            CudaErrorKind::NoDriver,
            "no CUDA driver found (libcuda.so could not be loaded)",
        ));
    }
    let _guard = ContextGuard::save()?;
    let ctx = CudaContext::new(ordinal)
        .map_err(|e| CudaError::new(CudaErrorKind::NoDevice, format!("cannot open GPU {ordinal}: {e:?}")))?;
    device_info(&ctx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_driver_is_an_error_not_a_panic() {
        match CudaRuntime::new() {
            Ok(rt) => {
                // A machine with a GPU: the device answers.
                assert!(rt.device_info().is_ok());
            }
            Err(e) => {
                assert!(matches!(
                    e.kind,
                    CudaErrorKind::NoDriver | CudaErrorKind::NoDevice | CudaErrorKind::Driver
                ));
                if !driver_present() {
                    assert!(e.message.contains("no CUDA driver found"), "{e}");
                }
            }
        }
    }

    fn launch(deps: Vec<usize>) -> LaunchDesc {
        LaunchDesc {
            kernel: "k".into(),
            grid: (1, 1, 1),
            block: (32, 1, 1),
            shared_bytes: 0,
            args: vec![],
            zero_first: vec![],
            deps,
        }
    }

    #[test]
    fn the_schedule_is_made_once_per_plan() {
        let fox = [launch(vec![]), launch(vec![]), launch(vec![1]), launch(vec![0, 2])];
        let mut cached = None;
        let first = schedule_of(&mut cached, &fox, false).unwrap().clone();
        assert!(first.forks());
        // A stale entry for the same dependency lists would be kept: mark it to see that it is.
        if let Some((_, plan)) = cached.as_mut() {
            plan.join.push(99);
        }
        assert_eq!(schedule_of(&mut cached, &fox, false).unwrap().join, [99]);
        // Another plan replaces it.
        let chain = [launch(vec![]), launch(vec![0])];
        let other = schedule_of(&mut cached, &chain, false).unwrap();
        assert!(!other.forks() && other.join.is_empty());
        assert_eq!(schedule_of(&mut cached, &fox, false).unwrap(), &first);
    }
}
