//! What `bench` reports of repeated runs, computed one way for every backend.

/// Median, minimum and maximum of run times in ms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// The middle sample; the mean of the two middle ones for an even count.
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
}

/// The summary of `times` (at least one sample; sorted in place).
pub fn summarize(times: &mut [f64]) -> Summary {
    assert!(!times.is_empty(), "no run was timed");
    times.sort_by(f64::total_cmp);
    let n = times.len();
    let median_ms = if n % 2 == 1 { times[n / 2] } else { 0.5 * (times[n / 2 - 1] + times[n / 2]) };
    Summary { median_ms, min_ms: times[0], max_ms: times[n - 1] }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(summarize(&mut [3.0, 1.0, 2.0]), Summary { median_ms: 2.0, min_ms: 1.0, max_ms: 3.0 });
        assert_eq!(
            summarize(&mut [4.0, 1.0, 3.0, 2.0]),
            Summary { median_ms: 2.5, min_ms: 1.0, max_ms: 4.0 }
        );
    }
}
