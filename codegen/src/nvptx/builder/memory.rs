//! Memory: element addressing, loads and stores (with widening / rounding by dtype), and shared
//! memory (static arrays and the kernel's dynamic shared memory).

use super::KernelBuilder;
use foxc_ir::DType;
use inkwell::module::Linkage;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValue, BasicValueEnum, FloatValue, GlobalValue, IntValue, PointerValue};
use inkwell::AddressSpace;

/// A kernel-private shared-memory array of `n` f32.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SharedArray<'ctx> {
    g: GlobalValue<'ctx>,
    n: u32,
}

impl SharedArray<'_> {
    /// Its length in f32.
    pub fn len(&self) -> u32 {
        self.n
    }
}

impl<'a, 'ctx> KernelBuilder<'a, 'ctx> {
    /// `&p[idx]` for elements of type `elem` (in bounds).
    pub fn gep(
        &self,
        elem: BasicTypeEnum<'ctx>,
        p: PointerValue<'ctx>,
        idx: IntValue<'ctx>,
    ) -> PointerValue<'ctx> {
        // SAFETY: the kernels index inside the buffers the launch plan sizes for them.
        let r = unsafe { self.b.build_in_bounds_gep(elem, p, &[idx], "") };
        self.keep(r, || p)
    }

    /// A load of type `ty`.
    pub fn load(&self, ty: BasicTypeEnum<'ctx>, p: PointerValue<'ctx>) -> BasicValueEnum<'ctx> {
        self.keep(self.b.build_load(ty, p, ""), || self.zero_of(ty))
    }

    /// A load of type `ty` at a known alignment (bytes).
    pub fn load_aligned(
        &self,
        ty: BasicTypeEnum<'ctx>,
        p: PointerValue<'ctx>,
        align: u32,
    ) -> BasicValueEnum<'ctx> {
        let v = self.load(ty, p);
        match v.as_instruction_value().map(|i| i.set_alignment(align)) {
            Some(Ok(())) => {}
            Some(Err(e)) => self.fail(format!("load alignment {align}: {e}")),
            None => self.fail("load produced no instruction"),
        }
        v
    }

    pub fn load_f32(&self, p: PointerValue<'ctx>) -> FloatValue<'ctx> {
        match self.load(self.f32t().into(), p) {
            BasicValueEnum::FloatValue(v) => v,
            _ => self.f32(0.0),
        }
    }

    pub fn store(&self, p: PointerValue<'ctx>, v: impl BasicValue<'ctx>) {
        let r = self.b.build_store(p, v);
        self.keep(r.map(|_| ()), || ());
    }

    /// A store at a known alignment (bytes).
    pub fn store_aligned(&self, p: PointerValue<'ctx>, v: impl BasicValue<'ctx>, align: u32) {
        match self.b.build_store(p, v) {
            Ok(st) => {
                if let Err(e) = st.set_alignment(align) {
                    self.fail(format!("store alignment {align}: {e}"));
                }
            }
            Err(e) => self.fail(format!("LLVM builder: {e}")),
        }
    }

    // ---- tensors by dtype ----------------------------------------------------------------

    /// The LLVM element type of a tensor dtype.
    pub fn elem_type(&self, dt: DType) -> BasicTypeEnum<'ctx> {
        match dt {
            DType::F32 => self.ctx.f32_type().into(),
            DType::BF16 => self.ctx.bf16_type().into(),
            DType::F16 => self.ctx.f16_type().into(),
            DType::I32 => self.ctx.i32_type().into(),
            DType::I64 => {
                self.fail("i64 is only a parameter's storage: the verifier keeps it out of graphs");
                self.ctx.i64_type().into()
            }
            DType::Bool => {
                self.fail("bool tensors cannot be kernel operands");
                self.ctx.i8_type().into()
            }
        }
    }

    /// `&p[idx]` of a tensor of dtype `dt`.
    pub fn gep_dt(&self, dt: DType, p: PointerValue<'ctx>, idx: IntValue<'ctx>) -> PointerValue<'ctx> {
        self.gep(self.elem_type(dt), p, idx)
    }

    /// The 16 bytes at `p` (16-byte aligned, read-only for the kernel) as the elements of a float
    /// dtype `dt` widened to f32, by one `ld.global.nc.v4.b32`. Inline PTX: LLVM splits a vector
    /// load whose elements are all extracted into scalar loads.
    pub fn load_16_bytes_f(&self, dt: DType, p: PointerValue<'ctx>) -> Vec<FloatValue<'ctx>> {
        let i32t = self.i32t();
        let st = self.ctx.struct_type(&[i32t.into(); 4], false);
        let text = "ld.global.nc.v4.b32 {$0, $1, $2, $3}, [$4];";
        let words: Vec<IntValue<'ctx>> = match self.asm(text, "=r,=r,=r,=r,l", Some(st.into()), &[p.into()]) {
            Some(BasicValueEnum::StructValue(v)) => {
                (0..4).map(|i| self.field(v, i).into_int_value()).collect()
            }
            _ => vec![self.i32(0); 4],
        };
        let ft = self.elem_type(dt).into_float_type();
        let per_word = (4 / dt.size_bytes()) as u32;
        let wt: BasicTypeEnum<'ctx> = if per_word == 1 { ft.into() } else { ft.vec_type(per_word).into() };
        let mut out = vec![];
        for w in words {
            let v = self.keep(self.b.build_bit_cast(w, wt, ""), || self.zero_of(wt));
            match v {
                BasicValueEnum::FloatValue(x) => out.push(x),
                BasicValueEnum::VectorValue(x) => {
                    out.extend((0..per_word as i64).map(|e| self.extract_f(x, e)))
                }
                _ => self.fail(format!("16-byte loads of {dt}")),
            }
        }
        if dt == DType::F32 {
            out
        } else {
            out.into_iter().map(|x| self.fpext(x)).collect()
        }
    }

    /// Element `idx` of a float tensor of dtype `dt`, widened to f32.
    pub fn load_f(&self, dt: DType, p: PointerValue<'ctx>, idx: IntValue<'ctx>) -> FloatValue<'ctx> {
        let a = self.gep_dt(dt, p, idx);
        let v = self.load(self.elem_type(dt), a);
        match (dt, v) {
            (DType::F32, BasicValueEnum::FloatValue(v)) => v,
            (DType::BF16 | DType::F16, BasicValueEnum::FloatValue(v)) => self.fpext(v),
            // An integer (a start, a length) as the number it is (exact below 2^24).
            (DType::I32, BasicValueEnum::IntValue(v)) => self.sitofp(v),
            _ => {
                self.fail(format!("expected a float or i32 tensor, got {dt}"));
                self.f32(0.0)
            }
        }
    }

    /// Stores an f32 as element `idx` of a float tensor of dtype `dt` (round to nearest even).
    pub fn store_f(&self, dt: DType, p: PointerValue<'ctx>, idx: IntValue<'ctx>, v: FloatValue<'ctx>) {
        let a = self.gep_dt(dt, p, idx);
        let v = match dt {
            DType::F32 => v,
            DType::BF16 => self.fptrunc(v, self.ctx.bf16_type()),
            DType::F16 => self.fptrunc(v, self.ctx.f16_type()),
            _ => {
                self.fail(format!("expected a float tensor, got {dt}"));
                return;
            }
        };
        self.store(a, v);
    }

    /// Elements `idx .. idx + n` of a float tensor of dtype `dt` in one vector load, widened to
    /// f32. The caller guarantees the address is aligned to the vector (`n` times the element).
    pub fn load_vec_f(
        &self,
        dt: DType,
        p: PointerValue<'ctx>,
        idx: IntValue<'ctx>,
        n: u32,
    ) -> Vec<FloatValue<'ctx>> {
        let elem = self.float_elem(dt);
        let v =
            self.load_aligned(elem.vec_type(n).into(), self.gep_dt(dt, p, idx), n * dt.size_bytes() as u32);
        (0..n)
            .map(|e| {
                let x = self.b.build_extract_element(v.into_vector_value(), self.i32(e as i64), "");
                let x = self.keep(x, || elem.const_zero().into()).into_float_value();
                if dt == DType::F32 {
                    x
                } else {
                    self.fpext(x)
                }
            })
            .collect()
    }

    /// Stores f32 values as elements `idx ..` of a float tensor of dtype `dt` in one vector store
    /// (round to nearest even). The caller guarantees the address is aligned to the vector.
    pub fn store_vec_f(
        &self,
        dt: DType,
        p: PointerValue<'ctx>,
        idx: IntValue<'ctx>,
        vals: &[FloatValue<'ctx>],
    ) {
        let elem = self.float_elem(dt);
        let n = vals.len() as u32;
        let mut v = elem.vec_type(n).get_undef();
        for (e, &x) in vals.iter().enumerate() {
            let x = if dt == DType::F32 { x } else { self.fptrunc(x, elem) };
            let r = self.b.build_insert_element(v, x, self.i32(e as i64), "");
            v = self.keep(r, || v);
        }
        self.store_aligned(self.gep_dt(dt, p, idx), v, n * dt.size_bytes() as u32);
    }

    /// The LLVM type of a float dtype's elements ([`Self::elem_type`], which must be a float).
    fn float_elem(&self, dt: DType) -> inkwell::types::FloatType<'ctx> {
        match self.elem_type(dt) {
            BasicTypeEnum::FloatType(t) => t,
            _ => {
                self.fail(format!("expected a float tensor, got {dt}"));
                self.ctx.f32_type()
            }
        }
    }

    // ---- shared memory -------------------------------------------------------------------

    /// A kernel-private shared-memory array of `n` f32 named `name` (16-byte aligned).
    pub fn shared_f32(&self, name: &str, n: u32) -> SharedArray<'ctx> {
        let ty = self.f32t().array_type(n);
        let g = self.module.add_global(ty, Some(AddressSpace::from(3u16)), name);
        g.set_linkage(Linkage::Internal);
        g.set_initializer(&ty.get_undef());
        g.set_alignment(16);
        SharedArray { g, n }
    }

    /// `&a[idx]` (i32 index).
    pub fn shared_at(&self, a: SharedArray<'ctx>, idx: IntValue<'ctx>) -> PointerValue<'ctx> {
        let ty = self.f32t().array_type(a.n);
        let p = a.g.as_pointer_value();
        // SAFETY: callers index below `n`.
        let r = unsafe { self.b.build_in_bounds_gep(ty, p, &[self.i32(0), idx], "") };
        self.keep(r, || p)
    }

    /// The kernel's dynamic shared memory: a zero-length external array `name`, aligned to
    /// `align` bytes (created once per name; PTX aliases all of them to the launch's dynamic
    /// shared memory). Address it in bytes with [`Self::smem_at`].
    pub fn dyn_shared(&self, name: &str, align: u32) -> PointerValue<'ctx> {
        let g = match self.module.get_global(name) {
            Some(g) => g,
            None => {
                let g = self.module.add_global(
                    self.ctx.i8_type().array_type(0),
                    Some(AddressSpace::from(3u16)),
                    name,
                );
                g.set_linkage(Linkage::External);
                g.set_alignment(align);
                g
            }
        };
        g.as_pointer_value()
    }

    /// `base + off` bytes.
    pub fn smem_at(&self, base: PointerValue<'ctx>, off: IntValue<'ctx>) -> PointerValue<'ctx> {
        self.gep(self.ctx.i8_type().into(), base, off)
    }

    /// `p` (shared memory of this block, address space 3) as a `shared::cluster` pointer
    /// (address space 7), the destination type of the bulk tensor copies.
    pub fn shared_cluster(&self, p: PointerValue<'ctx>) -> PointerValue<'ctx> {
        let t = self.ctx.ptr_type(AddressSpace::from(7u16));
        self.keep(self.b.build_address_space_cast(p, t, ""), || t.const_null())
    }

    /// The address of a shared pointer as an i64 (for matrix descriptors).
    pub fn ptr_to_i64(&self, p: PointerValue<'ctx>) -> IntValue<'ctx> {
        self.keep(self.b.build_ptr_to_int(p, self.i64t(), ""), || self.i64(0))
    }
}
