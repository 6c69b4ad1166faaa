//! Scalar functions the generic kernels call: the interpreter's own `unary` and `cast` (one
//! definition of the math), and f16 bit conversions. Registered as JIT imports by name.

use foxc_ir::{interp, DType, UnaryOp};

/// Every unary op, in code order (`UNARY[unary_code(u)] == u`): the declaration order.
pub const UNARY: &[UnaryOp] = &UnaryOp::ALL;

/// The code of `u` passed to [`foxc_unary`].
pub fn unary_code(u: UnaryOp) -> i64 {
    u as i64
}

/// Dtypes in code order for [`foxc_cast`].
pub const DTYPES: [DType; 6] = [DType::BF16, DType::F16, DType::F32, DType::I32, DType::Bool, DType::I64];

pub fn dtype_code(d: DType) -> i64 {
    match d {
        DType::BF16 => 0,
        DType::F16 => 1,
        DType::F32 => 2,
        DType::I32 => 3,
        DType::Bool => 4,
        DType::I64 => 5,
    }
}

/// `unary(UNARY[code], x)`; an unknown code gives NaN (the compiler only emits valid codes).
pub extern "C" fn foxc_unary(code: i64, x: f64) -> f64 {
    match UNARY.get(code as usize) {
        Some(&u) => interp::unary(u, x),
        None => f64::NAN,
    }
}

/// `cast(DTYPES[code], x)`.
pub extern "C" fn foxc_cast(code: i64, x: f64) -> f64 {
    match DTYPES.get(code as usize) {
        Some(&d) => interp::cast(d, x),
        None => f64::NAN,
    }
}

/// The f16 whose bits are the low 16 bits of `bits`, widened.
pub extern "C" fn foxc_f16_to_f64(bits: i32) -> f64 {
    half::f16::from_bits(bits as u16).to_f64()
}

/// `x` rounded to f16, as bits in the low 16 bits.
pub extern "C" fn foxc_f64_to_f16(x: f64) -> i32 {
    half::f16::from_f64(interp::cast(DType::F16, x)).to_bits() as i32
}

/// Import name, address and signature shape (`true`: `(i64, f64) -> f64`) of each helper.
pub enum Helper {
    Unary,
    Cast,
    F16ToF64,
    F64ToF16,
}

impl Helper {
    pub const ALL: [Helper; 4] = [Helper::Unary, Helper::Cast, Helper::F16ToF64, Helper::F64ToF16];

    pub fn symbol(&self) -> &'static str {
        match self {
            Helper::Unary => "foxc_unary",
            Helper::Cast => "foxc_cast",
            Helper::F16ToF64 => "foxc_f16_to_f64",
            Helper::F64ToF16 => "foxc_f64_to_f16",
        }
    }

    pub fn address(&self) -> *const u8 {
        match self {
            Helper::Unary => foxc_unary as *const u8,
            Helper::Cast => foxc_cast as *const u8,
            Helper::F16ToF64 => foxc_f16_to_f64 as *const u8,
            Helper::F64ToF16 => foxc_f64_to_f16 as *const u8,
        }
    }

    pub fn index(&self) -> usize {
        match self {
            Helper::Unary => 0,
            Helper::Cast => 1,
            Helper::F16ToF64 => 2,
            Helper::F64ToF16 => 3,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for &u in UNARY {
            assert_eq!(UNARY[unary_code(u) as usize], u);
        }
        for d in DTYPES {
            assert_eq!(DTYPES[dtype_code(d) as usize], d);
        }
        assert!(foxc_unary(99, 1.0).is_nan());
        assert_eq!(foxc_f16_to_f64(foxc_f64_to_f16(1.5)), 1.5);
    }
}
