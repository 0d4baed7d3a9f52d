"""`autoclust fuzz`: the differential graph fuzzer.

    autoclust fuzz --seconds 600 --seed 1 --out /tmp/fuzz      # long run, isolated workers
    autoclust fuzz --cases 200 --seed 0 --device interpreter   # fixed budget
    autoclust fuzz --cases 300 --features empty --out /tmp/fz  # one family of edge cases

Each case is a random valid graph (tools/fuzz/gen.py) checked by the oracle in
tools/fuzz/check.py: onnxruntime (optimizations off) and our interpreter, then autoclust
on the chosen device plus metamorphic variants that force clusters to fall back. Cases run
in a worker subprocess, so a segfault or hang in compiled code is caught and reported as
a crash (in "onnxruntime" when its reference run alone kills a worker too); the worker is
restarted. A failing case is shrunk (tools/debug/shrink.py, through the same worker) and
written as a repro bundle under --out (tools/debug/repro.py; `autoclust replay BUNDLE`
reruns it); the first --per-cause failures of each signature (kind, side, op, cause) are
reported, and the summary counts failures per signature. --features picks
what graphs may contain (tools/fuzz/build.py PRESETS). Exit status 1 when any case
mismatched, crashed or raised.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import hashlib
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from autoclust.tools.debug import repro, shrink
from autoclust.tools.fuzz import check as fuzz_check
from autoclust.tools.fuzz import gen as fuzz_gen
from autoclust.tools.fuzz.check import CRASH, Outcome

from autoclust import registry
from autoclust.report.progress import Progress

DEVICE_ENV = "AUTOCLUST_FUZZ_DEVICE"
# Fault injection for testing the isolation itself: "crash:OP", "hang:OP" or "exit:OP"
# makes the worker's reference of OP segfault, sleep forever or exit with status 3.
INJECT_ENV = "AUTOCLUST_FUZZ_INJECT"
Checker = Callable[[onnx.ModelProto, dict[str, np.ndarray], list[dict]], Outcome]


def default_device() -> str:
    """$AUTOCLUST_FUZZ_DEVICE, else "cpu" when its backend loads, else "interpreter"."""
    env = os.environ.get(DEVICE_ENV)
    if env:
        return env
    from autoclust import registry
    from autoclust.errors import FlagError
    try:
        registry.get_backend("cpu")
    except FlagError:
        return "interpreter"
    return "cpu"


@dataclasses.dataclass
class Summary:
    """Counts of one fuzz run and the failures it found."""

    graphs: int = 0
    mismatches: int = 0
    crashes: int = 0
    errors: int = 0
    invalid: int = 0
    compile_fallbacks: int = 0
    failures: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    causes: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def record(self, outcome: Outcome) -> None:
        self.graphs += 1
        if outcome.failed or outcome.kind == fuzz_check.FALLBACK:
            self.causes[outcome.signature()] += 1
        if outcome.kind == fuzz_check.MISMATCH:
            self.mismatches += 1
        elif outcome.kind == CRASH:
            self.crashes += 1
        elif outcome.kind == fuzz_check.ERROR:
            self.errors += 1
        elif outcome.kind == fuzz_check.INVALID:
            self.invalid += 1
        elif outcome.kind == fuzz_check.FALLBACK:
            self.compile_fallbacks += 1

    @property
    def failed(self) -> int:
        return self.mismatches + self.crashes + self.errors

    def line(self) -> str:
        return (f"graphs {self.graphs}, mismatches {self.mismatches}, crashes {self.crashes}, "
                f"errors {self.errors}, invalid {self.invalid}, "
                f"compile fallbacks {self.compile_fallbacks}")

    def cause_lines(self) -> list[str]:
        """One line per failure signature, most frequent first."""
        return [f"{n:6d}  {sig}" for sig, n in self.causes.most_common()]


# ---- isolation: a worker subprocess ---------------------------------------------------------

WORKER_CACHE = 2  # models (files, and their references in the worker) kept for reuse
# Outputs (and their spreads) a caller computed already: output name -> (value, spread).
Expected = dict[str, tuple[np.ndarray, np.ndarray | None]]


def _fingerprint(arrays: dict[str, Any]) -> tuple:
    """Names, dtypes, shapes and a hash of the bytes: arrays changed in place are new."""
    return tuple((k, str(v.dtype), v.shape, hashlib.blake2b(
        np.ascontiguousarray(v).tobytes(), digest_size=16).hexdigest())
        for k, v in sorted(arrays.items()) if v is not None)


class Worker:
    """A subprocess that checks models sent to it; restarted after a crash or a hang."""

    def __init__(self, timeout: float = 60.0, rtol: float | None = fuzz_check.RTOL,
                 atol: float | None = fuzz_check.ATOL):
        self.timeout = timeout
        self.tolerance = {"rtol": rtol, "atol": atol}
        self.proc: subprocess.Popen | None = None
        self.tmp = tempfile.TemporaryDirectory(prefix="autoclust-fuzz-")
        self.sent: list[tuple[Any, tuple, dict[str, str]]] = []  # (model, fingerprint, files)
        self.written = 0

    def start(self) -> None:
        """Start the worker process now (its imports overlap the caller's work)."""
        self._start()

    def _start(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "autoclust.tools.fuzz.command", "--worker"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                text=True, bufsize=1)
        return self.proc

    def __call__(self, model: onnx.ModelProto, feeds: dict[str, np.ndarray],
                 variants: list[dict], expected: Expected | None = None,
                 interpreter: bool = True) -> Outcome:
        """Check in the worker; a dead or silent worker is a crash. `expected`: onnxruntime's
        outputs and spreads by output name, computed by the caller (then the worker builds
        no reference of its own); interpreter=False skips the interpreter side."""
        request = {**self._files(model, feeds, expected), "variants": variants,
                   "interpreter": interpreter, **self.tolerance}
        proc = self._start()
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
        except BrokenPipeError:
            return self._crashed("worker exited before the case was sent")
        ready, _, _ = select.select([proc.stdout], [], [], self.timeout)
        line = proc.stdout.readline() if ready else ""
        if not line:
            crash = self._crashed("" if ready else f"timed out after {self.timeout:g} s")
            if ready and expected is None and (variants or interpreter) and \
                    self(model, feeds, [], None, False).kind == CRASH:
                crash.where = "onnxruntime"  # its reference alone kills the worker
            return crash
        return Outcome(**json.loads(line))

    def _files(self, model: onnx.ModelProto, feeds: dict[str, np.ndarray],
               expected: Expected | None) -> dict[str, str]:
        """Files of a request for the worker; a request sent again keeps its files, and the
        worker its onnxruntime reference (bisect sends BERT-base, 440 MB, many times)."""
        given = {} if expected is None else {f"{k}/{i}": v[i] for k, v in expected.items()
                                             for i in (0, 1)}
        mark = (model.ByteSize(), _fingerprint(feeds), expected is None, _fingerprint(given))
        for i, (sent, sent_mark, files) in enumerate(self.sent):
            if sent is model and sent_mark == mark:
                self.sent.insert(0, self.sent.pop(i))
                return files
        stem = os.path.join(self.tmp.name, f"case_{self.written}")
        self.written += 1
        files = {"model": stem + ".onnx", "feeds": stem + ".npz"}
        onnx.save_model(model, files["model"])
        np.savez(files["feeds"], **feeds)
        if expected is not None:
            files["expected"] = stem + ".expected.npz"
            repro.save_arrays(files["expected"], {k: v for k, v in given.items()
                                                  if v is not None})
        self.sent.insert(0, (model, mark, files))
        for _, _, old in self.sent[WORKER_CACHE:]:
            for path in old.values():
                os.remove(path)
        del self.sent[WORKER_CACHE:]
        return files

    def _crashed(self, why: str) -> Outcome:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            # It closed its output (why ""): let it exit with its own status, not our kill
            # (a Python error in the oracle read as "killed by signal 9").
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0 if why else 10)
        if proc is not None and proc.poll() is None:
            proc.kill()
        code = proc.wait() if proc is not None else None
        self.proc = None
        why = why or (f"worker killed by signal {-code}" if code is not None and code < 0
                      else f"worker exited with status {code}")
        return Outcome(CRASH, "process", why)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        self.tmp.cleanup()


