"""Library calls of the CPU backend: MatMul, Gemm, Conv, ConvTranspose, pooling, Einsum.

`make_call(op, attrs, in_types, out_types, threads, constants)` returns a LibraryFn that
writes an op's results into preallocated output arrays. Implementations:

- "mlas": a single-node onnxruntime session (ORT_ENABLE_ALL, spinning off, compile-time
  constants as initializers so MLAS prepacks weights), run through an io_binding whose
  outputs are OrtValues over our arrays (rebuilt only when the arrays change).
- "numpy": OpenBLAS, im2col Conv, pooling over kernel offsets, einsum (numpy_library.py);
  "ref": the op's NumPy reference plus a copy, for ConvTranspose and MaxPool Indices.
- for large GEMMs, rivals of MLAS: "onednn" (onednn.py, choice.py) and "packed", our own
  GEMM over packed constant weights (packed.py), which can also compute the call's
  epilogue in its store (packed_epilogue.py; then every rival runs the epilogue kernel
  after the call). Which serves is measured alone, then in the plan (inplan.py).

Below an op's small-work threshold numpy wins on call overhead, above it MLAS (a size
rule, once per signature and process: probing both at compile time cost ~1 s for BERT and
answered noise on a shared machine). Measured on a 2-core Zen 4, 2 threads: numpy matmul
1.0 us a call, an io_binding run 3-5 us; [32,64]x[64,64] 2.7 us in numpy against 8.5 in
MLAS, [256,256]x[256,1024] ~1 ms in both. OpenBLAS goes multi-threaded above m*n*k =
262144 (5.2e5 flops) and its busy-waiting threads collapse under load (48 ms instead of
1.2), so numpy only takes what OpenBLAS runs on one thread; stacked batched np.matmul has
no BLAS (520 ms against MLAS's 12-16 ms). The numpy side uses OpenBLAS's own thread count.
"""

from __future__ import annotations

import collections
import concurrent.futures
import math
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort
from autoclust.backends.cpu import background, epilogue, inplan, mlas, onednn, packed
from autoclust.backends.cpu import choice as gemm_choice
from autoclust.backends.cpu.numpy_library import (
    NUMPY_BUILDERS,
    Arrays,
    RunFn,
    TypeShape,
    ref_run,
    staged,
)
from autoclust.backends.cpu.packed_epilogue import Inline

from autoclust import ops
from autoclust.errors import UnsupportedOpError
from autoclust.kernel import ir as kir
from autoclust.ops import custom

F16, F32, F64 = np.dtype("float16"), np.dtype("float32"), np.dtype("float64")
OPS = frozenset(d.op for d in ops.all_ops() if d.kind == ops.LIBRARY)
# dtypes onnxruntime's CPU kernels take (float16 excluded: we compute it in float32).
MLAS_TYPES = {"MatMul": (F32, F64), "Gemm": (F32, F64), "Einsum": (F32, F64),
              "FusedMatMul": (F32,),
              "MaxPool": (F32, F64), "Conv": (F32,), "ConvTranspose": (F32,),
              "AveragePool": (F32,), "GlobalAveragePool": (F32,), "GlobalMaxPool": (F32,)}
SMALL_FLOPS = 5.3e5        # below: numpy (one OpenBLAS thread: m*n*k < 262144)
POOL_SMALL_WORK = 2e4      # pools: window reads below which numpy's passes are cheaper
SWITCHES = inplan.SWITCHES  # bumped at every change of a call's impl (see inplan.py)
FUSED = "onednn+post-ops"  # the impl of a call that runs its epilogue too
RIVALS = gemm_choice.RIVALS  # the large-GEMM implementations measured against MLAS

_DECISIONS: dict[tuple, tuple[str, str]] = {}
# the background thread's gates (background.py), which an Executable finds on its library
foreground, gate, wait_background = background.foreground, background.gate, \
    background.wait_background


