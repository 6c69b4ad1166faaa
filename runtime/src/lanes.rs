//! Which stream ("lane") each launch of a plan runs on, so that launches that do not depend on
//! each other (the gate scan and the threshold's kernels of a pruned attention, where a pass has
//! not made them one launch) run at the same time, while every launch still starts only after
//! all the launches it depends on.
//!
//! Lane 0 is the caller's stream; the others are the runtime's own. The plan is a fork/join:
//! a lane other than 0 first waits for what the caller enqueued before (the fork), lane 0 waits
//! for every other lane's last launch at the end (the join), so to the caller the whole plan is
//! ordered on its stream like one kernel. Pure bookkeeping here (no driver calls): the CUDA
//! side records an event after each launch in [`Schedule::record_after`] and makes the launch's
//! lane wait for the events of its [`Step::waits`].

/// How many lanes the runtime uses (the caller's stream and one of its own).
pub const LANES: usize = 2;

/// Where one launch runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub lane: usize,
    /// Launches on other lanes this one waits for (their events), besides what its own lane
    /// ran before it.
    pub waits: Vec<usize>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub steps: Vec<Step>,
    /// Launches after which an event is recorded (waited for by a later step or the join).
    pub record_after: Vec<bool>,
    /// The last launch of each lane other than 0 that lane 0 must wait for at the end.
    pub join: Vec<usize>,
}

impl Schedule {
    /// Whether a lane other than the caller's is used (then the plan forks and joins).
    pub fn forks(&self) -> bool {
        self.steps.iter().any(|s| s.lane != 0)
    }
}

/// Places launch `i` (with `deps[i]`, indices of earlier launches) on a lane: one whose last
/// launch it depends on (no wait for unrelated work), else an unused lane, else lane 0; it then
/// waits, on each other lane, for the latest launch it depends on there (directly or through
/// other launches), unless its lane already waited for that one or a later one.
/// `serial`: everything on lane 0 in plan order (no concurrency).
#[allow(clippy::needless_range_loop)] // i indexes several parallel tables
pub fn schedule(deps: &[Vec<usize>], serial: bool) -> Result<Schedule, String> {
    let n = deps.len();
    // ancestors[i][j]: launch i must follow launch j.
    let mut ancestors = vec![vec![false; n]; n];
    for (i, d) in deps.iter().enumerate() {
        for &j in d {
            if j >= i {
                return Err(format!("launch {i} depends on launch {j}, which does not run before it"));
            }
            ancestors[i][j] = true;
            let (before, after) = ancestors.split_at_mut(i);
            for (a, &b) in after[0].iter_mut().zip(&before[j]) {
                *a |= b;
            }
        }
    }
    let mut tail: [Option<usize>; LANES] = [None; LANES];
    // synced[l][m]: the latest launch of lane m that lane l has waited for (or ran, m == l).
    let mut synced = [[None::<usize>; LANES]; LANES];
    let mut steps: Vec<Step> = Vec::with_capacity(n);
    let mut record_after = vec![false; n];
    for i in 0..n {
        let lane = if serial {
            0
        } else {
            (0..LANES)
                .find(|&l| tail[l].is_some_and(|t| ancestors[i][t]))
                .or_else(|| (0..LANES).find(|&l| tail[l].is_none()))
                .unwrap_or(0)
        };
        let mut waits = vec![];
        for other in (0..LANES).filter(|&m| m != lane) {
            let latest = (0..i).rev().find(|&j| ancestors[i][j] && steps[j].lane == other);
            if let Some(j) = latest {
                if synced[lane][other].is_none_or(|s| s < j) {
                    waits.push(j);
                    record_after[j] = true;
                    synced[lane][other] = Some(j);
                }
            }
        }
        tail[lane] = Some(i);
        synced[lane][lane] = Some(i);
        steps.push(Step { lane, waits });
    }
    let mut join = vec![];
    for (m, t) in tail.iter().enumerate().skip(1) {
        if let Some(t) = *t {
            if synced[0][m].is_none_or(|s| s < t) {
                join.push(t);
                record_after[t] = true;
            }
        }
    }
    Ok(Schedule { steps, record_after, join })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether every launch starts after all its dependencies under the schedule: each lane
    /// runs in order, and a wait on launch j covers everything its lane ran up to j.
    fn respects(deps: &[Vec<usize>], s: &Schedule) -> bool {
        // done_before[i]: the launches certainly complete when launch i starts.
        let n = deps.len();
        let mut done: Vec<Vec<bool>> = vec![vec![false; n]; n];
        let mut last_on = [None::<usize>; LANES];
        for i in 0..n {
            let lane = s.steps[i].lane;
            let mut d = vec![false; n];
            let add = |j: usize, d: &mut Vec<bool>| {
                d[j] = true;
                for (x, &y) in d.iter_mut().zip(&done[j]) {
                    *x |= y;
                }
            };
            if let Some(p) = last_on[lane] {
                add(p, &mut d);
            }
            for &w in &s.steps[i].waits {
                if !s.record_after[w] {
                    return false;
                }
                add(w, &mut d);
            }
            if deps[i].iter().any(|&j| !d[j]) {
                return false;
            }
            done[i] = d;
            last_on[lane] = Some(i);
        }
        // The join: lane 0's end follows every launch.
        let mut end = vec![false; n];
        for j in last_on[0].into_iter().chain(s.join.iter().copied()) {
            if j != last_on[0].unwrap_or(usize::MAX) && !s.record_after[j] {
                return false;
            }
            end[j] = true;
            for (x, &y) in end.iter_mut().zip(&done[j]) {
                *x |= y;
            }
        }
        end.iter().all(|&e| e)
    }

    #[test]
    fn fox_runs_the_scan_beside_the_threshold() {
        // gate scan, threshold norms, threshold delta, attention.
        let deps = vec![vec![], vec![], vec![1], vec![0, 2]];
        let s = schedule(&deps, false).unwrap();
        let lanes: Vec<usize> = s.steps.iter().map(|s| s.lane).collect();
        assert_eq!(lanes, [0, 1, 1, 0]);
        assert_eq!(s.steps[3].waits, [2]);
        assert!(s.join.is_empty(), "the attention already waited for lane 1's last launch");
        assert!(respects(&deps, &s));
        let serial = schedule(&deps, true).unwrap();
        assert!(!serial.forks() && respects(&deps, &serial));
    }

    #[test]
    fn a_chain_never_forks() {
        let deps = vec![vec![], vec![0], vec![1], vec![2]];
        let s = schedule(&deps, false).unwrap();
        assert!(!s.forks());
        assert!(s.steps.iter().all(|s| s.waits.is_empty()));
    }

    #[test]
    fn an_unwaited_lane_is_joined() {
        let deps = vec![vec![], vec![], vec![0]];
        let s = schedule(&deps, false).unwrap();
        assert_eq!(s.join, [1]);
        assert!(s.record_after[1]);
    }

    #[test]
    fn a_dependency_on_a_later_launch_is_an_error() {
        assert!(schedule(&[vec![1], vec![]], false).is_err());
    }

    #[test]
    fn random_plans_are_respected() {
        // A small deterministic generator: every plan of up to 9 launches with random deps.
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..2000 {
            let n = (next() % 9) as usize + 1;
            let deps: Vec<Vec<usize>> =
                (0..n).map(|i| (0..i).filter(|_| next() % 3 == 0).collect()).collect();
            let s = schedule(&deps, false).unwrap();
            assert!(respects(&deps, &s), "{deps:?} {s:?}");
        }
    }
}