def _inject_fault(spec: str) -> None:
    import ctypes

    from autoclust import ops
    mode, _, op = spec.partition(":")
    d = ops.get(op)
    if d is None or mode not in ("crash", "hang", "exit"):
        raise SystemExit(f"{INJECT_ENV}={spec!r}: expected crash:OP, hang:OP or exit:OP")

    def ref(inputs: list, attrs: dict) -> list:
        if mode == "crash":
            ctypes.string_at(0)  # a NULL read: SIGSEGV, as a miscompiled kernel would
        if mode == "exit":  # past check's `except Exception`, as an error of the oracle
            raise SystemExit(3)
        time.sleep(1e6)
        return []

    ops.replace(dataclasses.replace(d, ref=ref))


def _quiet_onnxruntime() -> None:
    """No onnxruntime log lines from autoclust's fallback sessions: run-time errors are
    expected (error profiles) and the fuzzer reports every one that matters."""
    import onnxruntime
    onnxruntime.set_default_logger_severity(4)


def _reference(req: dict[str, Any]) -> fuzz_check.Reference | Outcome:
    """The reference of a worker request: onnxruntime's, or the one the request carries."""
    model = onnx.load(req["model"])
    with np.load(req["feeds"]) as z:
        feeds = {k: z[k] for k in z.files}
    if not req.get("expected"):
        return fuzz_check.reference(model, feeds)
    given = repro.load_arrays(req["expected"])
    names = [o.name for o in model.graph.output]
    return fuzz_check.given(model, feeds, [given[f"{n}/0"] for n in names],
                            [given.get(f"{n}/1") for n in names])