class LibraryFn:
    """One library op bound to concrete types: call(inputs, outputs) fills outputs."""

    def __init__(self, op: str, impl: str, run: RunFn, note: str = ""):
        self.op = op
        self.note = note
        self.switch(impl, run, note)
        # fused: the call runs its epilogue too (make_call_for), reading the inputs plus
        # the buffers `extra` and writing `dest` instead of the call's outputs
        self.fused, self.extra, self.dest = False, (), ()
        self._stand_ins: dict[int, np.ndarray] = {}  # output -> its dense stand-in (_run)
        # both implementations by name, and the signature key, of a call that had an
        # in-plan trial: the whole plan's trial (inplan.PlanTrial) may switch it again
        self.alternatives: dict[str, RunFn] = {}
        self.key: tuple = ()

    def switch(self, impl: str, run: RunFn, note: str) -> None:
        """Run `impl` from now on (a background measurement found it faster)."""
        self.impl, self.note = impl, note
        SWITCHES[0] += 1
        # one attribute, swapped at once: a call on another thread sees both or neither
        self._current = (run, impl == "onednn", None)  # oneDNN writes strided outputs in place

    def try_both(self, trial: inplan.Trial, runs: dict[str, RunFn]) -> None:
        """Alternate between the implementations `runs` (by name) as `trial` says, timing
        each call, until the trial switches this call to its winner (backends/cpu/inplan.py)."""
        self._current = (self._current[0], self._current[1], (trial, runs))

    def in_trial(self) -> bool:
        """Whether the calls still alternate between implementations (try_both)."""
        return self._current[2] is not None

    def __call__(self, inputs: Arrays, outputs: Sequence[np.ndarray]) -> None:
        run, strided, trying = self._current
        if trying is not None and trying[0].ready():
            trial, runs = trying
            impl = trial.side()
            start = trial.clock()
            self._run(runs[impl], impl == "onednn", inputs, outputs)
            trial.record(impl, trial.clock() - start)
        else:
            self._run(run, strided, inputs, outputs)

    def _run(self, run: RunFn, strided: bool, inputs: Arrays,
             outputs: Sequence[np.ndarray]) -> None:
        if strided or all(y.flags.c_contiguous for y in outputs):
            run(inputs, outputs)
            return
        # The implementations write C-order memory (onnxruntime binds raw buffers, the NumPy
        # ones reshape): strided outputs get a contiguous stand-in, copied back once; kept
        # for the next call (onnxruntime's output stays bound).
        dense = [y if y.flags.c_contiguous else mlas.stand_in(self._stand_ins, j, y)
                 for j, y in enumerate(outputs)]
        run(inputs, dense)
        for y, d in zip(outputs, dense):
            if d is not y:
                np.copyto(y, d)

    def __repr__(self) -> str:
        return f"LibraryFn({self.op}, impl={self.impl}{', ' + self.note if self.note else ''})"


# ---- public API -----------------------------------------------------------------------------

def supported(op: str, attrs: dict[str, Any]) -> str | None:
    """None when make_call implements op with these attributes, else the reason why not
    (dtypes are the op table's business: OpDef.dtypes)."""
    if op not in OPS:
        if custom.for_call(op) is not None:
            return None  # a custom call: its kernel, bound by make_call_for
        return f"{op} is not a library call of the CPU backend"
    if op in ("Conv", "ConvTranspose", "MaxPool", "AveragePool") and \
            attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID", "SAME_UPPER",
                                                    "SAME_LOWER"):
        return f"{op} auto_pad={attrs.get('auto_pad')!r} is unknown"
    return None


def make_call(op: str, attrs: dict[str, Any], in_types: Sequence[TypeShape | None],
              out_types: Sequence[TypeShape], threads: int = 0,
              constants: dict[int, np.ndarray] | None = None,
              impl: str | None = None, layouts: tuple = (),
              prefer: str | None = None, packed_gemm: bool = True,
              inline: Inline | None = None) -> LibraryFn:
    """Build the fastest LibraryFn for op on these types; impl forces "mlas", "numpy",
    "onednn" or "packed". layouts: element strides per operand (inputs, then outputs; None or absent:
    C-contiguous) of the strided arrays the call will be given. `prefer`: the large-GEMM
    implementation measured for another shape of the same call (a new sequence length of
    a cluster with symbolic dims), taken instead of measuring again. `inline`: every
    implementation runs the call's epilogue too (packed.py's in its store)."""
    why = supported(op, attrs)
    if why is not None:
        raise UnsupportedOpError(why)
    in_types = [None if t is None else (np.dtype(t[0]), tuple(t[1])) for t in in_types]
    out_types = [(np.dtype(t[0]), tuple(t[1])) for t in out_types]
    constants = dict(constants or {})
    if op == "Gemm" and len(in_types[0][1]) > 2:
        return _flattened_gemm(attrs, in_types, out_types, threads, constants, impl, prefer,
                               packed_gemm, inline)
    builders = _candidates(op, attrs, in_types, out_types, threads, constants)
    dnnl = gemm_choice.onednn_builder(op, attrs, in_types, out_types, threads, constants, layouts)
    if dnnl is not None:
        builders["onednn"] = dnnl
    wrap = inline.then_kernel if inline is not None else _same
    builders = {name: wrap(build) for name, build in builders.items()}
    own = packed.builder(op, attrs, in_types, out_types, threads, constants, layouts,
                         inline and inline.plan) if packed_gemm else None
    if own is not None:
        builders["packed"] = own
    if impl is not None:
        if impl not in builders:
            raise UnsupportedOpError(f"{op} on {_describe(in_types)}: implementation {impl!r} "
                                     f"is not available (have {sorted(builders)})")
        if impl == "mlas":  # forced: onnxruntime's refusal is the caller's error
            builders["mlas"] = wrap(_forced_mlas(op, attrs, in_types, out_types, threads,
                                                 constants))
        return LibraryFn(op, impl, builders[impl](), "forced")
    key = (op, _freeze(attrs), tuple(in_types), tuple(out_types), threads,
           tuple(sorted(constants)), tuple(layouts), own is not None) + \
        ((inline.plan.key,) if inline is not None else ())
    if key not in _DECISIONS:
        _DECISIONS[key] = _decide(op, attrs, in_types, out_types, builders)
        if _DECISIONS[key][1].startswith("large") and op in gemm_choice.GEMM_OPS:
            if prefer in ("mlas", *RIVALS) and prefer in builders:
                _DECISIONS[key] = (prefer, "measured for another shape of this call")
            else:
                _DECISIONS[key] = gemm_choice.known(key, builders) or _DECISIONS[key]
    choice, note = _DECISIONS[key]
    fn = _build(op, choice, builders, note)
    if fn.impl == "mlas" and any(r in builders for r in RIVALS) \
            and not note.startswith("measured"):
        _measure_later(fn, key, builders, (op, attrs, in_types, out_types, threads,
                                           constants), layouts, wrap)
    else:
        _follow_trial(fn, key, builders)
    return fn


