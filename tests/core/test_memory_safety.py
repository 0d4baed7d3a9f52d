"""No compiled kernel reads or writes outside a buffer, and no value is allocated that
cannot be (issue 24 items 1 and 12):

- the bounds proof (autoclust/kernel/bounds.py) rejects a kernel whose indexing is broken
  on purpose, naming the kernel and the buffer, and accepts the real lowerings;
- --check_bounds makes the same broken kernels raise OutOfBoundsError at run time (scalar
  loads, stores, the explicit vector loads of max/min rows), and leaves correct ones alone;
- shapes the ops reject raise InvalidInputError naming the node, typed as onnxruntime's
  exception; absurd sizes raise InvalidShapeError (onnxruntime's Fail) before anything is
  allocated, and --max_buffer_bytes lowers the limit.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
import pytest
from autoclust.backends import cpu
from autoclust.importers.onnx import import_model

import autoclust
from autoclust import flags as flags_mod
from autoclust import symbolic
from autoclust.compile import lower_graph
from autoclust.errors import CompileError, InvalidShapeError, OutOfBoundsError
from autoclust.kernel import bounds
from autoclust.kernel import ir as kir

F = np.float32
FAIL = ort.capi.onnxruntime_pybind11_state.Fail
INVALID = ort.capi.onnxruntime_pybind11_state.InvalidArgument


def _model(text: str, opset: int = 18) -> onnx.ModelProto:
    return onnx.parser.parse_model(f'<ir_version: 10, opset_import: ["" : {opset}]>\n{text}')


GATHER = _model("g (float[5,3] x, int64[4] i) => (float[4,3] y) "
                "{ g = Gather <axis = 0> (x, i) y = Exp (g) }")
GATHER_FEEDS = [np.arange(15, dtype=F).reshape(5, 3), np.array([0, 1, 4, -1])]
ROWMAX = _model("g (float[3,40] x) => (float[3] y) { ax = Constant <value = int64[1] {1}> () "
                "e = Exp (x) y = ReduceMax <keepdims = 0> (e, ax) }")
ROWMAX_FEEDS = [np.linspace(-2, 2, 120, dtype=F).reshape(3, 40)]


def _program(model: onnx.ModelProto) -> kir.Program:
    return lower_graph(import_model(model), flags_mod.parse(""), cpu)


def _shift_loads(e: kir.Expr, buf: int, by: int) -> kir.Expr:
    """e with every load of buffer `buf` moved `by` elements (broken indexing)."""
    if isinstance(e, kir.Load) and e.buf == buf:
        return dataclasses.replace(e, index=dataclasses.replace(e.index,
                                                                const=e.index.const + by))
    if isinstance(e, kir.Op):
        return dataclasses.replace(e, args=tuple(_shift_loads(a, buf, by) for a in e.args))
    return e


def _broken(program: kir.Program, name: str, by: int, stores: bool = False) -> kir.Program:
    """The program with loads of buffer `name` (or, with stores, the stores into it)
    shifted by `by` elements in every kernel."""
    buf = next(b.id for b in program.buffers if b.name == name)
    thunks = []
    for t in program.thunks:
        if isinstance(t, kir.Kernel):
            reds = tuple(dataclasses.replace(r, expr=_shift_loads(r.expr, buf, by))
                         for r in t.reductions)
            sts = tuple(dataclasses.replace(
                s, expr=_shift_loads(s.expr, buf, by),
                index=dataclasses.replace(s.index, const=s.index.const + by)
                if stores and s.buf == buf else s.index) for s in t.stores)
            t = dataclasses.replace(t, reductions=reds, stores=sts)
        thunks.append(t)
    return dataclasses.replace(program, thunks=thunks)


# ---- the bounds proof -------------------------------------------------------------------

def test_bounds_proof_accepts_real_lowerings_and_rejects_broken_indexing():
    program = _program(GATHER)
    bounds.check_program(program)  # the lowering clamps the gathered row: proven
    with pytest.raises(CompileError, match=r"kernel k0 \(nodes: .*Gather_0.*\): a load of "
                                           r"'x' \(float32\[5, 3\], 15 elements\) may reach "
                                           r"elements \[100, 114\]"):
        bounds.check_program(_broken(program, "x", 100))
    with pytest.raises(CompileError, match="a store to 'y'"):
        bounds.check_program(_broken(program, "y", 1, stores=True))


def test_bounds_proof_of_a_binding_evaluates_only_what_it_reads():
    """A shape class's binding proves its accesses at the bound sizes without substituting
    the kernels' whole expressions (Parametric.bind): the same verdict and message as on
    the program substituted whole, for a gather (clamps in symbolic dims) and a kernel of
    extent 3n."""
    model = _model("g (float[n,3] x, int64[4] i) => (float[4,3] y, float[n,3] z) "
                   "{ g = Gather <axis = 0> (x, i) y = Exp (g) s = Sigmoid (x) z = Mul (s, s) }")
    sess = autoclust.InferenceSession(model.SerializeToString(), autotune=False,
                                      min_cluster_size=1)
    for n in (5, 7):
        sess.run(None, {"x": np.ones((n, 3), F), "i": np.array([0, 1, 2, -1])})
    programs = [c.exe.program for r in sess._runtime.runners for c in r.classes]
    assert len(programs) == 2
    assert all(symbolic.symbols_of(p.buffers) == {"n"} for p in programs)
    for program in programs:
        broken = _broken(program, "x", 3)  # one row past x in every kernel
        for n in (1, 6):
            bounds.check_program(program, {"n": n})
            bounds.check_program(symbolic.substitute(program, {"n": n}))
            with pytest.raises(CompileError) as whole:
                bounds.check_program(symbolic.substitute(broken, {"n": n}))
            with pytest.raises(CompileError) as parts:
                bounds.check_program(broken, {"n": n})
            assert str(parts.value) == str(whole.value)
            assert f"[{n}, 3], {3 * n} elements)" in str(parts.value)
    # n = 0: the kernel of extent 3n runs nothing, so even broken indexing proves nothing
    bounds.check_program(_broken(programs[1], "x", 3), {"n": 0})


def test_bounds_of_selects_narrow_their_operand():
    # reflect Pad's position: t = |p| mod 2(n-1); t < n ? t : 2(n-1) - t  lies in [0, n-1]
    rank, n = 1, 5
    p = kir.Op("sub", (kir.Index(kir.unit(0, rank)), kir.Const(3, "int64")), "int64")
    t = kir.Op("mod", (kir.Op("abs", (p,), "int64"), kir.Const(8, "int64")), "int64")
    cond = kir.Op("lt", (t, kir.Const(n, "int64")), "bool")
    pos = kir.Op("select", (cond, t, kir.Op("sub", (kir.Const(8, "int64"), t), "int64")),
                 "int64")
    ranges = bounds.Ranges([(0, 10)])
    assert ranges.of(pos) == (0, n - 1)
    assert ranges.of(t) == (0, 7)
    # a loaded index is any int64 until clamped
    x = kir.Load(0, kir.constant(0, rank), "int64")
    clamped = kir.Op("max", (kir.Op("min", (x, kir.Const(4, "int64")), "int64"),
                             kir.Const(0, "int64")), "int64")
    assert ranges.of(x)[1] == 2 ** 63 - 1 and ranges.of(clamped) == (0, 4)


# ---- --check_bounds ---------------------------------------------------------------------

def test_check_bounds_catches_a_broken_gather_load():
    exe = cpu.compile(_broken(_program(GATHER), "x", 100), flags_mod.parse("--check_bounds"))
    with pytest.raises(OutOfBoundsError, match=r"kernel k0 \(nodes: .*Gather_0.*\): a load "
                                               r"of buffer 'x' \(float32\[5, 3\], 15 elements\)"
                                               r" at element 100"):
        exe.run(GATHER_FEEDS)
    with pytest.raises(OutOfBoundsError):  # the guard was cleared: it catches it again
        exe.run(GATHER_FEEDS)


def test_check_bounds_catches_a_broken_store():
    exe = cpu.compile(_broken(_program(GATHER), "y", 3, stores=True),
                      flags_mod.parse("--check_bounds"))
    with pytest.raises(OutOfBoundsError, match=r"a store to buffer 'y' \(float32\[4, 3\], "
                                               r"12 elements\) at element 12"):
        exe.run(GATHER_FEEDS)


def test_check_bounds_catches_a_broken_vector_load():
    program = _program(ROWMAX)
    text = kir.format_program(program)
    assert "r0 = max" in text  # the explicit vector path of backends/cpu/vectorize.py
    exe = cpu.compile(_broken(program, "x", 1), flags_mod.parse("--check_bounds"))
    with pytest.raises(OutOfBoundsError, match=r"a load of buffer 'x' \(float32\[3, 40\], "
                                               r"120 elements\) at element 1\d\d \(\d+ lanes\)"):
        exe.run(ROWMAX_FEEDS)


@pytest.mark.parametrize("model, feeds", [(GATHER, GATHER_FEEDS), (ROWMAX, ROWMAX_FEEDS)])
def test_check_bounds_leaves_correct_kernels_alone(model, feeds):
    program = _program(model)
    checked = cpu.compile(program, flags_mod.parse("--check_bounds")).run(feeds)
    plain = cpu.compile(program, flags_mod.parse("")).run(feeds)
    for c, p in zip(checked, plain):
        np.testing.assert_array_equal(c, p)


def test_check_bounds_session_flag_on_padded_and_concatenated_rows():
    m = _model("g (float[3,5] x, float[3,2] z) => (float[3,7] y, float[3,9] p) { "
               "y = Concat <axis = 1> (x, z) pads = Constant <value = int64[4] {0, 2, 0, 2}> "
               "() p = Pad <mode = \"reflect\"> (x, pads) }")
    feeds = {"x": np.arange(15, dtype=F).reshape(3, 5), "z": -np.ones((3, 2), F)}
    got = autoclust.InferenceSession(m, check_bounds=True, must_compile=True,
                                     min_cluster_size=1).run(None, feeds)
    np.testing.assert_array_equal(got[0], np.concatenate([feeds["x"], feeds["z"]], 1))
    np.testing.assert_array_equal(got[1], np.pad(feeds["x"], [(0, 0), (2, 2)], "reflect"))


# ---- shapes the ops reject, sizes nobody can allocate ------------------------------------

EXPAND = "g (float[1,1] x) => (float[?,?] y) {{ s = Constant <value = int64[2] {{{a}, {b}}}> " \
    "() e = Expand (x, s) y = Relu (e) }}"


TIB = r"needs 4398046511104 bytes \(4.00 TiB of float32\), more than this machine's memory"


@pytest.mark.parametrize("shape, why", [((2 ** 20, 2 ** 20), TIB),
                                        ((2 ** 31, 2 ** 31), "needs 18446744073709551616 bytes: more than int64 holds"),
                                        ((-1, 4), "has a negative dim")])
@pytest.mark.parametrize("flags", [{"must_compile": True, "min_cluster_size": 1},
                                   {"device": "interpreter", "min_cluster_size": 1}])
def test_absurd_shapes_raise_onnxruntimes_fail_naming_the_node(shape, why, flags):
    model = _model(EXPAND.format(a=shape[0], b=shape[1]))
    feeds = {"x": np.ones((1, 1), F)}
    with pytest.raises(FAIL):
        ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    with pytest.raises(InvalidShapeError, match=f"node 'Expand_1' \\(Expand\\): output 'e' "
                                                f"of shape \\[{shape[0]},{shape[1]}\\] {why}") \
            as info:
        autoclust.InferenceSession(model, **flags).run(None, feeds)
    assert isinstance(info.value, FAIL) and not isinstance(info.value, INVALID)


def test_max_buffer_bytes_limits_every_value_of_a_cluster():
    model = _model("g (float[1000] x) => (float[1000] y) { t = Tanh (x) y = Relu (t) }")
    feeds = {"x": np.ones(1000, F)}
    ok = autoclust.InferenceSession(model, min_cluster_size=1, max_buffer_bytes=4000)
    np.testing.assert_allclose(ok.run(None, feeds)[0], np.tanh(np.ones(1000, F)), rtol=1e-6)
    small = autoclust.InferenceSession(model, min_cluster_size=1, max_buffer_bytes=3999)
    with pytest.raises(InvalidShapeError, match=r"node 'Tanh_0' \(Tanh\): output 't' of shape "
                                                r"\[1000\] needs 4000 bytes \(3.91 KiB of "
                                                r"float32\), more than --max_buffer_bytes=3999"):
        small.run(None, feeds)
