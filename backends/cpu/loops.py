"""Loop and variable helpers for llvmlite codegen: no hand-placed blocks in kernel code.

    with for_range(builder, start, stop) as i:
        ...  # body; i is the i64 induction variable
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from llvmlite import ir

I64 = ir.IntType(64)


class _LoopID(ir.values.MDValue):
    """A loop's ID node, distinct and naming itself first (`!7 = distinct !{!7, !6}`), as
    LLVM requires of `!llvm.loop`; llvmlite's add_metadata makes neither."""

    def descr(self, buf: list[str]) -> None:
        props = ", ".join(op.get_reference() for op in self.operands)
        buf += (f"distinct !{{ {self.get_reference()}, {props} }}", "\n")


def not_vectorized(module: ir.Module) -> ir.values.MDValue:
    """A new loop ID asking LLVM's loop vectorizer to leave the loop alone."""
    prop = module.add_metadata([ir.MetaDataString(module, "llvm.loop.vectorize.enable"),
                                ir.IntType(1)(0)])
    return _LoopID(module, [prop], name=str(len(module.metadata)))


@contextmanager
def for_range(builder: ir.IRBuilder, start: ir.Value, stop: ir.Value,
              name: str = "i", loop_id: ir.values.MDValue | None = None
              ) -> Iterator[ir.Value]:
    """A counted loop start <= i < stop, step 1; `loop_id` (not_vectorized) goes on its
    latch."""
    pre = builder.block
    head = builder.append_basic_block(f"{name}.head")
    body = builder.append_basic_block(f"{name}.body")
    end = builder.append_basic_block(f"{name}.end")
    builder.branch(head)
    builder.position_at_end(head)
    i = builder.phi(start.type, name=name)
    i.add_incoming(start, pre)
    builder.cbranch(builder.icmp_signed("<", i, stop), body, end)
    builder.position_at_end(body)
    yield i
    nxt = builder.add(i, ir.Constant(start.type, 1), name=f"{name}.next", flags=["nsw"])
    i.add_incoming(nxt, builder.block)
    latch = builder.branch(head)
    if loop_id is not None:
        latch.set_metadata("llvm.loop", loop_id)
    builder.position_at_end(end)


@contextmanager
def for_nest(builder: ir.IRBuilder, ranges: list[tuple[ir.Value, ir.Value]],
             prefix: str = "i", innermost_id: ir.values.MDValue | None = None
             ) -> Iterator[list[ir.Value]]:
    """Nested counted loops, outermost first; yields the induction variables.
    `innermost_id`: the innermost loop's ID (for_range's loop_id)."""
    if not ranges:
        yield []
        return
    (start, stop), rest = ranges[0], ranges[1:]
    with for_range(builder, start, stop, name=f"{prefix}{len(rest)}",
                   loop_id=None if rest else innermost_id) as i, \
            for_nest(builder, rest, prefix, innermost_id) as inner:
        yield [i] + inner


@contextmanager
def if_then(builder: ir.IRBuilder, cond: ir.Value) -> Iterator[None]:
    """Run the body only when cond (i1) holds."""
    with builder.if_then(cond):
        yield


def entry_alloca(builder: ir.IRBuilder, ty: ir.Type, name: str = "",
                 count: int = 0) -> ir.Value:
    """A stack slot in the entry block (SROA turns it into registers); `count` > 0: an
    array of that many `ty` elements, addressed through the returned pointer."""
    fn = builder.function
    with builder.goto_block(fn.entry_basic_block):
        first = fn.entry_basic_block.instructions
        if first:
            builder.position_before(first[0])
        if count:
            return builder.alloca(ty, size=ir.Constant(I64, count), name=name)
        return builder.alloca(ty, name=name)


def intrinsic(builder: ir.IRBuilder, name: str, ret: ir.Type, args: list,
              fastmath: tuple = ()) -> ir.Value:
    """A call of LLVM intrinsic `name` (declared in the builder's module on first use)."""
    module = builder.module
    try:
        f = module.get_global(name)
    except KeyError:
        f = ir.Function(module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(f, args, fastmath=fastmath)


def vector_load(builder: ir.IRBuilder, at: ir.Value, vty: ir.VectorType,
                mask: ir.Value | None = None) -> ir.Value:
    """A float32 vector at `at` (element-aligned); with `mask` (one i1 a lane) only the
    lanes set are read, the others give 0 (a partial last block: nothing past its end)."""
    if mask is None:
        return builder.load(at, typ=vty, align=4)
    return intrinsic(builder, f"llvm.masked.load.v{vty.count}f32.p0", vty,
                     [at, ir.Constant(ir.IntType(32), 4), mask,
                      ir.Constant(vty, [0.0] * vty.count)])


def vector_store(builder: ir.IRBuilder, v: ir.Value, at: ir.Value,
                 mask: ir.Value | None = None) -> None:
    """Store float32 vector v at `at` (element-aligned); with `mask`, its lanes set only."""
    if mask is None:
        builder.store(v, at, align=4)
    else:
        intrinsic(builder, f"llvm.masked.store.v{v.type.count}f32.p0", ir.VoidType(),
                  [v, at, ir.Constant(ir.IntType(32), 4), mask])


def splat(builder: ir.IRBuilder, x: ir.Value, lanes: int) -> ir.Value:
    """x (a scalar of any type) in every lane of a vector of `lanes` lanes."""
    vty = ir.VectorType(x.type, lanes)
    i32 = ir.IntType(32)
    v = builder.insert_element(ir.Constant(vty, ir.Undefined), x, ir.Constant(i32, 0))
    return builder.shuffle_vector(v, ir.Constant(vty, ir.Undefined),
                                  ir.Constant(ir.VectorType(i32, lanes), [0] * lanes))


def kernel_entry(module: ir.Module, name: str, names: list[str], exact_division: bool = False
                 ) -> tuple[ir.IRBuilder, dict[str, ir.Value], ir.Function]:
    """`void name(ptr bufs, i64 start, i64 stop)`, the form of every generated library
    kernel (GEMM, depthwise Conv, attention): its builder at the entry block, the buffer
    pointers bufs[0..] loaded under `names`, and the function (args 1, 2: start, stop).
    `exact_division`: no reciprocal estimates for fdiv (what LLVM's defaults allow)."""
    ptr_ty = ir.PointerType()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr_ty, I64, I64]), name)
    if exact_division:
        set.add(fn.attributes, '"reciprocal-estimates"="none"')
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    ptr = {nm: b.load(b.gep(fn.args[0], [ir.Constant(I64, j)], source_etype=ptr_ty),
                      typ=ptr_ty, name=nm)
           for j, nm in enumerate(names)}
    return b, ptr, fn