def _same(build: Callable) -> Callable:
    return build


def _follow_trial(fn: LibraryFn, key: tuple, builders: dict[str, Callable]) -> None:
    """A call built on a measured answer joins its signature's in-plan trial: the running
    one, or the one being set up (it waits in that trial's list, as _try_in_plan's late
    calls). Left out, it kept the measured library while the trial could move its
    siblings to the other."""
    with _SESSIONS_LOCK:
        waiting = _MEASURING.get(key)
        if waiting is not None:
            waiting.append((fn, builders))
            return
        running = key in _TRYING
    if running:
        _join_trial(fn, key, builders)


def _measure_later(fn: LibraryFn, key: tuple, builders: dict[str, Callable], call: tuple,
                   layouts: tuple, wrap: Callable = _same) -> None:
    """Time MLAS (prepacked) against oneDNN on this call in the background thread, after
    the prepacking queued before it, and switch `fn` to oneDNN if it wins: a first run
    never waits for a measurement (nor for prepacking: see _mlas_runner). One measurement
    per signature: the calls of the same signature made before it ends (BERT's twelve
    layers) wait for its answer instead of each timing its own (twelve noisy answers, a
    layer's GEMM on MLAS beside its neighbours on oneDNN)."""
    with _SESSIONS_LOCK:
        waiting = _MEASURING.get(key)
        if waiting is not None:
            waiting.append((fn, builders))
            return
        measured = _DECISIONS.get(key, ("", ""))[1].startswith("measured")
        if not measured:
            _MEASURING[key] = [(fn, builders)]
    if measured:  # answered since this call read its decision: it joins, as a later one
        _join_trial(fn, key, builders)
        return
    op, in_types, out_types, constants = call[0], call[2], call[3], call[5]

    def measure() -> None:
        try:
            candidates = {"mlas": _as_called(op, "mlas", wrap(_forced_mlas(*call)))}
            candidates.update({r: _as_called(op, r, builders[r]) for r in RIVALS
                               if r in builders})
            choice, note = gemm_choice.measure(key, candidates, in_types, out_types, layouts,
                                               constants, background.quiet_cores)
        except Exception as exc:  # noqa: BLE001 - MLAS refused or oneDNN failed: keep MLAS
            choice, note = "mlas", f"not measured: {str(exc)[:80]}"
        measured = note.startswith("measured")
        with _SESSIONS_LOCK:
            # a measured answer's entry stays until the trial is registered: a call made
            # meanwhile read the old decision and joins the list, then the trial
            # (_try_in_plan)
            _DECISIONS[key] = (choice, note)
            waiting = list(_MEASURING[key]) if measured else _MEASURING.pop(key)
        if not measured:
            for each, _ in waiting:
                each.note = f"{each.note}; {note}"
            return
        _try_in_plan(key, choice, note, waiting)

    background.submit(measure)


def _as_called(op: str, impl: str, build: Callable[[], RunFn]) -> Callable[[], RunFn]:
    """`build`'s run timed as a plan calls it: through LibraryFn, which writes MLAS's
    strided outputs through a dense stand-in and copies them back. Timed bare, onnxruntime
    copied a strided output into a buffer of its own and the copy back went unmeasured."""
    return lambda: LibraryFn(op, impl, build())


def _try_in_plan(key: tuple, first: str, note: str, waiting: list) -> None:
    """Start the calls `waiting` (LibraryFn, builders) of signature `key`, all on MLAS, on
    an in-plan trial of `first` (choice.measure's answer) against the other (inplan.py);
    its winner serves them all and is remembered (--cache_dir). An answer read from
    --cache_dir (another process wrote it meanwhile) serves at once; a call whose oneDNN
    build fails stays on MLAS."""
    settled = note.endswith("(--cache_dir)")
    calls: list[tuple[LibraryFn, dict[str, RunFn]]] = []
    trial = _start_trials(key, first, note, waiting, settled, calls)
    with _SESSIONS_LOCK:  # registered together: a call made now joins the trial
        late = _MEASURING.pop(key)[len(waiting):]
        if trial is not None:
            _TRYING[key] = trial
            for fn, runs in calls:
                fn.try_both(trial, runs)
    for fn, their_builders in late:  # made while the calls above were built
        _join_trial(fn, key, their_builders)


