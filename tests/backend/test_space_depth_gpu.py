"""DepthToSpace and SpaceToDepth on the GPU (templates/space_depth.base.json over
strided-gather.wgsl.jinja): bit for bit with onnx.reference and numpy's reshape/transpose for
every element type with a device layout (64-bit types as two words, 16- and 8-bit packed), both
modes, every schema version; ONNX's node cases pass with no host fallback. On both lavapipe adapters
(conftest's ``dev``: Vulkan, then OpenGL where present)."""

from __future__ import annotations

import numpy as np
import pytest

from support.arrays import TYPES, typed
from support.models import node_model
from support.oracles import assert_same_bits, ref_run
from support.run import run_node


def depth_to_space(x, b, mode):
    n, c, h, w = x.shape
    if mode == "DCR":
        t = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        t = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return t.reshape(n, c // (b * b), h * b, w * b)


def space_to_depth(x, b, mode):
    n, c, h, w = x.shape
    t = x.reshape(n, c, h // b, b, w // b, b)
    t = t.transpose(0, 3, 5, 1, 2, 4) if mode == "DCR" else t.transpose(0, 1, 3, 5, 2, 4)
    return t.reshape(n, c * b * b, h // b, w // b)


#: op -> (input shape, blocksize, opset, numpy reference)
FORMS = {"DepthToSpace": ((2, 12, 3, 5), 2, 13, depth_to_space), "SpaceToDepth": ((2, 3, 6, 9), 3, 28, space_to_depth)}


@pytest.mark.parametrize("dtype", TYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("op", sorted(FORMS))
def test_every_type(dev, op, dtype, mode):
    shape, block, opset, reference = FORMS[op]
    x = typed(shape, dtype, seed=1 if op == "DepthToSpace" else 2)
    model = node_model(op, [("x", x)], ["y"], attrs={"blocksize": block, "mode": mode}, opset=opset)
    (got,), _ = run_node(dev, model, {"x": x})
    assert_same_bits(got, reference(x, block, mode), f"{op} {mode}")
    assert_same_bits(got, ref_run(model, {"x": x})[0], "vs onnx.reference")


@pytest.mark.parametrize("op,opset", [("DepthToSpace", 1), ("DepthToSpace", 11), ("SpaceToDepth", 1), ("SpaceToDepth", 13)])
def test_versions_before_mode_use_dcr(dev, op, opset):
    x = typed((1, 8, 4, 6), np.int64, seed=3)
    attrs = {"blocksize": 2, **({"mode": "CRD"} if opset == 11 else {})}
    model = node_model(op, [("x", x)], ["y"], attrs=attrs, opset=opset)
    (got,), _ = run_node(dev, model, {"x": x})
    fn = depth_to_space if op == "DepthToSpace" else space_to_depth
    assert_same_bits(got, fn(x, 2, attrs.get("mode", "DCR")), f"{op}-{opset}")


def test_mode_attribute_declined_where_the_schema_has_none_and_bad_blocks_declined(dev):
    from onnx_quant.backend_wgpu.planner import plan_node
    from onnx_quant.errors import KernelRejected
    from support.run import registry

    def plan(op, opset, x_shape, y_shape, attrs):
        return plan_node(registry().find("", op, opset), shapes={"x": x_shape, "y": y_shape},
                         dtypes={"x": "float32", "y": "float32"}, device=dev.info, attributes=attrs)

    with pytest.raises(KernelRejected, match="mode"):
        plan("SpaceToDepth", 13, (1, 8, 4, 6), (1, 32, 2, 3), {"blocksize": 2, "mode": "DCR"})
    with pytest.raises(KernelRejected, match="modeKnown"):
        plan("DepthToSpace", 13, (1, 8, 4, 6), (1, 2, 8, 12), {"blocksize": 2, "mode": "XYZ"})
    with pytest.raises(KernelRejected, match="blocksFit"):
        plan("DepthToSpace", 13, (1, 6, 4, 6), (1, 1, 8, 12), {"blocksize": 2})
    with pytest.raises(KernelRejected, match="blocksFit"):
        plan("SpaceToDepth", 28, (1, 6, 5, 6), (1, 24, 2, 3), {"blocksize": 2})
    assert plan("SpaceToDepth", 28, (1, 6, 4, 6), (1, 24, 2, 3), {"blocksize": 2, "mode": "CRD"}).variant


def test_node_cases_pass_on_the_gpu(dev):
    from support.gpu import assert_node_cases_pass_or_declined

    assert_node_cases_pass_or_declined(dev, ("DepthToSpace", "SpaceToDepth"), {}, at_least=12)  # expansions too
