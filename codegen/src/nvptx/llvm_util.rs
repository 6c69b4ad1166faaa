//! Small inkwell helpers shared by the NVPTX kernel builders.

use inkwell::builder::{Builder, BuilderError};
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::types::{BasicMetadataTypeEnum, BasicType, BasicTypeEnum};
use inkwell::values::{BasicMetadataValueEnum, BasicValueEnum, ValueKind};

/// A builder error as the kernel builders report it.
pub(crate) fn be(e: BuilderError) -> String {
    format!("LLVM builder: {e}")
}

/// Declares `name` in `module` on first use (its type from the arguments and `ret`) and calls it:
/// how the builders reach NVVM intrinsics and libdevice-style externals.
pub(crate) fn call_declared<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    b: &Builder<'ctx>,
    name: &str,
    ret: Option<BasicTypeEnum<'ctx>>,
    args: &[BasicValueEnum<'ctx>],
) -> Result<Option<BasicValueEnum<'ctx>>, String> {
    let f = match module.get_function(name) {
        Some(f) => f,
        None => {
            let params: Vec<BasicMetadataTypeEnum> = args.iter().map(|a| a.get_type().into()).collect();
            let ty = match ret {
                Some(r) => r.fn_type(&params, false),
                None => ctx.void_type().fn_type(&params, false),
            };
            module.add_function(name, ty, None)
        }
    };
    let margs: Vec<BasicMetadataValueEnum> = args.iter().map(|a| (*a).into()).collect();
    let cs = b.build_call(f, &margs, "").map_err(be)?;
    Ok(match cs.try_as_basic_value() {
        ValueKind::Basic(v) => Some(v),
        _ => None,
    })
}