def _start_trials(key: tuple, first: str, note: str, waiting: list, settled: bool,
                  calls: list) -> inplan.Trial | None:
    """_try_in_plan's trial (None: none needed), its (call, runs) pairs put in `calls`."""
    for fn, their_builders in waiting:
        if settled and first == "mlas":
            fn.note = note
            continue
        try:
            runs = {"mlas": fn._current[0]}
            runs.update({r: their_builders[r]() for r in RIVALS if r in their_builders})
        except Exception as exc:  # noqa: BLE001 - its own weights refused: keep MLAS
            fn.note = f"{note}; a rival library failed here: {str(exc)[:80]}"
            continue
        fn.switch(first, runs[first], note)
        if not settled:  # read from --cache_dir: no trial of its own, nor of the plan's
            fn.alternatives, fn.key = runs, key
        calls.append((fn, runs))
    if settled or not calls:
        return None

    def decided(winner: str, how: str) -> None:
        full = f"{note}; {how}"
        with _SESSIONS_LOCK:
            _DECISIONS[key] = (winner, full)
            _TRYING.pop(key, None)
            final = list(calls)  # a late call (_join_trial) appends under this lock
        gemm_choice.remember(key, winner, full)
        for fn, runs in final:
            fn.switch(winner, runs[winner], full)

    others = tuple(r for r in calls[0][1] if r != first)
    trial = inplan.Trial(first, others, decided, ready=lambda: wait_background(timeout=0))
    trial.calls = calls
    return trial


def _join_trial(fn: LibraryFn, key: tuple, builders: dict[str, Callable]) -> None:
    """A call of signature `key` built while its in-plan trial runs (after the measurement
    had answered: another layer compiled later, a loaded machine) joins that trial and
    takes its winner. Left out, it served the measured answer for good while the trial
    could switch its siblings to the other library: one signature on two libraries."""
    if fn.impl not in ("mlas", *RIVALS):
        return  # MLAS refused it: NumPy serves
    try:
        runs = {fn.impl: fn._current[0]}
        for other in ("mlas", *RIVALS):
            if other != fn.impl and other in builders:
                runs[other] = builders[other]()
    except Exception as exc:  # noqa: BLE001 - its own weights refused: stays as built
        fn.note = f"{fn.note}; not in the plan's trial: {str(exc)[:80]}"
        return
    with _SESSIONS_LOCK:  # against `decided`, which takes the trial's calls under it
        trial = _TRYING.get(key)
        if trial is None:  # decided meanwhile
            impl, note = _DECISIONS.get(key, (fn.impl, fn.note))
            fn.switch(impl, runs[impl], note)
            if "; whole plan:" not in note and not note.endswith("(--cache_dir)"):
                fn.alternatives, fn.key = runs, key  # as its siblings: in the plan's trial
            return
        trial.calls.append((fn, runs))
        fn.alternatives, fn.key = runs, key
        fn.try_both(trial, runs)


def plan_trial(fns: Sequence[Any]) -> inplan.PlanTrial | None:
    """A whole-plan trial (inplan.PlanTrial) of an executable's calls that had in-plan
    trials, or None (none had one). A library that wins serves those calls and is
    remembered as their signatures' choice (--cache_dir)."""
    calls = [fn for fn in fns if isinstance(fn, LibraryFn) and fn.alternatives]
    if not calls:
        return None

    def decided(winner: str, how: str) -> None:
        for fn in calls:
            impl = winner if winner in fn.alternatives else fn.impl
            fn.switch(impl, fn.alternatives[impl], f"{fn.note}; {how}")
            fn.alternatives = {}  # decided for good
        # once per signature (each remember rewrites --cache_dir's file): a layer's calls
        # share one, and BERT-base has 12 layers of them
        for key, fn in {fn.key: fn for fn in calls}.items():
            with _SESSIONS_LOCK:
                _DECISIONS[key] = (fn.impl, fn.note)
            gemm_choice.remember(key, fn.impl, fn.note)

    return inplan.PlanTrial(calls, decided)


def _flattened_gemm(attrs: dict[str, Any], in_types: list, out_types: list, threads: int,
                    constants: dict[int, np.ndarray], impl: str | None,
                    prefer: str | None = None, packed_gemm: bool = True,
                    inline: Inline | None = None) -> LibraryFn:
    """Gemm whose A is [..., K] (a MatMul with its bias Add folded in): batch dims join M."""
    if attrs.get("transA", 0):
        raise UnsupportedOpError(f"Gemm with transA on a {len(in_types[0][1])}-D A")
    (da, sa), (dy, sy) = in_types[0], out_types[0]
    flat_in = [(da, (math.prod(sa[:-1]), sa[-1]))] + list(in_types[1:])
    fn = make_call("Gemm", attrs, flat_in, [(dy, (math.prod(sy[:-1]), sy[-1]))], threads,
                   constants, impl, prefer=prefer, packed_gemm=packed_gemm, inline=inline)
    views = _ViewCache()

    def run(inputs: Arrays, outputs: Sequence[np.ndarray]) -> None:  # an epilogue's: as they are
        fn([views.flat(inputs[0], 0), *inputs[1:]], [views.flat(outputs[0], 1), *outputs[1:]])

    flat = LibraryFn("Gemm", fn.impl, run, f"{fn.note}, A flattened to {flat_in[0][1]}")
    flat.inner = fn  # type: ignore[attr-defined]  # its impl may switch (current_impl)
    return flat


