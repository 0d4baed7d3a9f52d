"""Our prefetching GEMM over packed weights (backends/cpu/packed.py): the kernel against
onnxruntime for every shape class it takes (a partial last panel, balanced row tiles, M
blocks, Gemm's alpha, beta and bias, transB), on one and two threads and with AVX2's
blocking; which calls it takes; and the three-way trial that decides between it, MLAS and
oneDNN in the plan."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from autoclust.backends.cpu import inplan, library, packed
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(27)
F32 = np.float32


def _ort(op: str, attrs: dict, a: np.ndarray, b: np.ndarray, c: np.ndarray | None,
         out_shape: tuple) -> np.ndarray:
    """onnxruntime's result of one MatMul/Gemm node with B (and C) as initializers."""
    inits = [numpy_helper.from_array(b, "b")] + ([] if c is None else
                                                  [numpy_helper.from_array(c, "c")])
    node = helper.make_node(op, ["a", "b"] + ([] if c is None else ["c"]), ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        "a", TensorProto.FLOAT, list(a.shape))], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, list(out_shape))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"a": a})[0]


def _run(op: str, attrs: dict, a: np.ndarray, b: np.ndarray, c: np.ndarray | None,
         threads: int) -> tuple[np.ndarray, packed.PackedSpec]:
    in_types = [(F32, a.shape), (F32, b.shape)] + ([] if c is None else [(F32, c.shape)])
    n = b.shape[0] if attrs.get("transB", 0) else b.shape[1]
    out_shape = a.shape[:-1] + (n,)
    consts = {1: b} if c is None else {1: b, 2: c}
    spec = packed.spec_for(op, attrs, in_types, [(F32, out_shape)], consts)
    assert spec is not None
    run = packed.runner(spec, b, bool(attrs.get("transB", 0)), threads,
                        None if c is None else c)
    y = np.full(out_shape, np.nan, F32)
    run([a, None] + ([] if c is None else [None]), [y])
    return y, spec


CASES = [  # (m, k, n): the shapes of the exports it serves and the edges of its blocks
    (128, 768, 3072),   # BERT's first FFN GEMM: whole panels, 10 row tiles
    (49, 768, 3072),    # ConvNeXt's last stage: balanced tiles 13 + 13 + 13 + 10
    (197, 768, 2304),   # ViT's fused Q/K/V
    (64, 512, 1000),    # a partial last panel (1000 = 31 x 32 + 8)
    (300, 700, 70),     # two panels, the second of 6 columns; K not a multiple of 16
    (512, 768, 96),     # M blocks: 1 MB of A is 341 rows of 768
    (15, 640, 4096),    # one tile and a row over (14 + 1)
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m,k,n", CASES)
def test_matmul_matches_onnxruntime(m, k, n, threads):
    a = RNG.standard_normal((1, m, k)).astype(F32)
    b = (RNG.standard_normal((k, n)) / np.sqrt(k)).astype(F32)
    y, spec = _run("MatMul", {}, a, b, None, threads)
    want = _ort("MatMul", {}, a, b, None, (1, m, n))
    np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-5)
    assert spec.chunks(threads) >= 1 and (m > spec.m_block_rows()) == (len(spec.mblocks()) > 1)


@pytest.mark.parametrize("bias", ["row", "row2d", "scalar"])
@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_alpha_beta_bias_and_trans_b(bias, trans_b):
    m, k, n = 100, 384, 300
    a = RNG.standard_normal((m, k)).astype(F32)
    b = (RNG.standard_normal((n, k) if trans_b else (k, n)) / np.sqrt(k)).astype(F32)
    c = {"row": RNG.standard_normal(n), "row2d": RNG.standard_normal((1, n)),
         "scalar": RNG.standard_normal(1)}[bias].astype(F32)
    attrs = {"alpha": 0.5, "beta": -2.0, "transB": trans_b}
    y, spec = _run("Gemm", attrs, a, b, c, 2)
    assert spec.bias == ("scalar" if bias == "scalar" else "row")
    np.testing.assert_allclose(y, _ort("Gemm", attrs, a, b, c, (m, n)), rtol=2e-5, atol=2e-5)


