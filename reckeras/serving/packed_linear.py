"""Dense layers on prepacked weights: the predictor's rewrite of the program.

Keras's `Dense` exports as `matmul(x, kernel)`, then `add(·, bias)`, then the
activation, each a separate op, and the kernel in the layout Keras keeps.
At serving the kernel never changes, so, once when the artifact loads, each
such chain whose kernel and bias are constants of the program becomes one
oneDNN linear on the kernel reordered into oneDNN's blocked layout, with the
bias (and a ReLU) applied inside (`torch.ops.mkldnn._linear_pointwise`, what
torch's own compiler emits for frozen CPU linears). On this CPU it halves
the dense network of the `dlrm` model at batch 256, one thread (2.67 ms ->
1.15 ms). The result is float32 arithmetic as before; only the order of the
sums differs, so outputs move by float32 rounding.

The export also holds what Keras's `convert_to_tensor` leaves: an
`aten.to` to the dtype the tensor already has and its metadata assert. The
rewrite drops those that the export's own shapes prove to be no-ops.

Where torch lacks oneDNN (`backend_kernels.dense_matmul.available`) the
program is left as exported.
"""

from __future__ import annotations

import torch

from reckeras.backend_kernels import dense_matmul

_aten = torch.ops.aten


def pack_linear_layers(program: torch.fx.GraphModule) -> int:
    """Rewrites, in place, every `matmul(x, constant kernel)` of `program`
    (with the `add` of a constant bias and a `relu` that follow it alone)
    into one oneDNN linear on the prepacked kernel.

    Args:
        program: the module of a loaded `torch.export` program
            (`ExportedProgram.module()`), run on CPU.

    Returns:
        How many matmuls were rewritten (0 where oneDNN is missing).

    Example:

    ```python
    module = torch.export.load("artifact/dense.pt2").module()
    pack_linear_layers(module)   # 6 for the dlrm model
    ```
    """
    if not dense_matmul.available():
        return 0
    graph = program.graph
    _drop_noop_conversions(program)
    packed = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not _aten.matmul.default:
            continue
        inputs, kernel_node = node.args
        kernel = _constant(program, kernel_node)
        example = inputs.meta.get("val") if isinstance(inputs, torch.fx.Node) else None
        if (kernel is None or kernel.dim() != 2 or kernel.dtype != torch.float32
                or example is None or example.dim() < 2 or example.dtype != torch.float32):
            continue
        last, bias, activation = node, None, "none"
        following = _only_user(last)
        if following is not None and following.target is _aten.add.Tensor \
                and not following.kwargs:                # no alpha
            other = following.args[1] if following.args[0] is last else following.args[0]
            candidate = _constant(program, other)
            if (candidate is not None and candidate.dtype == torch.float32
                    and candidate.shape == (kernel.shape[1],)):
                last, bias = following, candidate.contiguous()
                following = _only_user(last)
        if following is not None and following.target is _aten.relu.default:
            last, activation = following, "relu"
        name = f"_packed_linear_{packed}"
        program.register_buffer(name + "_weight", torch.ops.mkldnn._reorder_linear_weight(
            kernel.t().contiguous()), persistent=False)
        with graph.inserting_before(node):
            weight = graph.get_attr(name + "_weight")
            bias_node = None
            if bias is not None:
                program.register_buffer(name + "_bias", bias, persistent=False)
                bias_node = graph.get_attr(name + "_bias")
            linear = graph.call_function(torch.ops.mkldnn._linear_pointwise.default,
                                         (inputs, weight, bias_node, activation, [], ""))
        linear.meta["val"] = last.meta.get("val")
        last.replace_all_uses_with(linear)
        packed += 1
    graph.eliminate_dead_code()
    program.recompile()
    return packed


def _drop_noop_conversions(program: torch.fx.GraphModule) -> None:
    """Removes the `aten.to` nodes whose operand already has their dtype,
    layout and device (by the export's recorded values, or the constant
    itself), and the metadata asserts that check so: Keras's
    `convert_to_tensor` of a tensor. The program's inputs keep theirs."""
    graph = program.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or not node.args:
            continue
        operand = node.args[0]
        if not isinstance(operand, torch.fx.Node) or operand.op == "placeholder":
            continue
        if node.target is _aten._assert_tensor_metadata.default:
            if _matches(program, operand, node.kwargs):
                graph.erase_node(node)
            continue
        converts_to = _conversion_to(node)
        if converts_to is not None and _matches(program, operand, converts_to):
            node.replace_all_uses_with(operand)
            graph.erase_node(node)


def _conversion_to(node: torch.fx.Node) -> dict | None:
    """What an `aten.to` node converts to (dtype, layout, device), or None
    for any other node and for a `to` that copies."""
    if node.target is _aten.to.dtype_layout and len(node.args) == 1 and \
            set(node.kwargs) <= {"dtype", "layout", "device"}:
        return dict(node.kwargs)
    if node.target is _aten.to.dtype and len(node.args) == 2 and not node.kwargs:
        return {"dtype": node.args[1]}
    return None


def _matches(program: torch.fx.GraphModule, node: torch.fx.Node, wanted: dict) -> bool:
    value = _constant(program, node)
    if value is None:
        value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return False
    device = wanted.get("device")
    return (wanted.get("dtype", value.dtype) == value.dtype
            and wanted.get("layout", value.layout) == value.layout
            and (device is None or torch.device(device) == value.device))


def _only_user(node):
    users = list(node.users)
    return users[0] if len(users) == 1 and users[0].op == "call_function" else None


def _constant(program: torch.fx.GraphModule, node):
    """The tensor a `get_attr` node reads, or None for anything else."""
    if not isinstance(node, torch.fx.Node) or node.op != "get_attr" \
            or not isinstance(node.target, str):
        return None
    value: object = program
    for part in node.target.split("."):
        value = getattr(value, part, None)
    return value if isinstance(value, torch.Tensor) else None