class _ViewCache:
    """2-D views of the arrays passed last time: the same array yields the same view object,
    so the onnxruntime binding (keyed on identity) is not rebuilt every call."""

    def __init__(self):
        self._last: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def flat(self, x: np.ndarray, slot: int) -> np.ndarray:
        hit = self._last.get(slot)
        if hit is not None and hit[0] is x:
            return hit[1]
        view = x.reshape(math.prod(x.shape[:-1]), x.shape[-1])  # -1 is ambiguous when a dim is 0
        self._last[slot] = (x, view)
        return view


def make_call_for(thunk: kir.LibraryCall, buffers: Sequence[kir.Buffer], threads: int = 0,
                  constants: dict[int, np.ndarray] | None = None,
                  epilogue_run: Callable[[], None] | None = None,
                  impl: str | None = None, fast_math: bool = False,
                  packed_gemm: bool = True,
                  epilogue_step: Callable[[], None] | None = None) -> LibraryFn:
    """make_call for a kernel-IR LibraryCall; constants maps buffer id -> value. `impl`
    (optional): the implementation an earlier binding of the same call chose (see
    make_call's `prefer`). `fast_math` (--fast_math): epilogues may run as post-ops that
    approximate them (epilogue.FAST_ACTIVATIONS). `packed_gemm` (--cpu_packed_gemm):
    packed.py's GEMM competes with the libraries.

    A call with an epilogue (thunk.epilogue) gets a LibraryFn with `fused` set when the
    epilogue runs inside it: it is then called with the inputs plus the buffers in
    `fn.extra` and writes `fn.dest`, not thunk.outputs. That is when packed.py's GEMM
    takes the call and can compute the epilogue in its store (_inline: each of its rivals
    then runs `epilogue_step`, the epilogue kernel's step, after the call, and the
    fastest is measured as without an epilogue), or the epilogue is oneDNN post-ops
    measured faster than the call followed by `epilogue_run`, the epilogue kernel on
    probe buffers (_fused). Otherwise the caller runs the epilogue kernel after the
    call."""
    by_id = {b.id: b for b in buffers}
    n_in = len(thunk.inputs)

    def typ(k: int, b: int) -> TypeShape:  # a view's logical shape, else the buffer's
        view = thunk.view(k)
        return np.dtype(by_id[b].dtype), view.shape if view is not None else by_id[b].shape

    in_types = [None if b is None else typ(k, b) for k, b in enumerate(thunk.inputs)]
    out_types = [typ(n_in + j, b) for j, b in enumerate(thunk.outputs)]
    op = custom.for_call(thunk.op)
    if op is not None:
        return _custom_call(op, thunk)
    consts = {i: constants[b] for i, b in enumerate(thunk.inputs)
              if b is not None and constants and b in constants}
    layouts = tuple(None if v is None else v.strides for v in thunk.views)
    # an earlier binding's choice: whether its epilogue ran as post-ops too (not measured
    # again for this shape: a new sequence length's first run would pay ~0.1-0.25 s a call)
    fused_before = None if impl is None else impl == FUSED
    inline = None if fused_before or not packed_gemm else \
        packed.inline_epilogue(thunk, by_id, epilogue_step, epilogue_run, in_types,
                               out_types, consts)
    if inline is not None:
        fn = make_call(thunk.op, dict(thunk.attrs), in_types, out_types, threads, consts,
                       layouts=layouts, prefer=impl, inline=inline)
        fn.fused, fn.extra = True, inline.plan.inputs
        fn.dest = thunk.outputs[:1] + inline.plan.outputs
        return fn
    fn = make_call(thunk.op, dict(thunk.attrs), in_types, out_types, threads, consts,
                   layouts=layouts, prefer="onednn" if fused_before else impl,
                   packed_gemm=packed_gemm)
    if thunk.epilogue is not None and epilogue_run is not None:
        fused = _fused(thunk, by_id, fn, epilogue_run, (in_types, out_types, threads, consts,
                                                        layouts), fused_before, fast_math)
        if fused is not None:
            return fused
    return gemm_choice.in_place(fn, thunk.views, n_in) if thunk.views else fn


