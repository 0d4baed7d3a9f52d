"""CPU library calls (backends/cpu/library.py): each implementation vs the op's NumPy
reference and onnxruntime, written into preallocated output arrays."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from autoclust.backends.cpu import background, library
from support.op_harness import one_node_model, run_ort

from autoclust import ops
from autoclust.errors import UnsupportedOpError
from autoclust.kernel import ir as kir

RNG = np.random.default_rng(7)
IMPLS = ("mlas", "numpy", "ref")


def rand(*shape: int, dtype: str = "float32") -> np.ndarray:
    if np.dtype(dtype).kind == "i":
        return RNG.integers(-5, 6, shape).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


def types(arrays: list) -> list:
    return [None if x is None else (x.dtype, x.shape) for x in arrays]


def check(op: str, inputs: list, attrs: dict[str, Any] | None = None, n_out: int = 1,
          consts: tuple[int, ...] = (), ort_check: bool = True, tol: float = 1e-4) -> set[str]:
    """Every available implementation == reference (== onnxruntime); returns the impls run."""
    attrs = dict(attrs or {})
    expected = ops.get(op).ref(list(inputs), attrs)[:n_out]
    if ort_check:
        feeds = {f"in{i}": x for i, x in enumerate(inputs) if x is not None}
        got_ort = run_ort(one_node_model(op, inputs, attrs, n_out, 18), feeds)
        for e, g in zip(expected, got_ort):
            np.testing.assert_allclose(g, e, rtol=tol, atol=tol, err_msg=f"ort vs ref {op}")
    out_types = [(e.dtype, e.shape) for e in expected]
    constants = {i: inputs[i] for i in consts}
    ran = set()
    for impl in IMPLS:
        try:
            fn = library.make_call(op, attrs, types(inputs), out_types, 1, constants, impl=impl)
        except UnsupportedOpError:
            continue
        ran.add(impl)
        assert fn.impl == impl
        outs = [np.full(e.shape, 99, e.dtype) for e in expected]
        held = list(outs)
        fn(inputs, outs)
        for k, (o, e) in enumerate(zip(held, expected)):
            assert o is outs[k]
            tol_k = tol * (30 if e.dtype == np.float16 else 1)
            np.testing.assert_allclose(o, e, rtol=tol_k, atol=tol_k,
                                       err_msg=f"{op} impl={impl} {attrs}")
        # New input arrays (not the ones bound last call) and new values: rebinding works.
        fresh = [x if x is None or i in consts else np.asarray(x * 2, x.dtype)
                 for i, x in enumerate(inputs)]
        want = ops.get(op).ref(fresh, attrs)[:n_out]
        fn(fresh, outs)
        for o, e in zip(outs, want):
            np.testing.assert_allclose(o, e, rtol=tol * 2, atol=tol * 2, err_msg=f"{op} {impl}")
    assert ran, f"no implementation of {op}"
    return ran


@pytest.mark.parametrize("a,b", [
    ((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)),
    ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (5, 4, 6)), ((2, 3, 4), (1, 4, 5)),
    ((5, 16, 32), (5, 32, 8)), ((64, 64), (64, 64)), ((0, 4), (4, 3)),
])
def test_matmul_float32(a: tuple, b: tuple) -> None:
    ran = check("MatMul", [rand(*a), rand(*b)])
    assert {"mlas", "numpy"} <= ran


def test_matmul_constant_b_prepacked() -> None:
    assert check("MatMul", [rand(8, 32), rand(32, 16)], consts=(1,)) >= {"mlas", "numpy"}


@pytest.mark.parametrize("dtype", ["float64", "int32", "int64", "float16"])
def test_matmul_dtypes(dtype: str) -> None:
    ran = check("MatMul", [rand(2, 3, 4, dtype=dtype), rand(2, 4, 5, dtype=dtype)],
                ort_check=dtype != "float16", tol=1e-3 if dtype == "float16" else 1e-6)
    assert ("mlas" in ran) == (dtype == "float64")


def test_matmul_int32_wraps_like_reference() -> None:
    a = np.full((2, 2), 2**20, np.int32)
    check("MatMul", [a, a])


@pytest.mark.parametrize("attrs,c", [
    ({}, None), ({"transA": 1}, (5,)), ({"transB": 1, "alpha": 0.5}, (3, 5)),
    ({"transA": 1, "transB": 1, "alpha": 2.0, "beta": 0.25}, (1, 5)), ({"beta": 3.0}, (3, 1)),
    ({"alpha": 1.5}, ()),
])
def test_gemm(attrs: dict, c: tuple | None) -> None:
    a = rand(4, 3) if attrs.get("transA") else rand(3, 4)
    b = rand(5, 4) if attrs.get("transB") else rand(4, 5)
    inputs = [a, b] + ([] if c is None else [rand(*c)])
    assert check("Gemm", inputs, attrs) >= {"mlas", "numpy"}
    check("Gemm", inputs, attrs, consts=(1,))


def test_gemm_int64_numpy_only() -> None:
    ran = check("Gemm", [rand(3, 4, dtype="int64"), rand(4, 2, dtype="int64"),
                         rand(2, dtype="int64")], {"alpha": 2.0}, ort_check=False)
    assert ran == {"numpy"}


CONV_CASES = [
    ((1, 3, 8, 8), (4, 3, 3, 3), {}),
    ((2, 4, 9, 7), (6, 2, 3, 3), {"group": 2, "strides": [2, 1], "pads": [1, 0, 1, 2]}),
    ((1, 2, 10, 10), (3, 2, 3, 3), {"dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    ((2, 6, 7, 7), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1]}),            # depthwise
    ((1, 4, 6, 6), (8, 1, 3, 3), {"group": 4, "strides": [2, 2]}),               # multiplier 2
    ((2, 8, 5, 5), (4, 8, 1, 1), {}),                                            # pointwise
    ((1, 3, 11), (2, 3, 4), {"auto_pad": "SAME_UPPER", "strides": [2]}),         # 1-D
    ((1, 2, 4, 5, 6), (3, 2, 2, 2, 3), {"pads": [0, 1, 1, 0, 1, 1]}),            # 3-D
    ((1, 3, 8, 8), (4, 3, 3, 3), {"auto_pad": "SAME_LOWER"}),
]


@pytest.mark.parametrize("x,w,attrs", CONV_CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_conv(x: tuple, w: tuple, attrs: dict, bias: bool) -> None:
    inputs = [rand(*x), rand(*w)] + ([rand(w[0])] if bias else [])
    assert check("Conv", inputs, attrs) >= {"mlas", "numpy"}


def test_conv_float64_and_float16_numpy() -> None:
    x, w = rand(1, 2, 6, 6), rand(3, 2, 3, 3)
    assert check("Conv", [x.astype("float64"), w.astype("float64")], ort_check=False) \
        == {"numpy"}
    check("Conv", [x.astype("float16"), w.astype("float16")], ort_check=False, tol=1e-3)


def test_conv_constant_weights() -> None:
    check("Conv", [rand(1, 3, 8, 8), rand(4, 3, 3, 3), rand(4)], {"pads": [1, 1, 1, 1]},
          consts=(1, 2))


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1},
    {"kernel_shape": [2, 2], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"kernel_shape": [3], "strides": [2], "pads": [1, 0]},
])
def test_pool(op: str, attrs: dict) -> None:
    if op == "MaxPool" and "count_include_pad" in attrs:
        attrs = {**{k: v for k, v in attrs.items() if k != "count_include_pad"},
                 "dilations": [2, 1]}
    x = rand(2, 3, 9) if len(attrs["kernel_shape"]) == 1 else rand(2, 3, 9, 8)
    assert check(op, [x], attrs) >= {"mlas", "numpy"}


def test_maxpool_indices_and_float64() -> None:
    x = rand(1, 2, 6, 6)
    assert check("MaxPool", [x], {"kernel_shape": [2, 2]}, n_out=2) >= {"mlas", "ref"}
    ran = check("MaxPool", [x.astype("float64")], {"kernel_shape": [3, 3], "pads": [1] * 4})
    assert ran >= {"mlas", "numpy"}


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (1, 4, 7), (2, 2, 2, 3, 3)])
def test_global_pool(op: str, shape: tuple) -> None:
    assert check(op, [rand(*shape)]) >= {"mlas", "numpy"}


@pytest.mark.parametrize("eq,shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]), ("bhqd,bhkd->bhqk", [(2, 3, 4, 8), (2, 3, 5, 8)]),
    ("...ij->...ji", [(2, 3, 4)]), ("ij,jk,kl->il", [(3, 4), (4, 5), (5, 2)]),
    ("ii->i", [(4, 4)]),
])
def test_einsum(eq: str, shapes: list) -> None:
    assert "numpy" in check("Einsum", [rand(*s) for s in shapes], {"equation": eq})


def test_conv_transpose() -> None:
    attrs = {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}
    assert check("ConvTranspose", [rand(1, 4, 5, 5), rand(4, 3, 3, 3), rand(3)], attrs) \
        >= {"mlas", "ref"}


def test_unsupported_reasons() -> None:
    assert "not a library call" in library.supported("Relu", {})
    assert "auto_pad" in library.supported("Conv", {"auto_pad": "BOGUS"})
    # dtypes are the op table's: one definition (OpDef.dtypes), read by clustering
    assert np.dtype("int32") not in ops.get("Conv").compiled_dtypes
    assert np.dtype("int32") in ops.get("MatMul").compiled_dtypes
    with pytest.raises(UnsupportedOpError, match="mlas"):
        library.make_call("Conv", {}, [(np.dtype("float64"), (1, 1, 4, 4))] * 2,
                          [(np.dtype("float64"), (1, 1, 2, 2))], impl="mlas")


def test_make_call_for_kernel_ir_thunk() -> None:
    a, w = rand(6, 8), rand(8, 4)
    bufs = [kir.Buffer(0, "a", "float32", a.shape, "input"),
            kir.Buffer(1, "w", "float32", w.shape, "const"),
            kir.Buffer(2, "y", "float32", (6, 4), "output")]
    thunk = kir.LibraryCall("MatMul", (0, 1), (2,), (), ("mm",))
    fn = library.make_call_for(thunk, bufs, threads=1, constants={1: w})
    y = np.empty((6, 4), np.float32)
    fn([a, w], [y])
    np.testing.assert_allclose(y, a @ w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("a,b", [((2, 8), (8, 8)), ((128, 128), (128, 128)),
                                 ((256, 256), (256, 1024))])
def test_choice_is_cached_and_printed(a: tuple, b: tuple) -> None:
    in_types = [(np.dtype("float32"), a), (np.dtype("float32"), b)]
    out_types = [(np.dtype("float32"), (a[0], b[1]))]
    fn = library.make_call("MatMul", {}, in_types, out_types, threads=2)
    print(f"MatMul {a}x{b}: {fn.impl} ({fn.note})")
    if a[0] * a[1] * b[1] * 2 < library.SMALL_FLOPS:
        assert fn.impl == "numpy"
    assert library.wait_background(60)  # a measurement may switch fn (and the decision)
    again = library.make_call("MatMul", {}, in_types, out_types, threads=2)
    assert (again.impl, again.note) == (fn.impl, fn.note)
    x, y = rand(*a), rand(*b)
    out = np.empty(out_types[0][1], np.float32)
    again([x, y], [out])
    np.testing.assert_allclose(out, x @ y, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("op,x_shape,impl", [
    ("MaxPool", (1, 2, 8, 8), "numpy"), ("MaxPool", (8, 16, 64, 64), "mlas"),
    ("AveragePool", (2, 16, 32, 32), "mlas"), ("GlobalAveragePool", (8, 16, 32, 32), "mlas"),
    ("Conv", (1, 1, 4, 4), "numpy"), ("Conv", (4, 16, 32, 32), "mlas")])
def test_choice_rule_by_work(op: str, x_shape: tuple, impl: str) -> None:
    """Small work goes to numpy (call overhead), the rest to MLAS; no probing, same answer."""
    x = rand(*x_shape)
    inputs, attrs = [x], {}
    if op == "Conv":
        inputs.append(rand(x_shape[1], x_shape[1], 3, 3))
        attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    elif "Global" not in op:
        attrs = {"kernel_shape": [2, 2], "strides": [2, 2]}
    expected = ops.get(op).ref(inputs, attrs)[0]
    fn = library.make_call(op, attrs, types(inputs), [(expected.dtype, expected.shape)], 2)
    assert fn.impl == impl, fn.note
    assert library.decisions()  # the choice is recorded for `explain`-style dumps
    out = np.empty_like(expected)
    fn(inputs, [out])
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("impl", ["mlas", "numpy"])
def test_strided_outputs_are_filled(impl: str) -> None:
    """Outputs that are views with strides (e.g. a transposed array) get the right values."""
    x, w = rand(2, 3, 9, 9), rand(4, 3, 3, 3)
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    expected = ops.get("Conv").ref([x, w], attrs)[0]
    fn = library.make_call("Conv", attrs, types([x, w]), [(expected.dtype, expected.shape)], 2,
                           impl=impl)
    base = np.zeros((9, 9, 4, 2), np.float32)
    out = base.transpose(3, 2, 0, 1)  # shape (2, 4, 9, 9), not C-contiguous
    fn([x, w], [out])
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
    a, b = rand(6, 5), rand(5, 7)
    mm = library.make_call("MatMul", {}, types([a, b]), [(np.dtype("float32"), (6, 7))], 2,
                           impl=impl)
    y = np.zeros((7, 6), np.float32).T
    mm([a, b], [y])
    np.testing.assert_allclose(y, a @ b, rtol=1e-4, atol=1e-4)


def test_mlas_strided_operands_go_through_kept_dense_copies(monkeypatch) -> None:
    """A strided input (V among the fused Q, K, V) and a strided output (the heads' merge)
    go through dense stand-ins that are refreshed every call but bound to onnxruntime once:
    bound afresh each call, Whisper's P.V took 1.3-1.6x its time."""
    from autoclust.backends.cpu import mlas
    binds: list[str] = []
    real = mlas._binder

    def spying(sess):
        bind, run = real(sess)
        return (lambda name, x, output: (binds.append(name), bind(name, x, output))), run
    monkeypatch.setattr(mlas, "_binder", spying)
    f32 = np.dtype("float32")
    fn = library.make_call("MatMul", {}, [(f32, (2, 5, 5)), (f32, (2, 5, 3))], [(f32, (2, 5, 3))],
                           2, impl="mlas")
    p, qkv = rand(2, 5, 5), np.zeros((5, 9), np.float32)
    v = np.lib.stride_tricks.as_strided(qkv[:, 3:], (2, 5, 3), (12, 36, 4))  # two heads' V
    out = np.zeros((5, 2, 3), np.float32).transpose(1, 0, 2)  # merged back per row
    for _ in range(3):
        qkv[...] = rand(5, 9)  # new values each call: the stand-in is refreshed
        fn([p, v], [out])
        np.testing.assert_allclose(out, p @ np.array(v), rtol=1e-5, atol=1e-5)
    assert binds.count("in1") == 1 and binds.count("in0") == 1


@pytest.mark.parametrize("impl", ["mlas", "numpy"])
def test_gemm_with_batched_a_is_matmul_plus_bias(impl: str):
    # The folded MatMul + bias call: Gemm on a [B, S, K] A flattens the batch dims into M.
    a, b, c = rand(3, 40, 24), rand(24, 48), rand(48)
    fn = library.make_call("Gemm", {}, types([a, b, c]), [(a.dtype, (3, 40, 48))], 1,
                           {1: b, 2: c}, impl=impl)
    assert fn.impl == impl
    for x in (a, a * 2, a):  # same array again, a new one, and back: views are rebound
        y = np.full((3, 40, 48), 99, np.float32)
        fn([x, b, c], [y])
        np.testing.assert_allclose(y, np.matmul(x, b) + c, rtol=1e-4, atol=1e-4)


def test_one_measurement_per_signature(monkeypatch) -> None:
    """Calls of one signature made before its MLAS-against-oneDNN measurement ends (a
    model's twelve layers, each with its own weights) share that one measurement and all
    take its answer, each on its own weights."""
    from autoclust.backends.cpu import choice, onednn
    if onednn.unavailable():
        pytest.skip(f"oneDNN: {onednn.unavailable()}")
    measured = []

    def verdict(key, builders, *args):
        measured.append(sorted(builders))
        return "onednn", "measured mlas 2.000 ms, onednn 1.000 ms (best of 7)"

    monkeypatch.setattr(choice, "measure", verdict)
    monkeypatch.setattr(choice, "known", lambda key, builders: None)
    in_types = [(np.dtype("float32"), (96, 160)), (np.dtype("float32"), (160, 112))]
    out_types = [(np.dtype("float32"), (96, 112))]
    weights = [rand(160, 112) for _ in range(4)]
    library._DECISIONS.clear()
    with library.foreground():  # a first run in progress: the measurement waits for it
        fns = [library.make_call("MatMul", {}, in_types, out_types, 2, {1: w})
               for w in weights]
    assert library.wait_background(60)
    assert measured == [["mlas", "onednn"]]
    x = rand(96, 160)
    for fn, w in zip(fns, weights):
        assert library.current_impl(fn) == "onednn", fn.note
        out = np.empty((96, 112), np.float32)
        fn([x, None], [out])
        np.testing.assert_allclose(out, x @ w, rtol=1e-4, atol=1e-3)


def test_onednn_weights_are_packed_in_the_background(monkeypatch) -> None:
    """A GEMM on oneDNN known beforehand (--cache_dir: a warm process) does not pack its
    weights while it is built: until the background thread has packed them, calls read
    them as they are (right answers either way), then the packed primitive serves."""
    from autoclust.backends.cpu import choice, onednn
    if onednn.unavailable():
        pytest.skip(f"oneDNN: {onednn.unavailable()}")
    library.wait_background(30)
    monkeypatch.setattr(choice, "known", lambda key, builders: ("onednn", "--cache_dir"))
    library._DECISIONS.clear()
    in_types = [(np.dtype("float32"), (96, 160)), (np.dtype("float32"), (112, 160))]
    out_types = [(np.dtype("float32"), (96, 112))]
    w, x = rand(112, 160), rand(96, 160)  # transB: the weights read transposed
    with library.foreground():  # a first run in progress: background tasks wait
        fn = library.make_call("Gemm", {"transB": 1}, in_types, out_types, 2, {1: w})
        assert fn.impl == "onednn", fn.note
        for _ in range(2):
            out = np.empty((96, 112), np.float32)
            fn([x, None], [out])  # the weights come from the call itself
            np.testing.assert_allclose(out, x @ w.T, rtol=1e-4, atol=1e-3)
        assert id(w) not in onednn._PACKINGS  # not packed while the run holds it back
    assert library.wait_background(60)
    assert id(w) in onednn._PACKINGS
    out = np.empty((96, 112), np.float32)
    fn([x, None], [out])
    np.testing.assert_allclose(out, x @ w.T, rtol=1e-4, atol=1e-3)
    # another call of the same weights (a new sequence length) takes the packing at once
    again = library.make_call("Gemm", {"transB": 1},
                              [(np.dtype("float32"), (40, 160)), in_types[1]],
                              [(np.dtype("float32"), (40, 112))], 2, {1: w})
    assert library.wait_background(0)
    out = np.empty((40, 112), np.float32)
    again([x[:40], None], [out])
    np.testing.assert_allclose(out, x[:40] @ w.T, rtol=1e-4, atol=1e-3)


def test_gemm_measurement_times_while_no_compiled_run_is_in_progress(monkeypatch) -> None:
    """The background MLAS-against-oneDNN measurement times on quiet cores: compiled runs
    in progress end first and new ones wait (at run boundaries) until its timing is done,
    while a foreground thread keeps running a compiled cluster."""
    import threading
    import time

    from autoclust.backends.cpu import choice, executable, onednn
    from onnx import TensorProto, helper

    import autoclust
    if onednn.unavailable():
        pytest.skip(f"oneDNN: {onednn.unavailable()}")
    assert library.wait_background(60)  # an earlier test's measurement is not this one
    runs: list[tuple[float, float]] = []
    timed: list[tuple[float, float]] = []
    real_run, real_timed = executable.Executable.run, choice._timed

    def recorded_run(self, inputs):
        with self._lock:  # what a run holds throughout (Executable.run)
            t0 = time.perf_counter()
            time.sleep(0.002)  # a run long enough to be caught in progress
            runs.append((t0, time.perf_counter()))
        return real_run(self, inputs)

    def recorded_timed(*args):
        t0 = time.perf_counter()
        out = real_timed(*args)
        time.sleep(0.15)  # a window the foreground's runs would fall into
        timed.append((t0, time.perf_counter()))
        return out

    monkeypatch.setattr(executable.Executable, "run", recorded_run)
    monkeypatch.setattr(choice, "_timed", recorded_timed)
    monkeypatch.setattr(choice, "known", lambda key, builders: None)
    monkeypatch.setattr(choice, "_disk_get", lambda key: None)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])
    nodes = [helper.make_node("Mul", ["x", "x"], ["a"]), helper.make_node("Add", ["a", "x"], ["b"]),
             helper.make_node("Tanh", ["b"], ["c"]), helper.make_node("Sub", ["c", "x"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    sess = autoclust.InferenceSession(model, must_compile=True, autotune=False, threads=1)
    feed = {"x": rand(4, 8)}
    sess.run(None, feed)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            sess.run(None, feed)

    worker = threading.Thread(target=loop)
    worker.start()
    try:
        time.sleep(0.05)
        library._DECISIONS.clear()
        in_types = [(np.dtype("float32"), (96, 160)), (np.dtype("float32"), (160, 112))]
        library.make_call("MatMul", {}, in_types, [(np.dtype("float32"), (96, 112))], 2,
                          {1: rand(160, 112)})
        assert library.wait_background(60)
        time.sleep(0.05)
    finally:
        stop.set()
        worker.join()
    assert len(timed) == 1 and len(runs) > 10
    (start, end), = timed
    during = [r for r in runs if r[0] < end and r[1] > start]
    assert not during, f"{len(during)} compiled runs overlapped the timing"
    assert any(r[0] >= end for r in runs) and any(r[1] <= start for r in runs)


def test_quiet_cores_gives_up_a_lock_it_cannot_take(monkeypatch) -> None:
    """A run lock not given up in time (a run inside a run holds one and waits for
    another) makes the measurement give back the locks it took and time anyway, not wait
    forever or keep the others held."""
    import threading
    import time

    from autoclust.backends.cpu.executable import Arena
    free, held = Arena(), Arena()
    for a in (free, held):
        background.gate(a)
    monkeypatch.setattr(background, "MAX_QUIET_WAIT_S", 0.2)
    held.lock.acquire()
    try:
        t0 = time.perf_counter()
        with background.quiet_cores():
            assert free.lock.acquire(blocking=False), "a lock kept while timing unquiet"
            free.lock.release()
        assert time.perf_counter() - t0 < 1.0
    finally:
        held.lock.release()
    with background.quiet_cores():  # all free: all taken
        assert not free.lock.acquire(blocking=False)
        assert not held.lock.acquire(blocking=False)
        grabbed = []
        t = threading.Thread(target=lambda: grabbed.append(free.lock.acquire(timeout=0.05)))
        t.start()
        t.join()
        assert grabbed == [False]
    assert free.lock.acquire(blocking=False) and held.lock.acquire(blocking=False)
    free.lock.release()
    held.lock.release()
