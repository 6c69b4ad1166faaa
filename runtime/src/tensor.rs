//! Host tensors: a dtype, a shape and little-endian element bytes, as safetensors stores them.

use foxc_ir::DType;
use half::{bf16, f16};

/// A dense row-major tensor in host memory.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// `numel * dtype.size_bytes()` little-endian bytes.
    pub data: Vec<u8>,
}

/// Named tensors, as read from or written to a safetensors file.
pub type TensorMap = std::collections::BTreeMap<String, HostTensor>;

impl HostTensor {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn from_f32(shape: &[usize], values: &[f32]) -> HostTensor {
        assert_eq!(shape.iter().product::<usize>(), values.len(), "shape does not match data");
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        HostTensor { dtype: DType::F32, shape: shape.to_vec(), data }
    }

    /// Round `values` to bf16.
    pub fn from_f32_as_bf16(shape: &[usize], values: &[f32]) -> HostTensor {
        assert_eq!(shape.iter().product::<usize>(), values.len(), "shape does not match data");
        let data = values.iter().flat_map(|v| bf16::from_f32(*v).to_le_bytes()).collect();
        HostTensor { dtype: DType::BF16, shape: shape.to_vec(), data }
    }

    /// Convert `values` to `dtype` (a float dtype or an integer one: truncated, saturating).
    pub fn from_f32_as(dtype: DType, shape: &[usize], values: &[f32]) -> HostTensor {
        let data = match dtype {
            DType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            DType::BF16 => values.iter().flat_map(|v| bf16::from_f32(*v).to_le_bytes()).collect(),
            DType::F16 => values.iter().flat_map(|v| f16::from_f32(*v).to_le_bytes()).collect(),
            DType::I32 => values.iter().flat_map(|v| (*v as i32).to_le_bytes()).collect(),
            DType::I64 => values.iter().flat_map(|v| (*v as i64).to_le_bytes()).collect(),
            DType::Bool => values.iter().map(|v| (*v != 0.0) as u8).collect(),
        };
        HostTensor { dtype, shape: shape.to_vec(), data }
    }

    /// A zero-filled tensor (for outputs that a kernel overwrites; poison them before GPU runs).
    pub fn zeros(dtype: DType, shape: &[usize]) -> HostTensor {
        let n: usize = shape.iter().product();
        HostTensor { dtype, shape: shape.to_vec(), data: vec![0; n * dtype.size_bytes()] }
    }

    /// Element values widened to f32.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match self.dtype {
            DType::F32 => {
                self.data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
            }
            DType::BF16 => {
                self.data.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect()
            }
            DType::F16 => {
                self.data.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()).collect()
            }
            DType::I32 => self
                .data
                .chunks_exact(4)
                .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32)
                .collect(),
            DType::I64 => self.i64_values().map(|x| x as f32).collect(),
            DType::Bool => self.data.iter().map(|&b| b as f32).collect(),
        }
    }

    /// Element values as f64 (for the reference interpreter): exact for every dtype but i64,
    /// whose values beyond 2^53 round.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match self.dtype {
            DType::I32 => self
                .data
                .chunks_exact(4)
                .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
                .collect(),
            DType::I64 => self.i64_values().map(|x| x as f64).collect(),
            _ => self.to_f32_vec().into_iter().map(f64::from).collect(),
        }
    }

    /// An i64 tensor as i32, each value saturated to the i32 range (as `interp::cast(I32, x)`
    /// narrows: what an `i64` parameter's values are inside a graph); other dtypes unchanged.
    pub fn narrowed_to_i32(&self) -> HostTensor {
        if self.dtype != DType::I64 {
            return self.clone();
        }
        let data =
            self.i64_values().flat_map(|x| (x.clamp(i32::MIN as i64, i32::MAX as i64) as i32).to_le_bytes());
        HostTensor { dtype: DType::I32, shape: self.shape.clone(), data: data.collect() }
    }

    fn i64_values(&self) -> impl Iterator<Item = i64> + '_ {
        self.data.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().expect("chunks of 8")))
    }
}
