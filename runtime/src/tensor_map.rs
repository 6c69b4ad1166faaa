//! Tensor maps for the tensor memory accelerator (TMA, sm_90): the 128-byte descriptor a
//! `cp.async.bulk.tensor` copy reads, passed to a kernel by value.
//!
//! A [`TensorMapArg`] is the launch plan's description (which buffer, its shape, the box one
//! copy moves, the shared-memory swizzle); the runtime encodes it per launch with the driver's
//! `cuTensorMapEncodeTiled` from the buffer's device pointer, so the same plan serves the
//! runtime's own buffers and a caller's (the torch op's `ExternalModule`). Out-of-bounds
//! elements of a box are filled with zeros.

use cudarc::driver::sys;
use std::ffi::c_void;

/// The most dimensions a tiled tensor map has.
pub const MAX_RANK: usize = 5;

/// Bytes of one element: tensor maps here are over bf16 only (the attention's K and V).
pub const ELEM_BYTES: u64 = 2;

/// How the copy engine permutes the 16-byte chunks of each row of a box in shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TmaSwizzle {
    None,
    /// Chunk `c` of row `r` lands at chunk `c ^ (r % 8)` of a 128-byte row (1024-byte atoms):
    /// the layout wgmma's 128-byte-swizzle descriptors read.
    B128,
}

impl TmaSwizzle {
    /// The longest inner box row (bytes) the swizzle allows (none: any multiple of 16).
    fn span(self) -> Option<u64> {
        match self {
            TmaSwizzle::None => None,
            TmaSwizzle::B128 => Some(128),
        }
    }
}

/// A tiled bf16 tensor map over buffer `buffer` of the program; dimensions innermost first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorMapArg {
    pub buffer: usize,
    /// Number of dimensions used (1 to [`MAX_RANK`]); the entries past it are ignored.
    pub rank: usize,
    /// Elements along each dimension.
    pub dims: [u64; MAX_RANK],
    /// Bytes between consecutive indices of dimension `i + 1` (dimension 0 is contiguous).
    pub strides: [u64; MAX_RANK - 1],
    /// Elements one copy moves along each dimension.
    pub box_dims: [u32; MAX_RANK],
    pub swizzle: TmaSwizzle,
}

impl TensorMapArg {
    /// A map over a contiguous (row-major) bf16 tensor whose dimensions, innermost first, are
    /// `dims`; copies move `box_dims`.
    pub fn contiguous(buffer: usize, dims: &[u64], box_dims: &[u32], swizzle: TmaSwizzle) -> TensorMapArg {
        let rank = dims.len().min(MAX_RANK);
        let mut m = TensorMapArg {
            buffer,
            rank,
            dims: [1; MAX_RANK],
            strides: [0; MAX_RANK - 1],
            box_dims: [1; MAX_RANK],
            swizzle,
        };
        let mut stride = ELEM_BYTES;
        for (i, &d) in dims.iter().take(rank).enumerate() {
            m.dims[i] = d;
            m.box_dims[i] = box_dims.get(i).copied().unwrap_or(1);
            stride = stride.saturating_mul(d);
            if let Some(s) = m.strides.get_mut(i) {
                *s = stride;
            }
        }
        m
    }

    /// The driver's rules for a tiled map (CUDA driver API, `cuTensorMapEncodeTiled`), checked
    /// here so a bad plan gets a message that says which rule it breaks.
    pub fn check(&self) -> Result<(), String> {
        let r = self.rank;
        if !(1..=MAX_RANK).contains(&r) {
            return Err(format!("tensor map rank {r} (1 to {MAX_RANK})"));
        }
        for i in 0..r {
            if self.dims[i] == 0 || self.dims[i] > 1 << 32 {
                return Err(format!("tensor map dimension {i} has {} elements (1 to 2^32)", self.dims[i]));
            }
            if self.box_dims[i] == 0 || self.box_dims[i] > 256 {
                return Err(format!("tensor map box dimension {i} is {} (1 to 256)", self.box_dims[i]));
            }
        }
        for i in 0..r - 1 {
            let s = self.strides[i];
            if !s.is_multiple_of(16) || s >= 1 << 40 {
                return Err(format!("tensor map stride {i} is {s} bytes (a multiple of 16 below 2^40)"));
            }
        }
        let row = self.box_dims[0] as u64 * ELEM_BYTES;
        if !row.is_multiple_of(16) {
            return Err(format!("tensor map box rows are {row} bytes (a multiple of 16)"));
        }
        if let Some(span) = self.swizzle.span() {
            if row > span {
                return Err(format!(
                    "tensor map box rows are {row} bytes, more than the {span}-byte swizzle"
                ));
            }
        }
        Ok(())
    }

