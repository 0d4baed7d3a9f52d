"""`autoclust compile`: every cluster rendered ahead of time, without CuPy or a GPU.

The CUDA of every zoo model goes through one nvcc --ptx call (skipped without nvcc); the
CPU variant writes LLVM IR that llvmlite must parse; kernel counts match what a session
compiles; clusters whose shapes are only known at run time are listed as skipped.
"""

from __future__ import annotations

import os
import shutil

from autoclust.models import zoo
from autoclust.tools import aot, cli
from support import paths
from support.gpu_render import needs_nvcc, nvcc_ptx

import autoclust
from autoclust import flags as flags_mod

MODELS = paths.MODELS


def test_compile_command_writes_cu_kernels_and_ptx(tmp_path, capsys):
    out = tmp_path / "kernels"
    rc = cli.main(["compile", os.path.join(MODELS, "bert_encoder.onnx"), "--device", "gpu",
                   "--dim", "seq=24", "--dim", "batch=3", "--dump_to", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "batch=3" in text and "seq=24" in text
    files = set(os.listdir(out))
    assert {"cluster_0000.cu", "cluster_0000.kernels.txt", "summary.txt",
            "cluster_0000.after_optimizations.txt"} <= files
    kernels = (out / "cluster_0000.kernels.txt").read_text()
    assert "GPU launches:" in kernels and "warp-row" in kernels and "vector" in kernels
    assert "[3, 24] | [64]" in kernels or "[3, 24]" in kernels  # the --dim sizes
    if shutil.which("nvcc"):
        assert ".entry k_" in (out / "cluster_0000.ptx").read_text()
    else:
        assert "nvcc not found" in text


def test_cpu_variant_writes_llvm_ir(tmp_path):
    from llvmlite import binding as llvm
    model = zoo.build("llama_block")
    flags = flags_mod.parse("")
    results, _ = aot.compile_model(model, "cpu", zoo.default_dims(model), str(tmp_path), flags)
    sess = autoclust.InferenceSession(model, symbolic_dims=False)  # concrete, as compile is
    sess.run(None, zoo.feeds(model))
    assert [r.kernels for r in results] == [k[0] for c in sess.stats()["clusters"]
                                             for k in [c["kernels"]]]
    ll = (tmp_path / "cluster_0000.ll").read_text()
    llvm.parse_assembly(ll).verify()


def test_runtime_dims_are_skipped_with_the_reason(tmp_path):
    model = zoo.build("mixed_dynamic")
    results, _ = aot.compile_model(model, "gpu", zoo.default_dims(model), str(tmp_path),
                                   flags_mod.parse(""), ptx=False)
    done = [r for r in results if not r.skipped]
    skipped = [r for r in results if r.skipped]
    assert [r.cluster for r in done] == ["cluster_0000"]
    assert len(skipped) == 3
    assert all("shape that is unknown ahead of time" in r.skipped for r in skipped)
    assert "NonZero" in skipped[0].skipped  # names the data-dependent input


def test_bad_dim_is_a_usage_error(tmp_path, capsys):
    rc = cli.main(["compile", os.path.join(MODELS, "gelu.onnx"), "--dim", "n=abc",
                   "--dump_to", str(tmp_path)])
    assert rc == 2
    assert "--dim takes NAME=VALUE" in capsys.readouterr().err


@needs_nvcc
def test_cuda_of_every_zoo_model_compiles(tmp_path):
    """Every zoo model at its bench preset (realistic sizes, 64-bit indices where needed):
    rendered per model, then one nvcc call over all of them."""
    paths = []
    for name in zoo.BUILDERS:
        model = zoo.build(name, preset="bench")
        out = tmp_path / name
        results, _ = aot.compile_model(model, "gpu", zoo.default_dims(model), str(out),
                                       flags_mod.parse(""), ptx=False)
        for r in results:
            for f in r.files:
                if f.endswith(".cu"):  # nvcc names outputs by basename: make them unique
                    unique = tmp_path / f"{name}_{f}"
                    shutil.copy(out / f, unique)
                    paths.append(str(unique))
    assert len(paths) >= 12
    nvcc_ptx(paths, str(tmp_path))
    for p in paths:
        ptx = p[:-3] + ".ptx"
        with open(ptx) as f:
            assert ".entry" in f.read(), ptx
