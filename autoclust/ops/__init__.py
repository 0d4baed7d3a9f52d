"""The op table: every supported op defined once.

An OpDef holds everything about an op that any part of autoclust reads:
- `kind`, `infer` (the dtype+shape rule, symbolic-aware) and `ref` (the NumPy reference:
  the semantics, used by constant folding, the interpreter and the tests);
- `lower`, its lowering to kernel IR, written against autoclust.kernel.lowering.LowerCtx; library
  ops (MatMul, Conv, ...) lower to library calls instead, and an op that is never lowered
  says why in `refuse`;
- `dtypes`: the dtypes compiled code supports for it (None: every COMPILABLE_TYPES dtype);
- `shape_inputs` (inputs whose *values* decide output shapes: Reshape's shape, Slice's
  starts, ...) and `const_inputs` (further inputs the lowering needs as constants);
- `weight` toward --min_cluster_size, `view` (output 0 is input 0's elements in the same
  row-major order: Reshape and friends), `cost` (relative compute cost, for recomputing
  inlined values), `shape_of` (output depends only on input 0's shape: Shape, Size) and
  `shape_like` (a shape computation when fed only by shape-static values);
- `data_dependent` (output shape depends on data: NonZero, Unique).
Other modules ask the table (`ops.get(op)`); there are no side lists of op names.

Rules are written against ONE form of each op: the newest opset's. The ONNX importer
rewrites older forms (axes/min/max/pads/split/... as attributes) into inputs before ops
see them, so `ref`, `infer` and `lower` never branch on opset.

Contracts:
- `infer(ctx) -> list[(dtype, shape)]`, one entry per output; raise ShapeInferenceError
  (via `ctx.fail(...)`) on inputs the op rejects. Shapes follow autoclust.ir: int, str
  (symbolic), None (unknown) dims; None for unknown rank.
- `ref(inputs, attrs) -> list[np.ndarray]`: inputs are numpy arrays (None for omitted
  optional inputs); outputs must have exactly the dtypes onnxruntime produces.
- `lower(ctx) -> kernel_ir.Expr`: the expression of output `ctx.out` at `ctx.idx`.

The table itself (OpDef, kinds, dtype sets, `register`, `get`) is `table.py`; the op
modules (elementwise, activations, reduction, normalization, layout, slicing,
layout_index, shape, library, contrib, quantize) register into it when this package is
imported, and it re-exports the table's names: `ops.get(op, domain)` returns the OpDef or
None.
"""

# Imported for their registrations; order does not matter.
from autoclust.ops import (  # noqa: F401
    activations,
    attention,
    contrib,
    elementwise,
    layout,
    layout_index,
    library,
    normalization,
    quantize,
    reduction,
    shape,
    slicing,
)
from autoclust.ops.table import (  # noqa: F401 - the table's names, as ops.<name>
    ALL_TYPES,
    BFLOAT16,
    BOOL,
    COMPILABLE_TYPES,
    DATA_DEPENDENT,
    ELEMENTWISE,
    F16,
    FLOAT_TYPES,
    FUSIBLE_KINDS,
    GROUP_OF_KIND,
    I32,
    INT64,
    INT_TYPES,
    KINDS,
    LAYOUT,
    LIBRARY,
    NARROW_INT_TYPES,
    NORMALIZATION,
    NUMERIC_TYPES,
    REDUCTION,
    SHAPE,
    Arrays,
    Attrs,
    InferContext,
    InferFn,
    OpDef,
    RefFn,
    TypeShape,
    all_ops,
    broadcast_dims,
    broadcast_shapes,
    context_for,
    dense,
    dim_product,
    get,
    in_group,
    infer_node,
    is_external,
    normalize_axis,
    register,
    register_external,
    replace,
    run_ref,
    same_as_input,
    unregister_external,
)
