//! Which key/value head a query head reads (grouped-query attention): the one mapping that the
//! attention, warp-specialized, backward and threshold kernels share.

use super::builder::KernelBuilder;
use inkwell::values::IntValue;

/// Key/value head of flat query head `bh`: `bh / kv_group`. Query head `h` of batch `b` is flat
/// head `b H + h`, and its key/value head `h / kv_group` is flat `(b H + h) / kv_group`, since
/// `kv_group` divides `H`. `bh` itself without grouping.
pub(crate) fn kv_head<'ctx>(
    k: &KernelBuilder<'_, 'ctx>,
    bh: IntValue<'ctx>,
    kv_group: u32,
) -> IntValue<'ctx> {
    if kv_group == 1 {
        bh
    } else {
        k.udivc(bh, kv_group as i64)
    }
}

/// First row of the keys that query head `bh` reads, `kv_head T` (64-bit).
pub(crate) fn kv_rows<'ctx>(
    k: &KernelBuilder<'_, 'ctx>,
    bh: IntValue<'ctx>,
    t_len: IntValue<'ctx>,
    kv_group: u32,
) -> IntValue<'ctx> {
    k.mul(k.sext64(kv_head(k, bh, kv_group)), k.sext64(t_len))
}
