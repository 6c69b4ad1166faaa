//! Every program compiled in this process, once per (source, options): a second `foxc.load` of
//! the same text and options returns the same program (a cache hit), and the torch op names a
//! program by its index here (an int argument is what a custom op can carry through
//! `torch.compile`).

use crate::program::Loaded;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// What makes two loads the same program.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    pub name: String,
    pub source: Vec<u8>,
    pub prune: bool,
    pub log_eps_bits: u64,
    pub rule: String,
    pub tiles: Option<(u32, u32)>,
    /// The promised `(q_max, k_max)` norm bounds, as bits.
    pub norm_bounds: Option<(u64, u64)>,
}

#[derive(Default)]
struct Registry {
    programs: Vec<Arc<Loaded>>,
    by_key: HashMap<Key, usize>,
}

fn registry() -> &'static Mutex<Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(Default::default)
}

pub static LOAD_HITS: AtomicU64 = AtomicU64::new(0);
pub static LOAD_MISSES: AtomicU64 = AtomicU64::new(0);
/// GPU kernel builds (NVPTX compile + module load), and reuses of a built one.
pub static KERNEL_BUILDS: AtomicU64 = AtomicU64::new(0);
pub static KERNEL_HITS: AtomicU64 = AtomicU64::new(0);

/// The program for `key`, compiled by `make` on a miss (outside the lock: compiling is slow;
/// two racing first loads may both compile, the first to finish is kept).
pub fn get_or_insert(key: Key, make: impl FnOnce(usize) -> PyResult<Loaded>) -> PyResult<Arc<Loaded>> {
    {
        let r = registry().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&i) = r.by_key.get(&key) {
            LOAD_HITS.fetch_add(1, Ordering::Relaxed);
            return Ok(r.programs[i].clone());
        }
    }
    let next = registry().lock().unwrap_or_else(|e| e.into_inner()).programs.len();
    let loaded = make(next)?;
    let mut r = registry().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&i) = r.by_key.get(&key) {
        LOAD_HITS.fetch_add(1, Ordering::Relaxed);
        return Ok(r.programs[i].clone());
    }
    LOAD_MISSES.fetch_add(1, Ordering::Relaxed);
    let id = r.programs.len();
    let loaded = Arc::new(Loaded { id, ..loaded });
    r.programs.push(loaded.clone());
    r.by_key.insert(key, id);
    Ok(loaded)
}

pub fn get(id: usize) -> Option<Arc<Loaded>> {
    registry().lock().unwrap_or_else(|e| e.into_inner()).programs.get(id).cloned()
}

/// The program registered under `id` (what the torch op's int argument names).
#[pyfunction]
pub fn by_id(id: usize) -> PyResult<crate::program::Program> {
    get(id)
        .map(|inner| crate::program::Program { inner })
        .ok_or_else(|| crate::errors::value_error(format!("no foxc program has id {id} in this process")))
}

/// Counters of the caches: program loads (hits, misses), GPU kernel builds and reuses, and
/// how many programs are registered.
#[pyfunction]
pub fn cache_info(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("load_hits", LOAD_HITS.load(Ordering::Relaxed))?;
    d.set_item("load_misses", LOAD_MISSES.load(Ordering::Relaxed))?;
    d.set_item("kernel_builds", KERNEL_BUILDS.load(Ordering::Relaxed))?;
    d.set_item("kernel_hits", KERNEL_HITS.load(Ordering::Relaxed))?;
    d.set_item("programs", registry().lock().unwrap_or_else(|e| e.into_inner()).programs.len())?;
    Ok(d)
}