def worker_loop() -> int:
    """The worker side: one JSON request per stdin line, one Outcome per line back."""
    _quiet_onnxruntime()
    if os.environ.get(INJECT_ENV):
        _inject_fault(os.environ[INJECT_ENV])
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything the code under test prints must not corrupt the protocol
    known: dict[tuple, Any] = {}  # request files -> their reference, most recent last
    for line in sys.stdin:
        req = json.loads(line)
        key = (req["model"], req["feeds"], req.get("expected"))
        ref = known.pop(key, None) or _reference(req)
        known[key] = ref  # the driver keeps WORKER_CACHE requests' files
        for old in list(known)[:-WORKER_CACHE]:
            del known[old]
        outcome = ref if isinstance(ref, Outcome) else fuzz_check.check(
            ref.model, ref.feeds, req["variants"], req.get("rtol", fuzz_check.RTOL),
            req.get("atol", fuzz_check.ATOL), ref, req.get("interpreter", True))
        out.write(json.dumps(dataclasses.asdict(outcome), default=str) + "\n")
    return 0


# ---- the fuzz loop --------------------------------------------------------------------------

def variants_for_case(case: fuzz_gen.Case, device: str, metamorphic: int = 2,
                      check_bounds: bool = True) -> list[dict]:
    """The deterministic flag variants of a case (depend only on its seed)."""
    rng = np.random.default_rng([*case.seed, 1])
    return fuzz_check.variants_for(case.model, device, rng, metamorphic, check_bounds)


def crashes_onnxruntime(outcome: Outcome) -> bool:
    """Whether onnxruntime's own reference run killed the worker (Worker.__call__): then
    nothing may run onnxruntime over the model in this process."""
    return outcome.kind == CRASH and outcome.where == "onnxruntime"


