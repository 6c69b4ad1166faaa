//! The fixed parameters of the attention kernels, by name.
//!
//! Each kernel's list is one struct with a field per parameter. The kernel's signature (names
//! and types), its body (parameter numbers, [`FWD`], [`DQ`], [`DKV`]) and the launcher (the
//! arguments) each fill one in, and [`FwdParams::into_vec`] (and its siblings) is the one place
//! that knows the order.

use crate::nvptx::builder::ParamTy;

/// The forward kernels' fixed parameters (the standard and the warp-specialized kernel alike);
/// the score region's own follow from [`FIRST_FWD_PARAM`] on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FwdParams<T> {
    pub q: T,
    pub k: T,
    pub v: T,
    /// The gate cumsum (not read without decay).
    pub c: T,
    /// The threshold per query tile (not read unless the kernel searches its start tiles).
    pub delta: T,
    pub out: T,
    pub lse: T,
    /// The sequence length.
    pub t: T,
}

impl<T> FwdParams<T> {
    pub fn into_vec(self) -> Vec<T> {
        vec![self.q, self.k, self.v, self.c, self.delta, self.out, self.lse, self.t]
    }
}

/// The forward kernels' parameter numbers.
pub(crate) const FWD: FwdParams<u32> = FwdParams { q: 0, k: 1, v: 2, c: 3, delta: 4, out: 5, lse: 6, t: 7 };

/// The forward's first parameter after the fixed ones.
pub(crate) const FIRST_FWD_PARAM: u32 = 8;

/// The forward kernels' signature.
pub(crate) fn fwd_signature() -> Vec<(&'static str, ParamTy)> {
    let p = ParamTy::Ptr;
    FwdParams {
        q: ("q", p),
        k: ("k", p),
        v: ("v", p),
        c: ("c", p),
        delta: ("delta", p),
        out: ("out", p),
        lse: ("lse", p),
        t: ("T", ParamTy::I32),
    }
    .into_vec()
}

/// The backward's dq kernel's fixed parameters; the regions' own follow (as the dkv kernel's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DqParams<T> {
    pub q: T,
    pub k: T,
    pub v: T,
    pub c: T,
    pub delta: T,
    pub dout: T,
    pub lse: T,
    /// `D = rowsum(dout * out)`.
    pub dd: T,
    pub dq: T,
    pub dc: T,
    /// Written: the first kept key tile per query tile (pruned only), for the dkv kernel.
    pub start: T,
    pub t: T,
}

impl<T> DqParams<T> {
    pub fn into_vec(self) -> Vec<T> {
        vec![
            self.q, self.k, self.v, self.c, self.delta, self.dout, self.lse, self.dd, self.dq, self.dc,
            self.start, self.t,
        ]
    }
}

/// The dq kernel's parameter numbers.
pub(crate) const DQ: DqParams<u32> =
    DqParams { q: 0, k: 1, v: 2, c: 3, delta: 4, dout: 5, lse: 6, dd: 7, dq: 8, dc: 9, start: 10, t: 11 };

/// The backward's dkv kernel's fixed parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DkvParams<T> {
    pub q: T,
    pub k: T,
    pub v: T,
    pub c: T,
    pub dout: T,
    pub lse: T,
    pub dd: T,
    /// Read: the dq kernel's start tiles.
    pub start: T,
    pub dk: T,
    pub dv: T,
    pub dc: T,
    pub t: T,
}

impl<T> DkvParams<T> {
    pub fn into_vec(self) -> Vec<T> {
        vec![
            self.q, self.k, self.v, self.c, self.dout, self.lse, self.dd, self.start, self.dk, self.dv,
            self.dc, self.t,
        ]
    }
}

/// The dkv kernel's parameter numbers.
pub(crate) const DKV: DkvParams<u32> =
    DkvParams { q: 0, k: 1, v: 2, c: 3, dout: 4, lse: 5, dd: 6, start: 7, dk: 8, dv: 9, dc: 10, t: 11 };

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers are the positions `into_vec` gives: a field moved in one and not the other
    /// fails here.
    #[test]
    fn numbers_are_positions() {
        let fwd = FWD.into_vec();
        assert_eq!(fwd, (0..fwd.len() as u32).collect::<Vec<_>>());
        assert_eq!(fwd.len() as u32, FIRST_FWD_PARAM);
        let dq = DQ.into_vec();
        assert_eq!(dq, (0..dq.len() as u32).collect::<Vec<_>>());
        let dkv = DKV.into_vec();
        assert_eq!(dkv, (0..dkv.len() as u32).collect::<Vec<_>>());
        assert_eq!(dq.len(), dkv.len());
    }

    #[test]
    fn the_signature_names_every_parameter_once() {
        let names: Vec<&str> = fwd_signature().iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["q", "k", "v", "c", "delta", "out", "lse", "T"]);
    }
}