    /// Encodes the map over the device memory at `ptr` (16-byte aligned).
    pub fn encode(&self, ptr: sys::CUdeviceptr) -> Result<sys::CUtensorMap, String> {
        self.check()?;
        if !ptr.is_multiple_of(16) {
            return Err(format!("a tensor map needs a 16-byte aligned buffer, got address {ptr:#x}"));
        }
        let swizzle = match self.swizzle {
            TmaSwizzle::None => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
            TmaSwizzle::B128 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
        };
        let elem_strides = [1u32; MAX_RANK];
        let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
        // SAFETY: every array holds at least `rank` entries (checked above), the map is written
        // by the driver; the call reads only host memory (no context is needed).
        let r = unsafe {
            sys::cuTensorMapEncodeTiled(
                map.as_mut_ptr(),
                sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                self.rank as u32,
                ptr as *mut c_void,
                self.dims.as_ptr(),
                self.strides.as_ptr(),
                self.box_dims.as_ptr(),
                elem_strides.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                swizzle,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                // NONE fills out-of-bounds elements with zeros.
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(format!("cuTensorMapEncodeTiled rejected {self:?} at {ptr:#x}: {r:?}"));
        }
        // SAFETY: zero-initialized, then filled by the successful call.
        Ok(unsafe { map.assume_init() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// K of a [B, H, T, D] = [2, 3, 1000, 128] tensor, 64-column panels of 128-row tiles.
    fn k_map() -> TensorMapArg {
        TensorMapArg::contiguous(1, &[128, 1000, 6], &[64, 128, 1], TmaSwizzle::B128)
    }

    #[test]
    fn contiguous_strides_are_the_row_major_byte_strides() {
        let m = k_map();
        assert_eq!(m.rank, 3);
        assert_eq!(&m.dims[..3], &[128, 1000, 6]);
        assert_eq!(&m.strides[..2], &[256, 256_000]);
        assert_eq!(&m.box_dims[..3], &[64, 128, 1]);
        assert_eq!(m.check(), Ok(()));
    }

    #[test]
    fn the_driver_rules_are_checked() {
        let bad = |f: &dyn Fn(&mut TensorMapArg)| {
            let mut m = k_map();
            f(&mut m);
            m.check().unwrap_err()
        };
        // 128 bf16 per box row: 256 bytes, wider than the 128-byte swizzle.
        assert!(bad(&|m| m.box_dims[0] = 128).contains("128-byte swizzle"));
        assert!(bad(&|m| m.box_dims[1] = 512).contains("box dimension 1"));
        assert!(bad(&|m| m.box_dims[0] = 4).contains("multiple of 16"));
        // D = 36: 72-byte rows are not a multiple of 16.
        assert!(bad(&|m| m.strides[0] = 72).contains("stride 0"));
        assert!(bad(&|m| m.dims[2] = 0).contains("dimension 2"));
        assert!(bad(&|m| m.rank = 6).contains("rank"));
        let mut m = k_map();
        m.swizzle = TmaSwizzle::None;
        m.box_dims[0] = 128;
        assert_eq!(m.check(), Ok(()));
    }

    #[test]
    fn a_misaligned_buffer_is_refused_before_the_driver() {
        assert!(k_map().encode(0x1008).unwrap_err().contains("16-byte aligned"));
    }
}
