//! The threshold kernels' parameters, by name: one struct per kernel, filled in by its
//! signature (names and types), its body (parameter numbers) and the launcher (the arguments);
//! `into_vec` is the one place that knows the order. An optional parameter comes last and is
//! present only in the kernels built with it.

use crate::nvptx::builder::ParamTy;

/// The norms kernel's: q and k, the norms it writes, the norms' rows (the queries', or the
/// keys' when queries are fewer), then the query rows `Tq` when queries are fewer.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct NormsParams<T> {
    pub q: T,
    pub k: T,
    pub norms: T,
    pub rows: T,
    pub tq: Option<T>,
}

impl<T> NormsParams<T> {
    pub fn into_vec(self) -> Vec<T> {
        [self.q, self.k, self.norms, self.rows].into_iter().chain(self.tq).collect()
    }
}

impl NormsParams<u32> {
    /// The parameter numbers of the kernel built with `fewer_queries`.
    pub fn numbers(fewer_queries: bool) -> NormsParams<u32> {
        NormsParams { q: 0, k: 1, norms: 2, rows: 3, tq: fewer_queries.then_some(4) }
    }
}

/// The norms kernel's signature.
pub(crate) fn norms_signature(fewer_queries: bool) -> Vec<(&'static str, ParamTy)> {
    let p = ParamTy::Ptr;
    NormsParams {
        q: ("q", p),
        k: ("k", p),
        norms: ("norms", p),
        rows: ("T", ParamTy::I32),
        tq: fewer_queries.then_some(("Tq", ParamTy::I32)),
    }
    .into_vec()
}

/// The delta kernel's: q, k, the norms it reads, the delta it writes, the query rows `T`, ln of
/// the keys a row may see, then the keys `Tk` when queries are fewer.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct DeltaParams<T> {
    pub q: T,
    pub k: T,
    pub norms: T,
    pub delta: T,
    pub t: T,
    pub ln_t: T,
    pub tk: Option<T>,
}

impl<T> DeltaParams<T> {
    pub fn into_vec(self) -> Vec<T> {
        [self.q, self.k, self.norms, self.delta, self.t, self.ln_t].into_iter().chain(self.tk).collect()
    }
}

impl DeltaParams<u32> {
    /// The parameter numbers of the kernel built with `fewer_queries`.
    pub fn numbers(fewer_queries: bool) -> DeltaParams<u32> {
        DeltaParams { q: 0, k: 1, norms: 2, delta: 3, t: 4, ln_t: 5, tk: fewer_queries.then_some(6) }
    }
}

/// The delta kernel's signature.
pub(crate) fn delta_signature(fewer_queries: bool) -> Vec<(&'static str, ParamTy)> {
    let p = ParamTy::Ptr;
    DeltaParams {
        q: ("q", p),
        k: ("k", p),
        norms: ("norms", p),
        delta: ("delta", p),
        t: ("T", ParamTy::I32),
        ln_t: ("lnT", ParamTy::F32),
        tk: fewer_queries.then_some(("Tk", ParamTy::I32)),
    }
    .into_vec()
}

/// The one-launch threshold's: q, k, the norms and delta, each head's count of blocks done,
/// `T` and `ln T`; with the joint prelude, then the gate and the cumsum `c` its scan writes.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct FusedParams<T> {
    pub q: T,
    pub k: T,
    pub norms: T,
    pub delta: T,
    pub arrived: T,
    pub t: T,
    pub ln_t: T,
    pub scan: Option<GateScan<T>>,
}

/// The joint prelude's gate and the cumsum it scans into.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct GateScan<T> {
    pub gate: T,
    pub c: T,
}

impl<T> FusedParams<T> {
    pub fn into_vec(self) -> Vec<T> {
        let scan = self.scan.into_iter().flat_map(|s| [s.gate, s.c]);
        [self.q, self.k, self.norms, self.delta, self.arrived, self.t, self.ln_t]
            .into_iter()
            .chain(scan)
            .collect()
    }
}

impl FusedParams<u32> {
    /// The parameter numbers of the kernel built with the gate's scan (`scan`) or without.
    pub fn numbers(scan: bool) -> FusedParams<u32> {
        let scan = scan.then_some(GateScan { gate: 7, c: 8 });
        FusedParams { q: 0, k: 1, norms: 2, delta: 3, arrived: 4, t: 5, ln_t: 6, scan }
    }
}

/// The one-launch threshold's signature.
pub(crate) fn fused_signature(scan: bool) -> Vec<(&'static str, ParamTy)> {
    let p = ParamTy::Ptr;
    FusedParams {
        q: ("q", p),
        k: ("k", p),
        norms: ("norms", p),
        delta: ("delta", p),
        arrived: ("arrived", p),
        t: ("T", ParamTy::I32),
        ln_t: ("lnT", ParamTy::F32),
        scan: scan.then_some(GateScan { gate: ("gate", p), c: ("c", p) }),
    }
    .into_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers are the positions `into_vec` gives, with and without the optional
    /// parameters: a field moved in one and not the other fails here.
    #[test]
    fn numbers_are_positions() {
        let positions = |v: Vec<u32>| assert_eq!(v, (0..v.len() as u32).collect::<Vec<_>>());
        for opt in [false, true] {
            positions(NormsParams::numbers(opt).into_vec());
            positions(DeltaParams::numbers(opt).into_vec());
            positions(FusedParams::numbers(opt).into_vec());
            assert_eq!(norms_signature(opt).len(), NormsParams::numbers(opt).into_vec().len());
            assert_eq!(delta_signature(opt).len(), DeltaParams::numbers(opt).into_vec().len());
            assert_eq!(fused_signature(opt).len(), FusedParams::numbers(opt).into_vec().len());
        }
        let names: Vec<&str> = fused_signature(true).iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["q", "k", "norms", "delta", "arrived", "T", "lnT", "gate", "c"]);
    }
}