def _fused(thunk: kir.LibraryCall, by_id: dict[int, kir.Buffer], plain: LibraryFn,
           epilogue_run: Callable[[], None], call: tuple,
           fused_before: bool | None = None, fast_math: bool = False) -> LibraryFn | None:
    """The call with its epilogue as oneDNN post-ops, when they express it and measure
    faster than `plain` then the epilogue kernel (`fused_before`: what was measured for
    another shape of this call, taken instead of measuring); else None (`plain.note` says
    why)."""
    in_types, out_types, threads, consts, layouts = call
    if any(v is not None for v in thunk.views):
        # strided operands with post-ops gave wrong results (the ONNX node case
        # attention_3d_with_past_and_present_qk_matmul_softcap_expanded: 0.14 off) while
        # each alone is right; until that is understood, such a call runs its epilogue after
        plain.note += "; epilogue after the call: strided operands"
        return None
    found = epilogue.post_ops(thunk, by_id, fast_math)
    if found is None:
        plain.note += "; epilogue after the call: not oneDNN post-ops"
        return None
    steps, dest = found
    attrs = dict(thunk.attrs)
    n_in = len(in_types)
    out_layouts = tuple(layouts[:n_in]) + (None,) if layouts else ()
    build = gemm_choice.onednn_builder(thunk.op, attrs, in_types, out_types, threads, consts,
                                       out_layouts, [s.onednn() for s in steps])
    if build is None:
        plain.note += f"; epilogue after the call: onednn: {onednn.unavailable() or 'n/a'}"
        return None
    extra = tuple(s.buf for s in steps if s.buf is not None)
    extra_types = [(F32, s.shape) for s in steps if s.buf is not None]
    key = ("epilogue", thunk.op, _freeze(attrs), tuple(in_types), tuple(out_types), threads,
           tuple(sorted(consts)), tuple(layouts), tuple(steps), plain.impl,
           epilogue.kernel_key(thunk.epilogue))

    if key not in _DECISIONS and fused_before is not None:
        _DECISIONS[key] = ("onednn post-ops" if fused_before else f"{plain.impl} then kernel",
                           "as measured for another shape of this call")
    if key not in _DECISIONS and any(s.kind in epilogue.FAST_ACTIVATIONS for s in steps):
        # not timed: oneDNN's approximation costs 0.05-0.3 ms inside the GEMM where our
        # exact kernel after it takes 0.25-0.5 ms on every shape measured, while a timing
        # made during the compile came out at random (the background thread's prepacking
        # and measuring beside it: 1.2-2.3 ms for the same call)
        _DECISIONS[key] = ("onednn post-ops", "--fast_math: oneDNN's approximation, untimed")
    if key not in _DECISIONS:
        _DECISIONS[key] = gemm_choice.measure(
            key, {f"{plain.impl} then kernel": _then_kernel(thunk, plain, epilogue_run, call),
                  "onednn post-ops": build},
            list(in_types) + extra_types, out_types,
            out_layouts[:n_in] + (None,) * (len(extra) + 1) if layouts else (), consts)
    choice, note = _DECISIONS[key]
    if choice != "onednn post-ops":
        plain.note += f"; epilogue after the call: {note}"
        return None
    fn = LibraryFn(thunk.op, FUSED, _packing_later(build),
                   f"{note}; post-ops {', '.join(s.kind for s in steps)}")
    fn.switch(fn.impl, fn._current[0], fn.note)  # strided outputs written in place
    fn.fused, fn.extra, fn.dest = True, extra, (dest,)
    views = tuple(thunk.views[:n_in]) + (None,) * (len(extra) + 1) if thunk.views else ()
    return gemm_choice.in_place(fn, views, n_in + len(extra)) if views else fn


def _then_kernel(thunk: kir.LibraryCall, plain: LibraryFn, epilogue_run: Callable[[], None],
                 call: tuple) -> Callable[[], RunFn]:
    """A builder of the unfused side of _fused's measurement: the call, then the epilogue
    kernel."""
    in_types, out_types, threads, consts, layouts = call

    def build() -> RunFn:
        # the same implementation with its weights prepacked now (plain's may still be
        # prepacking in the background: timing it would favour oneDNN)
        same = make_call(thunk.op, dict(thunk.attrs), in_types, out_types, threads, consts,
                         plain.impl, layouts)
        n_in = len(in_types)

        def run(inputs: Arrays, outputs: Sequence[np.ndarray]) -> None:
            same(inputs[:n_in], outputs)
            epilogue_run()
        return run
    return build


def _custom_call(op: custom.CustomOp, thunk: kir.LibraryCall) -> LibraryFn:
    """A custom op's kernel (autoclust.ops.custom) writing into the cluster's buffers: a C
    kernel gets their pointers, a NumPy kernel's results are checked and copied in."""
    node = thunk.nodes[0] if thunk.nodes else ""
    attrs = dict(thunk.attrs)
    if op.c_kernel is not None:
        return LibraryFn(thunk.op, "custom-c", custom.CCall(op, node), op.name)

    def run(inputs: Arrays, outputs: Sequence[np.ndarray]) -> None:
        custom.call_into(op, [None if x is None else ops.dense(x) for x in inputs], outputs,
                         attrs, node)

    return LibraryFn(thunk.op, "custom-numpy", run, op.name)


def current_impl(fn: Callable) -> str:
    """The implementation a call built by make_call_for runs now (a background measurement
    may have switched it since)."""
    while getattr(fn, "inner", None) is not None:
        fn = fn.inner  # type: ignore[attr-defined]
    return getattr(fn, "impl", "")


