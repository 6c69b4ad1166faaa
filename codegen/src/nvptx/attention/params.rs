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

/// A forward kernel's parameter after the score hook's; which are present depends on the
/// configuration ([`FwdTail::of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tail {
    /// The tensor maps of K and V (`loads = tma`).
    KMap,
    VMap,
    /// Debug: where the standard kernel writes its in-kernel start tiles.
    DebugStarts,
    /// The keys' length, when queries are fewer than keys.
    Tk,
    /// The persistent grid's head count `B H` and work-item counter.
    Heads,
    Work,
}

/// The forward kernels' parameters after the fixed ones and the score hook's, in order: the
/// kernel's signature, its body (parameter numbers, [`FwdTail::at`]) and the launcher (its
/// arguments, [`FwdTail::params`]) all read this one list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FwdTail {
    /// The number of the first of them: after the fixed and the score hook's parameters.
    first: u32,
    params: Vec<Tail>,
}

impl FwdTail {
    /// The tail of the kernel for `cfg` whose score hook takes `score_params` parameters.
    pub fn of(cfg: &super::AttnKernelConfig, score_params: usize) -> FwdTail {
        let present = [
            (Tail::KMap, cfg.ws && cfg.tma),
            (Tail::VMap, cfg.ws && cfg.tma),
            (Tail::DebugStarts, cfg.debug_starts),
            (Tail::Tk, cfg.fewer_queries),
            (Tail::Heads, cfg.ws && cfg.persistent),
            (Tail::Work, cfg.ws && cfg.persistent),
        ];
        let params = present.into_iter().filter(|p| p.1).map(|p| p.0).collect();
        FwdTail { first: FIRST_FWD_PARAM + score_params as u32, params }
    }

    /// The parameters, in order.
    pub fn params(&self) -> &[Tail] {
        &self.params
    }

    /// The number of parameter `p` (which the configuration must have).
    pub fn at(&self, p: Tail) -> u32 {
        let k = self.params.iter().position(|&x| x == p);
        self.first + k.unwrap_or_else(|| panic!("the kernel has no {p:?} parameter")) as u32
    }

    /// Their names and types, for the kernel's signature (beside the score hook's, whose names
    /// live as long as the hook: `'n`).
    pub fn signature<'n>(&self) -> impl Iterator<Item = (&'n str, ParamTy)> + '_ {
        self.params.iter().map(|p| match p {
            Tail::KMap => ("tmap_k", ParamTy::TensorMap),
            Tail::VMap => ("tmap_v", ParamTy::TensorMap),
            Tail::DebugStarts => ("starts", ParamTy::Ptr),
            Tail::Tk => ("Tk", ParamTy::I32),
            Tail::Heads => ("BH", ParamTy::I32),
            Tail::Work => ("work", ParamTy::Ptr),
        })
    }
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

/// The dq and dkv kernels' first parameter after the fixed ones (the same count in both).
pub(crate) const FIRST_BWD_PARAM: u32 = DQ.t + 1;

/// A dq or dkv kernel's parameter after the score region's ([`BwdTail::of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BwdTailParam {
    /// The gradient output of captured tensor slot `s` (f32 `[B, H, T]`).
    Grad(usize),
    /// The keys' length, when queries are fewer than keys.
    Tk,
}

/// The dq and dkv kernels' parameters after the fixed ones and the score region's, in order:
/// the kernels' signatures, their bodies ([`BwdTail::at`]) and the launcher's arguments
/// ([`BwdTail::params`]) all read this one list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BwdTail {
    first: u32,
    params: Vec<BwdTailParam>,
}

impl BwdTail {
    /// The tail after a score region of `score_params` parameters: `grads` gradient outputs,
    /// then `Tk` with `fewer_queries`.
    pub fn of(fewer_queries: bool, score_params: usize, grads: usize) -> BwdTail {
        let mut params: Vec<BwdTailParam> = (0..grads).map(BwdTailParam::Grad).collect();
        if fewer_queries {
            params.push(BwdTailParam::Tk);
        }
        BwdTail { first: FIRST_BWD_PARAM + score_params as u32, params }
    }

    /// The parameters, in order.
    pub fn params(&self) -> &[BwdTailParam] {
        &self.params
    }

    /// The number of parameter `p` (which the kernel must have).
    pub fn at(&self, p: BwdTailParam) -> u32 {
        let k = self.params.iter().position(|&x| x == p);
        self.first + k.unwrap_or_else(|| panic!("the kernel has no {p:?} parameter")) as u32
    }

    /// Their names and types, for the kernels' signatures.
    pub fn signature(&self) -> impl Iterator<Item = (String, ParamTy)> + '_ {
        self.params.iter().map(|p| match p {
            BwdTailParam::Grad(s) => (format!("dcap{s}"), ParamTy::Ptr),
            BwdTailParam::Tk => ("Tk".to_string(), ParamTy::I32),
        })
    }
}

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
        assert_eq!(dq.len() as u32, FIRST_BWD_PARAM);
    }

    #[test]
    fn the_signature_names_every_parameter_once() {
        let names: Vec<&str> = fwd_signature().iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["q", "k", "v", "c", "delta", "out", "lse", "T"]);
    }

    /// The tail's order: maps, debug starts, `Tk`, the persistent grid's; numbered after the
    /// score hook's parameters, and only what the configuration has.
    #[test]
    fn the_tail_numbers_what_the_configuration_has_in_one_order() {
        use super::super::AttnKernelConfig;
        let mut std = AttnKernelConfig::new(64, true, true);
        (std.debug_starts, std.fewer_queries) = (true, true);
        let t = FwdTail::of(&std, 2);
        assert_eq!((t.at(Tail::DebugStarts), t.at(Tail::Tk)), (10, 11));
        assert_eq!(t.params(), [Tail::DebugStarts, Tail::Tk]);
        let mut ws = AttnKernelConfig::new(128, true, true);
        (ws.ws, ws.tma, ws.persistent, ws.fewer_queries) = (true, true, true, true);
        let t = FwdTail::of(&ws, 0);
        let at: Vec<u32> =
            [Tail::KMap, Tail::VMap, Tail::Tk, Tail::Heads, Tail::Work].map(|p| t.at(p)).to_vec();
        assert_eq!(at, [8, 9, 10, 11, 12]);
        let names: Vec<&str> = t.signature().map(|(n, _)| n).collect();
        assert_eq!(names, ["tmap_k", "tmap_v", "Tk", "BH", "work"]);
        // The consumers' view (not warp-specialized) has no maps or grid parameters.
        ws.ws = false;
        assert_eq!(FwdTail::of(&ws, 0).params(), [Tail::Tk]);
    }

    /// The backward's tail: the gradient outputs, then `Tk`; numbered after the score
    /// region's parameters.
    #[test]
    fn the_backward_tail_numbers_gradients_then_tk() {
        let t = BwdTail::of(true, 3, 2);
        assert_eq!(t.params(), [BwdTailParam::Grad(0), BwdTailParam::Grad(1), BwdTailParam::Tk]);
        let at: Vec<u32> = t.params().iter().map(|&p| t.at(p)).collect();
        assert_eq!(at, [15, 16, 17]);
        let names: Vec<String> = t.signature().map(|(n, _)| n).collect();
        assert_eq!(names, ["dcap0", "dcap1", "Tk"]);
        assert_eq!(BwdTail::of(false, 0, 0).params(), []);
    }
}
