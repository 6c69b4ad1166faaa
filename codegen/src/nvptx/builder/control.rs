//! Structured control flow: branches and loops whose blocks, branches and phis the builder makes.
//!
//! Values that cross a join or a loop back edge are *carried*: the construct takes their names and
//! values on entry, creates one phi per value, and hands the closure the phis' values; what the
//! closure returns feeds the phis. Blocks are appended to the function when the construct is
//! entered (then, join) or, for a loop's exit, when the body is done, so the layout follows the
//! program text.

use super::KernelBuilder;
use inkwell::basic_block::BasicBlock;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValueEnum, FloatValue, IntValue, PhiValue, PointerValue};
use inkwell::IntPredicate;

/// A mutable variable of a kernel (cranelift-frontend's `Variable`): a stack slot that LLVM's
/// `mem2reg` promotes to SSA values and phis. Declare it in the entry block.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Var<'ctx> {
    slot: PointerValue<'ctx>,
    ty: BasicTypeEnum<'ctx>,
}

/// A carried value on entry to a construct: its IR name and initial value.
pub(crate) type Carried<'n, 'ctx> = (&'n str, BasicValueEnum<'ctx>);

impl<'a, 'ctx> KernelBuilder<'a, 'ctx> {
    /// Appends a block named `name` to the function.
    pub(crate) fn block(&self, name: &str) -> BasicBlock<'ctx> {
        self.ctx.append_basic_block(self.f, name)
    }

    /// The block instructions go to now.
    pub(crate) fn current_block(&self) -> BasicBlock<'ctx> {
        match self.b.get_insert_block() {
            Some(bb) => bb,
            None => {
                self.fail("the builder is not positioned in a block");
                self.f.get_first_basic_block().unwrap_or_else(|| self.block("orphan"))
            }
        }
    }

    pub(crate) fn position_at_end(&self, bb: BasicBlock<'ctx>) {
        self.b.position_at_end(bb);
    }

    pub(crate) fn br(&self, to: BasicBlock<'ctx>) {
        let r = self.b.build_unconditional_branch(to);
        self.keep(r.map(|_| ()), || ());
    }

    pub(crate) fn cond_br(&self, c: IntValue<'ctx>, then: BasicBlock<'ctx>, other: BasicBlock<'ctx>) {
        let r = self.b.build_conditional_branch(c, then, other);
        self.keep(r.map(|_| ()), || ());
    }

    fn phis(&self, carried: &[Carried<'_, 'ctx>], from: BasicBlock<'ctx>) -> Vec<PhiValue<'ctx>> {
        carried
            .iter()
            .filter_map(|(name, v)| {
                let p = self.b.build_phi(v.get_type(), name);
                let p = self.keep(p.map(Some), || None)?;
                p.add_incoming(&[(v, from)]);
                Some(p)
            })
            .collect()
    }

    fn feed(&self, phis: &[PhiValue<'ctx>], vals: &[BasicValueEnum<'ctx>], from: BasicBlock<'ctx>) {
        if phis.len() != vals.len() {
            self.fail(format!("{} carried values, {} given back", phis.len(), vals.len()));
            return;
        }
        for (p, v) in phis.iter().zip(vals) {
            p.add_incoming(&[(v, from)]);
        }
    }

    fn values(phis: &[PhiValue<'ctx>]) -> Vec<BasicValueEnum<'ctx>> {
        phis.iter().map(|p| p.as_basic_value()).collect()
    }

    /// `if cond { then() }` (blocks `then`, `join`).
    pub fn if_then(&self, cond: IntValue<'ctx>, then: impl FnOnce(&Self)) {
        self.if_then_named(cond, ("then", "join"), then)
    }

    /// [`Self::if_then`] with the two blocks named `(then, join)`.
    pub fn if_then_named(&self, cond: IntValue<'ctx>, names: (&str, &str), then: impl FnOnce(&Self)) {
        let tb = self.block(names.0);
        let jb = self.block(names.1);
        self.cond_br(cond, tb, jb);
        self.position_at_end(tb);
        then(self);
        self.br(jb);
        self.position_at_end(jb);
    }

    /// `vals = if cond { then(vals) } else { vals }`: the values `carried` (named by their
    /// names in the join's phis) are replaced by what `then` returns when `cond` holds.
    /// Blocks `names = (then, join)`.
    pub fn if_then_carry(
        &self,
        cond: IntValue<'ctx>,
        names: (&str, &str),
        carried: &[Carried<'_, 'ctx>],
        then: impl FnOnce(&Self) -> Vec<BasicValueEnum<'ctx>>,
    ) -> Vec<BasicValueEnum<'ctx>> {
        let tb = self.block(names.0);
        let jb = self.block(names.1);
        let from = self.current_block();
        self.cond_br(cond, tb, jb);
        self.position_at_end(tb);
        let vals = then(self);
        let then_end = self.current_block();
        self.br(jb);
        self.position_at_end(jb);
        let phis = self.phis(carried, from);
        self.feed(&phis, &vals, then_end);
        Self::values(&phis)
    }

    #[cfg_attr(not(test), allow(dead_code))] // API for kernels with two-sided branches (tests use it)
    /// `if cond { then() } else { other() }`, both returning values of the same types, merged
    /// at the join by phis named `phi_name`. Blocks `then`, `else`, `join`.
    pub fn if_else(
        &self,
        cond: IntValue<'ctx>,
        phi_name: &str,
        then: impl FnOnce(&Self) -> Vec<BasicValueEnum<'ctx>>,
        other: impl FnOnce(&Self) -> Vec<BasicValueEnum<'ctx>>,
    ) -> Vec<BasicValueEnum<'ctx>> {
        let tb = self.block("then");
        let eb = self.block("else");
        let jb = self.block("join");
        self.cond_br(cond, tb, eb);
        self.position_at_end(tb);
        let tv = then(self);
        let t_end = self.current_block();
        self.br(jb);
        self.position_at_end(eb);
        let ev = other(self);
        let e_end = self.current_block();
        self.br(jb);
        self.position_at_end(jb);
        if tv.len() != ev.len() {
            self.fail(format!("if_else: {} values from then, {} from else", tv.len(), ev.len()));
            return tv;
        }
        let carried: Vec<Carried<'_, 'ctx>> = tv.iter().map(|v| (phi_name, *v)).collect();
        let phis = self.phis(&carried, t_end);
        self.feed(&phis, &ev, e_end);
        Self::values(&phis)
    }

    /// `for (i = start; i < end; i += step) body(i)` over i32 or i64 (signed compare). Blocks
    /// `loop`, `body`, `exit`; the counter's phi is `i`.
    pub fn for_range(
        &self,
        start: IntValue<'ctx>,
        end: IntValue<'ctx>,
        step: IntValue<'ctx>,
        body: impl FnOnce(&Self, IntValue<'ctx>),
    ) {
        let pre = self.current_block();
        let head = self.block("loop");
        let bodyb = self.block("body");
        let exit = self.block("exit");
        self.br(head);
        self.position_at_end(head);
        let phis = self.phis(&[("i", start.into())], pre);
        let i = phis.first().map(|p| p.as_basic_value().into_int_value()).unwrap_or(start);
        let c = self.icmp(IntPredicate::SLT, i, end);
        self.cond_br(c, bodyb, exit);
        self.position_at_end(bodyb);
        body(self, i);
        let next = self.add(i, step);
        let latch = self.current_block();
        self.br(head);
        self.feed(&phis, &[next.into()], latch);
        self.position_at_end(exit);
    }

    /// `while cond(vals) { vals = body(vals) }`; returns the carried values at the exit.
    /// Blocks `names = (head, body, exit)`.
    pub fn while_loop(
        &self,
        names: (&str, &str, &str),
        carried: &[Carried<'_, 'ctx>],
        cond: impl FnOnce(&Self, &[BasicValueEnum<'ctx>]) -> IntValue<'ctx>,
        body: impl FnOnce(&Self, &[BasicValueEnum<'ctx>]) -> Vec<BasicValueEnum<'ctx>>,
    ) -> Vec<BasicValueEnum<'ctx>> {
        let pre = self.current_block();
        let head = self.block(names.0);
        let bodyb = self.block(names.1);
        let exit = self.block(names.2);
        self.br(head);
        self.position_at_end(head);
        let phis = self.phis(carried, pre);
        let vals = Self::values(&phis);
        let go = cond(self, &vals);
        self.cond_br(go, bodyb, exit);
        self.position_at_end(bodyb);
        let next = body(self, &vals);
        let latch = self.current_block();
        self.feed(&phis, &next, latch);
        self.br(head);
        self.position_at_end(exit);
        vals
    }

    /// `do { (again, vals) = body(vals) } while again`; returns the values of the last
    /// iteration (the exit is reached from the end of the body only). Block `names.0` is the
    /// body's first block, `names.1` the exit (appended after the body's blocks).
    pub fn do_while(
        &self,
        names: (&str, &str),
        carried: &[Carried<'_, 'ctx>],
        body: impl FnOnce(&Self, &[BasicValueEnum<'ctx>]) -> (IntValue<'ctx>, Vec<BasicValueEnum<'ctx>>),
    ) -> Vec<BasicValueEnum<'ctx>> {
        let pre = self.current_block();
        let bodyb = self.block(names.0);
        self.br(bodyb);
        self.position_at_end(bodyb);
        let phis = self.phis(carried, pre);
        let (again, next) = body(self, &Self::values(&phis));
        let latch = self.current_block();
        self.feed(&phis, &next, latch);
        let exit = self.block(names.1);
        self.cond_br(again, bodyb, exit);
        self.position_at_end(exit);
        next
    }

    // ---- variables -----------------------------------------------------------------------

    /// Declares a variable holding `init`. Its slot is allocated at the top of the entry block
    /// wherever the declaration is (inside a branch or a loop too): `mem2reg` promotes only
    /// entry-block allocas; one elsewhere stays a stack slot (a loop's would grow the stack).
    pub fn declare_var(&self, init: BasicValueEnum<'ctx>) -> Var<'ctx> {
        let ty = init.get_type();
        let at_entry = self.ctx.create_builder();
        match self.f.get_first_basic_block() {
            Some(entry) => match entry.get_first_instruction() {
                Some(first) => at_entry.position_before(&first),
                None => at_entry.position_at_end(entry),
            },
            None => self.fail("declare_var before the entry block"),
        }
        let slot = self.keep(at_entry.build_alloca(ty, ""), || self.gptr().const_null());
        let v = Var { slot, ty };
        self.def_var(v, init);
        v
    }

    /// The variable's current value.
    pub fn use_var(&self, v: Var<'ctx>) -> BasicValueEnum<'ctx> {
        self.keep(self.b.build_load(v.ty, v.slot, ""), || self.zero_of(v.ty))
    }

    /// [`Self::use_var`] of a float variable.
    pub fn use_f(&self, v: Var<'ctx>) -> FloatValue<'ctx> {
        match self.use_var(v) {
            BasicValueEnum::FloatValue(f) => f,
            _ => {
                self.fail("use_f of a variable that is not a float");
                self.f32(0.0)
            }
        }
    }

    /// Assigns `val` to the variable.
    pub fn def_var(&self, v: Var<'ctx>, val: impl Into<BasicValueEnum<'ctx>>) {
        let r = self.b.build_store(v.slot, val.into());
        self.keep(r.map(|_| ()), || ());
    }
}

/// The carried values as floats (all of them must be floats).
pub(crate) fn floats<'ctx>(vals: &[BasicValueEnum<'ctx>]) -> Vec<FloatValue<'ctx>> {
    vals.iter().map(|v| v.into_float_value()).collect()
}

/// Carried values from floats.
pub(crate) fn basic<'ctx, V: Into<BasicValueEnum<'ctx>> + Copy>(vals: &[V]) -> Vec<BasicValueEnum<'ctx>> {
    vals.iter().map(|v| (*v).into()).collect()
}