def in_trial(fn: Callable) -> bool:
    """Whether a call built by make_call_for still alternates between implementations in
    an in-plan trial (inplan.py): its executable has not settled."""
    while getattr(fn, "inner", None) is not None:
        fn = fn.inner  # type: ignore[attr-defined]
    return bool(getattr(fn, "in_trial", lambda: False)())


def decisions() -> dict[tuple, tuple[str, str]]:
    """The cached (impl, note) choices of this process, keyed by call signature."""
    return dict(_DECISIONS)


# ---- choosing --------------------------------------------------------------------------------

def _candidates(op: str, attrs: dict[str, Any], in_types: list, out_types: list,
                threads: int, constants: dict[int, np.ndarray]) -> dict[str, Callable]:
    """impl name -> zero-argument builder of its run function."""
    dtype = next(t[0] for t in in_types if t is not None)
    found: dict[str, Callable] = {}
    numpy_builder = NUMPY_BUILDERS.get(op)
    if op == "MaxPool" and len(out_types) > 1:
        numpy_builder = None  # Indices: only the reference computes them
    if numpy_builder is not None:
        found["numpy"] = lambda: staged(numpy_builder(attrs, in_types, out_types),
                                         in_types, out_types)
    else:
        found["ref"] = lambda: ref_run(op, attrs)
    if dtype in MLAS_TYPES.get(op, ()):  # built only when chosen (see _build)
        found["mlas"] = lambda: _mlas_runner(op, attrs, in_types, out_types, threads,
                                             constants)
    return found


def _forced_mlas(op: str, attrs: dict[str, Any], in_types: list, out_types: list,
                 threads: int, constants: dict[int, np.ndarray]) -> Callable:
    try:
        sess = _session(op, attrs, in_types, out_types, threads, constants)
    except Exception as exc:  # noqa: BLE001 - turned into our error below
        raise UnsupportedOpError(f"{op} on {_describe(in_types)}: implementation 'mlas' is "
                                 f"not available: onnxruntime refused it ({exc})") from None
    return lambda: mlas.bound_runner(sess, in_types, out_types, constants)


def _build(op: str, choice: str, builders: dict[str, Callable], note: str) -> LibraryFn:
    """The chosen implementation; onnxruntime refusing a case means the other one."""
    try:
        run = _packing_later(builders[choice]) if choice == "onednn" else \
            _compiled_later(builders) if choice == "packed" else builders[choice]()
        return LibraryFn(op, choice, run, note)
    except Exception as exc:
        if choice != "mlas":
            raise
        other = "numpy" if "numpy" in builders else "ref"
        return LibraryFn(op, other, builders[other](), f"mlas refused: {exc}"[:120])


# Single-node sessions, reused by every call of the same op, attributes, dtypes and ranks
# on the same constant arrays: their dims are symbolic, so a new sequence length or batch
# size reuses them (and their prepacked weights) instead of building 96 sessions again for
# BERT-base. Bounded: the least recently used session goes (and frees its weights).
# Values are (future of the session, its constants).
_SESSIONS: collections.OrderedDict = collections.OrderedDict()
_SESSIONS_LOCK = threading.Lock()
MAX_SESSIONS = 256
# Build weight-prepacking sessions in one background thread (see _mlas_runner); tests
# turn it off to check the synchronous path.
BACKGROUND_PREPACK = True
# signature -> the (LibraryFn, builders) pairs waiting for its MLAS-against-oneDNN answer
_MEASURING: dict[tuple, list[tuple[LibraryFn, dict[str, Callable]]]] = {}
# signature -> its running in-plan trial (inplan.Trial; its `calls`, the (LibraryFn, runs)
# pairs in it). Weak: a trial whose calls' plan was dropped undecided (its cluster handed
# back) goes with them, and their packed weights with it.
_TRYING: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _decide(op: str, attrs: dict[str, Any], in_types: list, out_types: list,
            builders: dict[str, Callable]) -> tuple[str, str]:
    if len(builders) == 1:
        return next(iter(builders)), "only implementation"
    fallback = "numpy" if "numpy" in builders else "ref"
    opdef = ops.get(op, "com.microsoft" if op in mlas.CONTRIB else "")
    work = opdef.flops(attrs, in_types, out_types)
    small = POOL_SMALL_WORK if "Pool" in op else SMALL_FLOPS
    if work < small or any(math.prod(t[1]) == 0 for t in out_types):
        return fallback, f"small ({work:.2g} flops)"
    return "mlas", f"large ({work:.2g} flops)"


# ---- onnxruntime (MLAS) ---------------------------------------------------------------------

def _session(op: str, attrs: dict[str, Any], in_types: list, out_types: list, threads: int,
             constants: dict[int, np.ndarray]) -> ort.InferenceSession:
    """The single-node onnxruntime session for op (cached in _SESSIONS), built now."""
    return _session_future(op, attrs, in_types, out_types, threads, constants, False).result()