def test_special_values_propagate_as_onnxruntimes():
    """NaN, +-inf and 1e20 in A and in the weights reach the same outputs (a NaN row or
    column, inf - inf = NaN, overflow to inf) as onnxruntime's MLAS."""
    m, k, n = 128, 512, 200
    a = RNG.standard_normal((m, k)).astype(F32)
    b = (RNG.standard_normal((k, n)) / np.sqrt(k)).astype(F32)
    a[3, 5], a[7, :] = np.nan, 1e20
    a[9, 2], a[9, 3] = np.inf, -np.inf
    b[11, 40], b[:, 70] = np.inf, 1e-40   # one infinite weight, a column of denormals
    y, _ = _run("MatMul", {}, a, b, None, 2)
    want = _ort("MatMul", {}, a, b, None, (m, n))
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(y), np.isinf(want))
    fin = np.isfinite(want)
    fin[7] = False  # 1e20 times a sum that cancels: compared at its own scale below
    np.testing.assert_allclose(y[fin], want[fin], rtol=2e-5, atol=1e-3)
    np.testing.assert_allclose(y[7] / 1e20, want[7] / 1e20, atol=1e-4)


def test_avx2_blocking(monkeypatch):
    """The AVX2 code (3 rows x 4 vectors of 8) on this host, as gemm.py's tests do: the
    tile size shows which code ran."""
    monkeypatch.setattr(packed, "has_avx512", lambda: False)
    a = RNG.standard_normal((100, 320)).astype(F32)
    b = (RNG.standard_normal((320, 400)) / np.sqrt(320)).astype(F32)
    y, _ = _run("MatMul", {}, a, b, None, 2)
    assert packed.rows_per_tile() == 3
    np.testing.assert_allclose(y, _ort("MatMul", {}, a, b, None, (100, 400)), rtol=2e-5,
                               atol=2e-5)


def test_which_calls_it_takes():
    """Constant 2-D float32 weights, at most MAX_ROWS rows (MAX_ROWS_EPILOGUE with an
    epilogue in the store), enough work."""
    def spec(op="MatMul", a=(128, 768), b=(768, 3072), attrs=None, consts=(1,), dtype=F32,
             c=None, epilogue=False):
        ins = [(dtype, a), (dtype, b)] + ([] if c is None else [(dtype, c)])
        n = b[0] if (attrs or {}).get("transB") else b[-1]
        return packed.spec_for(op, attrs or {}, ins, [(dtype, a[:-1] + (n,))],
                               {i: None for i in consts}, epilogue)
    assert spec() == packed.PackedSpec(128, 768, 3072)
    assert spec(a=(2, 64, 768)).m == 128               # batch dims join the rows
    assert spec(consts=()) is None                      # weights computed in the plan
    assert spec(b=(2, 768, 3072)) is None               # batched weights
    assert spec(dtype=np.float64) is None
    assert spec(a=(128, 3072), b=(3072, 768)).kblocks() == [(0, 768), (768, 1536),
                                                            (1536, 2304), (2304, 3072)]
    assert spec(a=(1024, 768)) is None                  # many rows: MLAS's (measured)
    assert spec(a=(1, 56, 56, 768), epilogue=True).m == 3136  # unless it saves a pass
    assert spec(a=(4097, 768), epilogue=True) is None
    assert spec(a=(8, 64), b=(64, 64)) is None          # small: generated or NumPy
    assert spec("Gemm", (64, 768), (768, 512), c=(64, 512)) is None  # a full C
    assert spec("Gemm", (64, 768), (768, 512), {"transA": 1}) is None