def shrink_failure(case: fuzz_gen.Case, variants: list[dict], outcome: Outcome,
                   checker: Checker) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The smallest graph found that fails like `outcome` does."""
    if outcome.where == "interpreter":
        variants = []
    elif outcome.kind != CRASH:
        variants = [outcome.flags]

    def still_fails(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> bool:
        return outcome.same_failure(checker(model, feeds, variants))

    # Cutting nodes feeds the cut values from onnxruntime, run here: not on a model that
    # crashes it (fuzz 81/371: int32 INT_MIN / -1 in onnxruntime's Div, SIGFPE, took the
    # whole run down).
    phases = tuple(p for p in shrink.PHASES if p != "nodes" or not crashes_onnxruntime(outcome))
    return shrink.shrink(case.model, case.feeds, still_fails, phases)


def _report(case: fuzz_gen.Case, variants: list[dict], outcome: Outcome, checker: Checker,
            out_dir: str | None, device: str, log: Callable[[str], None]) -> dict[str, Any]:
    seed, index = case.seed
    info: dict[str, Any] = {"seed": seed, "case": index, "kind": outcome.kind,
                            "where": outcome.where, "message": outcome.message,
                            "flags": outcome.flags, "device": device, "variants": variants,
                            "original_nodes": len(case.model.graph.node)}
    log(f"case {seed}/{index}: {outcome.kind} in {outcome.where}: "
        f"{outcome.message.splitlines()[0] if outcome.message else ''}")
    if out_dir is None:
        return info
    model, feeds = shrink_failure(case, variants, outcome, checker)
    folder = os.path.join(out_dir, f"case_{seed}_{index}_{outcome.kind}")
    info["shrunk_ops"] = fuzz_check.ops_of(model)
    info["bundle"] = repro.write_bundle(folder, model, feeds, info,
                                        reference=not crashes_onnxruntime(outcome))
    log(f"  shrunk {info['original_nodes']} -> {len(model.graph.node)} nodes "
        f"({' '.join(info['shrunk_ops'])}): {folder}")
    return info


def run(seed: int, cases: int | None = None, seconds: float | None = None,
        device: str | None = None, out_dir: str | None = None,
        checker: Checker | None = None, max_reports: int = 10,
        log: Callable[[str], None] = lambda s: None, progress: Any = None,
        features: frozenset = fuzz_gen.ALL, per_cause: int = 2, first: int = 0,
        check_bounds: bool = True) -> Summary:
    """Fuzz cases first, first+1, ... until `cases` graphs or `seconds` pass; in-process
    unless `checker` isolates. The first `per_cause` failures of each signature are shrunk
    and reported.

    `progress` (an autoclust.report.progress.Progress) is told about every finished graph."""
    device = device or default_device()
    check = checker or fuzz_check.check
    summary = Summary()
    deadline = None if seconds is None else time.monotonic() + seconds
    index = first
    while ((cases is None or index < first + cases)
           and (deadline is None or time.monotonic() < deadline)):
        case = fuzz_gen.case_for(seed, index, features)
        variants = variants_for_case(case, device, check_bounds=check_bounds)
        outcome = check(case.model, case.feeds, variants)
        summary.record(outcome)
        if outcome.kind == fuzz_check.FALLBACK:
            log(f"case {seed}/{index}: compile fallback in {outcome.where}: "
                f"{outcome.message.splitlines()[0]}")
        if (outcome.failed and len(summary.failures) < max_reports
                and summary.causes[outcome.signature()] <= per_cause):
            summary.failures.append(_report(case, variants, outcome, check, out_dir, device,
                                            log))
        index += 1
        if progress is not None:
            progress.update(detail=f"{summary.failed} failed")
    return summary


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="autoclust fuzz", description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=None, help="stop after this long")
    p.add_argument("--cases", type=int, default=None, help="stop after this many graphs")
    p.add_argument("--seed", type=int, default=0, help="seed of the graph generator "
                   "(default 0); a case is reproduced from its seed and index")
    p.add_argument("--device", default=None, choices=registry.device_names(),
                   help=f"device under test (default: ${DEVICE_ENV}, else cpu if usable)")
    p.add_argument("--out", default=None, help="write shrunk repro bundles here")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    p.add_argument("--max-reports", type=int, default=10, help="failures shrunk and reported")
    p.add_argument("--per-cause", type=int, default=2, help="failures reported per signature")
    p.add_argument("--features", default="all", help="a preset (all, classic, values, empty, "
                   "index, int, round) or comma-separated generator groups and switches")
    p.add_argument("--in-process", action="store_true", help="no worker (faster, not isolated)")
    p.add_argument("--no-check-bounds", action="store_true", help="compiled CPU kernels do "
                   "not check their loads and stores (--check_bounds, on by default here)")
    p.add_argument("--log", action="store_true",
                   help="progress lines when stderr is not a terminal (a bar when it is)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of `autoclust fuzz`; exit status 1 when any case failed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:  # `autoclust fuzz -- --seconds 10`: argparse REMAINDER keeps it
        argv = argv[1:]
    args = _parser().parse_args(argv)
    if args.worker:
        return worker_loop()
    _quiet_onnxruntime()
    if args.seconds is None and args.cases is None:
        args.cases = 100
    worker = None if args.in_process else Worker(args.timeout)
    device = args.device or default_device()
    print(f"autoclust fuzz: seed {args.seed}, device {device}", flush=True)
    bar = Progress("autoclust fuzz", total=args.cases, unit="graph", log=args.log, delay=0)
    try:
        features = fuzz_gen.features_from(args.features)
        summary = run(args.seed, args.cases, args.seconds, device, args.out, worker,
                      args.max_reports, log=lambda s: bar.write(s, stream=sys.stdout),
                      progress=bar, features=features, per_cause=args.per_cause,
                      check_bounds=not args.no_check_bounds)
    finally:
        bar.close()
        if worker is not None:
            worker.close()
    print(summary.line())
    print("\n".join(summary.cause_lines()))
    return 1 if summary.failed else 0


if __name__ == "__main__":
    sys.exit(main())