def _session_future(op: str, attrs: dict[str, Any], in_types: list, out_types: list,
                    threads: int, constants: dict[int, np.ndarray],
                    later: bool) -> concurrent.futures.Future:
    """A future of the session for op (cached in _SESSIONS): built in the background
    thread when `later`, else now (raising what onnxruntime raises)."""
    key = (op, _freeze(attrs), tuple(None if t is None else (t[0], len(t[1]), i in constants
                                                             and t[1]) for i, t in
                                     enumerate(in_types)),
           tuple((t[0], len(t[1])) for t in out_types), threads,
           tuple((i, id(c)) for i, c in sorted(constants.items())))
    with _SESSIONS_LOCK:
        hit = _SESSIONS.get(key)
        if hit is not None and all(hit[1][i] is c for i, c in constants.items()):
            _SESSIONS.move_to_end(key)
            return hit[0]
    args = (op, attrs, in_types, out_types, threads, constants)
    if later:
        future = background.submit(mlas.new_session, *args)
    else:
        future = concurrent.futures.Future()
        future.set_result(mlas.new_session(*args))  # a refusal raises here, caching nothing
    with _SESSIONS_LOCK:
        _SESSIONS[key] = (future, dict(constants))  # holding the arrays keeps ids unique
        if len(_SESSIONS) > MAX_SESSIONS:
            _SESSIONS.popitem(last=False)
    return future


def _mlas_runner(op: str, attrs: dict[str, Any], in_types: list, out_types: list,
                 threads: int, constants: dict[int, np.ndarray]) -> RunFn:
    """The onnxruntime run function for op. With constant weights, their prepacked session
    is built in the background (~3-15 ms each, 0.3-1 s for BERT-base's 72 weights, which
    was most of a warm process's first run); until it is ready, calls run a session shared
    by every call of the same op, attributes, dtypes and ranks, the weights fed as inputs
    (built once in ~0.5 ms; a GEMM runs 1.3-1.5x slower unpacked alone, ~2x beside the
    background build: still, BERT-base's warm first run went from 1.0-1.5 s to 0.4-0.6 s
    on the loaded 2-core machine, against 0.13-0.15 s steady)."""
    if not constants or not BACKGROUND_PREPACK:
        return mlas.bound_runner(_session(op, attrs, in_types, out_types, threads, constants),
                             in_types, out_types, constants)
    future = _session_future(op, attrs, in_types, out_types, threads, constants, True)
    if future.done() and future.exception() is None:
        return mlas.bound_runner(future.result(), in_types, out_types, constants)
    # raises when onnxruntime refuses the op: _build then takes the NumPy implementation
    shared = _session(op, attrs, in_types, out_types, threads, {})
    stand_in = _with_constants(constants, in_types, mlas.bound_runner(shared, in_types,
                                                                   out_types, {}))
    return background.until_ready(future, stand_in,
                        lambda sess: mlas.bound_runner(sess, in_types, out_types, constants))


def _packing_later(build: Callable[..., RunFn]) -> RunFn:
    """oneDNN's run function (`build`: choice.onednn_builder's) with its constant weights
    packed in the background thread, as _mlas_runner prepacks MLAS's: until the packing is
    done, calls run a primitive reading the weights as they are. A warm process (its GEMMs
    choosing oneDNN from --cache_dir) packed BERT-base's 24 oneDNN weights in its first
    run, 0.1-0.3 s of it. Weights packed before in the same layout (another sequence
    length of the call) serve at once."""
    if not BACKGROUND_PREPACK:
        return build()
    try:
        plain = build(pack=False)
    except onednn.OneDNNError:  # the weights' own layout refused: pack them now, as before
        return build()
    if getattr(plain, "packed", True):
        return plain
    return background.until_ready(background.submit(build), plain, lambda packed: packed)


def _compiled_later(builders: dict[str, Callable]) -> RunFn:
    """packed.py's GEMM, chosen before (another sequence length, --cache_dir), compiled and
    its weights packed in the background thread while MLAS serves: a new length's first
    run took 0.45 s instead of 0.14 on BERT-base when it waited for them."""
    if not BACKGROUND_PREPACK or "mlas" not in builders:
        return builders["packed"]()
    try:
        stand_in = builders["mlas"]()
    except Exception:  # noqa: BLE001 - MLAS refused it: wait for ours
        return builders["packed"]()
    return background.until_ready(background.submit(builders["packed"]), stand_in,
                                  lambda run: run)


def _with_constants(constants: dict[int, np.ndarray], in_types: list, run: RunFn) -> RunFn:
    """`run` with the constants fed in their input slots."""
    fed = {i: np.ascontiguousarray(c, in_types[i][0]).reshape(in_types[i][1])
           for i, c in constants.items()}

    def with_constants(inputs: Arrays, outputs: Sequence[np.ndarray]) -> None:
        full = list(inputs)
        for i, value in fed.items():
            full[i] = value
        run(full, outputs)

    return with_constants


# ---- helpers -----------------------------------------------------------------------------------

def _freeze(value: Any) -> Any:
    """A hashable copy of an attribute value (lists become tuples, arrays bytes)."""
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, value.tobytes())
    return value


def _describe(in_types: Sequence[TypeShape | None]) -> str:
    return ", ".join("None" if t is None else f"{t[0]}{list(t[1])}" for t in in_types)