def test_three_way_trial_takes_the_fastest_beyond_the_margin():
    """inplan.Trial over three implementations: each call the next side in turn; the
    fastest other side wins only when faster than `first` by more than MARGIN."""
    got = []
    trial = inplan.Trial("mlas", ("onednn", "packed"), lambda w, note: got.append((w, note)))
    sides = [trial.side() for _ in range(6)]
    assert sides == ["mlas", "onednn", "packed"] * 2
    for _ in range(inplan.MIN_SAMPLES):
        trial.record("mlas", 1.0e-3)
        trial.record("onednn", 0.99e-3)   # within the margin: not enough
        trial.record("packed", 0.90e-3)
    assert got and got[0][0] == "packed"
    assert "mlas 1.000 ms, onednn 0.990 ms, packed 0.900 ms" in got[0][1]
    close = []
    trial = inplan.Trial("mlas", ("onednn", "packed"), lambda w, n: close.append(w))
    for _ in range(inplan.MIN_SAMPLES):
        for side, t in (("mlas", 1.0e-3), ("onednn", 0.98e-3), ("packed", 0.985e-3)):
            trial.record(side, t)
    assert close == ["mlas"]


def test_a_large_gemm_has_the_packed_rival_unless_the_flag_is_off():
    """make_call lists it among the builders measured against MLAS; --cpu_packed_gemm=false
    (packed_gemm=False) leaves it out, and a forced impl="packed" runs it."""
    a = RNG.standard_normal((64, 512)).astype(F32)
    b = (RNG.standard_normal((512, 1024)) / np.sqrt(512)).astype(F32)
    types = ([(F32, a.shape), (F32, b.shape)], [(F32, (64, 1024))])
    fn = library.make_call("MatMul", {}, *types, 2, {1: b}, impl="packed")
    y = np.empty((64, 1024), F32)
    fn([a, b], [y])
    np.testing.assert_allclose(y, _ort("MatMul", {}, a, b, None, (64, 1024)), rtol=2e-5,
                               atol=2e-5)
    assert fn.impl == "packed"
    with pytest.raises(Exception, match="packed"):
        library.make_call("MatMul", {}, *types, 2, {1: b}, impl="packed", packed_gemm=False)


@pytest.mark.parametrize("k", [1537, 2304])
def test_k_blocks_accumulate_through_c(k):
    """K blocks (KC rows of B each): blocks after the first add to C's values; one chunk
    a thread."""
    m, n = 60, 160
    a = RNG.standard_normal((m, k)).astype(F32)
    b = (RNG.standard_normal((k, n)) / np.sqrt(k)).astype(F32)
    spec = packed.PackedSpec(m, k, n)
    assert len(spec.kblocks()) == -(-k // packed.KC) and spec.chunks(2) == 2
    y = np.empty((m, n), F32)
    packed.runner(spec, b, False, 2)([a, None], [y])
    np.testing.assert_allclose(y, _ort("MatMul", {}, a, b, None, (m, n)), rtol=2e-5,
                               atol=2e-5)


def test_a_chosen_packed_gemm_compiles_in_the_background(monkeypatch):
    """A call whose signature chose this GEMM before (another sequence length, --cache_dir)
    runs MLAS until the background thread has compiled the kernel and packed the weights:
    nothing of it on the first run's path."""
    import concurrent.futures

    from autoclust.backends.cpu import background
    pending: list = []
    future: concurrent.futures.Future = concurrent.futures.Future()
    real_submit = background.submit

    def submit(fn, *args):  # packed.builder's work waits; MLAS's prepacking runs
        if "builder" not in fn.__qualname__:
            return real_submit(fn, *args)
        pending.append(fn)
        return future
    monkeypatch.setattr(background, "submit", submit)
    a = RNG.standard_normal((64, 512)).astype(F32)
    b = (RNG.standard_normal((512, 1024)) / np.sqrt(512)).astype(F32)
    types = ([(F32, a.shape), (F32, b.shape)], [(F32, (64, 1024))])
    want = _ort("MatMul", {}, a, b, None, (64, 1024))
    library._DECISIONS.clear()
    try:
        fn = library.make_call("MatMul", {}, *types, 2, {1: b}, prefer="packed")
        assert fn.impl == "packed" and len(pending) == 1
        y = np.full((64, 1024), np.nan, F32)
        fn([a, b], [y])  # MLAS, the stand-in
        np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-5)
        ran = []
        built = pending[0]()

        def counted(inputs, outputs):
            ran.append(1)
            built(inputs, outputs)
        future.set_result(counted)
        y[...] = np.nan
        fn([a, b], [y])
        assert ran == [1]
        np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-5)
    finally:
        library._DECISIONS.clear()


