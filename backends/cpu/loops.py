"""Loop and variable helpers for llvmlite codegen: no hand-placed blocks in kernel code.

    with for_range(builder, start, stop) as i:
        ...  # body; i is the i64 induction variable
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from llvmlite import ir

I64 = ir.IntType(64)


@contextmanager
def for_range(builder: ir.IRBuilder, start: ir.Value, stop: ir.Value,
              name: str = "i") -> Iterator[ir.Value]:
    """A counted loop start <= i < stop, step 1."""
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
    builder.branch(head)
    builder.position_at_end(end)


@contextmanager
def for_nest(builder: ir.IRBuilder, ranges: list[tuple[ir.Value, ir.Value]],
             prefix: str = "i") -> Iterator[list[ir.Value]]:
    """Nested counted loops, outermost first; yields the induction variables."""
    if not ranges:
        yield []
        return
    (start, stop), rest = ranges[0], ranges[1:]
    with for_range(builder, start, stop, name=f"{prefix}{len(rest)}") as i, \
            for_nest(builder, rest, prefix) as inner:
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


def splat(builder: ir.IRBuilder, x: ir.Value, lanes: int) -> ir.Value:
    """x (a scalar of any type) in every lane of a vector of `lanes` lanes."""
    vty = ir.VectorType(x.type, lanes)
    i32 = ir.IntType(32)
    v = builder.insert_element(ir.Constant(vty, ir.Undefined), x, ir.Constant(i32, 0))
    return builder.shuffle_vector(v, ir.Constant(vty, ir.Undefined),
                                  ir.Constant(ir.VectorType(i32, lanes), [0] * lanes))
