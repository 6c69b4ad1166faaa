//! The host memory budget of allocations that grow with the problem size. An allocation the
//! system refuses aborts a Rust process ("memory allocation of N bytes failed"); what a user's
//! shape asks for is checked here first, against what the system says it can give, and such
//! buffers are reserved fallibly, so too large a shape is an error message, not an abort.

/// Bytes the system can give this process now without swapping: Linux's `MemAvailable`
/// (/proc/meminfo). `None` where it cannot be read (other systems): then only the fallible
/// reservations guard.
pub fn available_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// `need` bytes fit the budget (what [`available_bytes`] says, when it says anything).
pub fn fits(need: u64) -> Result<(), OverBudget> {
    match available_bytes() {
        Some(available) if need > available => Err(OverBudget { need, available }),
        _ => Ok(()),
    }
}

/// A vector of `n` elements made by `f`, its storage reserved fallibly.
pub fn try_collect<T>(n: usize, f: impl FnMut(usize) -> T) -> Result<Vec<T>, OverBudget> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| OverBudget {
        need: (n as u64).saturating_mul(std::mem::size_of::<T>() as u64),
        available: available_bytes().unwrap_or(0),
    })?;
    v.extend((0..n).map(f));
    Ok(v)
}

#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("{} of host memory needed, more than the {} available", gib(*.need), gib(*.available))]
pub struct OverBudget {
    pub need: u64,
    pub available: u64,
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_beyond_the_machine_is_refused() {
        if let Some(a) = available_bytes() {
            assert!(a > 0);
            let e = fits(a.saturating_mul(4)).unwrap_err();
            assert!(e.to_string().contains("GiB"), "{e}");
            assert!(fits(1 << 20).is_ok());
        }
    }

    #[test]
    fn an_impossible_reservation_is_an_error() {
        assert!(try_collect::<u64>(usize::MAX / 4, |i| i as u64).is_err());
        assert_eq!(try_collect(3, |i| i * 2).unwrap(), vec![0, 2, 4]);
    }
}