def test_m_blocks_follow_the_size_of_b():
    """One M block while A's block fits A_BLOCK and B is large (B streams once from
    memory); small blocks of SMALL_A_BLOCK bytes of A where B is small (re-read per block
    from cache), so A stays in L2 beside the C it writes."""
    rb = packed.rows_per_tile()
    assert len(packed.PackedSpec(128, 768, 3072).mblocks()) == 1
    assert len(packed.PackedSpec(300, 768, 3072).mblocks()) == 1
    small = packed.PackedSpec(512, 96, 384)   # B: 147 KB
    assert small.m_block_rows() == packed.SMALL_A_BLOCK // (4 * 96) // rb * rb
    assert len(small.mblocks()) == -(-512 // small.m_block_rows()) > 1


def test_it_runs_on_the_polling_helpers_only_while_a_plan_keeps_them_polling(monkeypatch):
    """The SCHED_IDLE pool while its LINGER word counts a plan run (its helpers poll, no
    futex wake-up); the normal-priority pool otherwise (--cpu_allow_spinning off, a plan
    calling oneDNN, whose OpenMP threads starve SCHED_IDLE helpers)."""
    from autoclust.backends.cpu import pool

    used = []

    class Fake:
        def __init__(self, name):
            self.name, self.state = name, np.zeros(pool.STATE_WORDS, np.int64)

        def run(self, fn, bufs, bounds):
            used.append(self.name)
            for start, stop in bounds.reshape(-1, 2):
                packed.KERNEL(fn)(bufs, int(start), int(stop))

    fakes = {True: Fake("polling"), False: Fake("plain")}
    monkeypatch.setattr(pool, "get", lambda threads, polling=False: fakes[polling])
    a = RNG.standard_normal((64, 512)).astype(F32)
    b = (RNG.standard_normal((512, 1024)) / np.sqrt(512)).astype(F32)
    run = packed.runner(packed.PackedSpec(64, 512, 1024), b, False, 2)
    y = np.empty((64, 1024), F32)
    run([a, None], [y])
    fakes[True].state[pool.LINGER] = 1
    run([a, None], [y])
    fakes[True].state[pool.LINGER] = 0
    run([a, None], [y])
    assert used == ["plain", "polling", "plain"]
    np.testing.assert_allclose(y, _ort("MatMul", {}, a, b, None, (64, 1024)), rtol=2e-5,
                               atol=2e-5)


def test_its_kernels_are_kept_in_the_cache_dir(tmp_path, monkeypatch):
    """With --cache_dir (pool.use_cache_dir, set by every CPU compile) the kernel's object
    code goes there, so a warm process loads it instead of compiling (BERT-base: its first
    run 0.45 -> 0.32 s)."""
    from autoclust.backends.cpu import jit, pool

    from autoclust.runtime import disk_cache
    monkeypatch.setattr(pool, "_CACHE_DIR", [str(tmp_path)])
    b = (RNG.standard_normal((384, 640)) / np.sqrt(384)).astype(F32)
    spec = packed.PackedSpec(96, 384, 640)
    packed.runner(spec, b, False, 2)
    key = disk_cache.make_key(packed.code_key(spec, 2), jit.version_key())
    assert disk_cache.contains(str(tmp_path), key), sorted(p.name for p in tmp_path.iterdir())


def test_calls_of_one_shape_share_one_loaded_kernel():
    """Twelve layers' calls of one shape load its object code once (one engine)."""
    b1 = (RNG.standard_normal((256, 320)) / 16).astype(F32)
    b2 = (RNG.standard_normal((256, 320)) / 16).astype(F32)
    spec = packed.PackedSpec(80, 256, 320)
    r1, r2 = packed.runner(spec, b1, False, 2), packed.runner(spec, b2, False, 2)
    assert r1.keep[0] is r2.keep[0] and r1.keep[1] is not r2.keep[1]
    a = RNG.standard_normal((80, 256)).astype(F32)
    y = np.empty((80, 320), F32)
    r2([a, None], [y])
    np.testing.assert_allclose(y, _ort("MatMul", {}, a, b2, None, (80, 320)), rtol=2e-5,
                               atol=2e-5)
