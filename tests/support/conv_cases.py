"""Hypothesis strategies for convolution and pool geometries, shared by the integer convolutions'
tests (test_qlinear_conv_gpu), the float Conv's (test_conv_gemm_gpu) and the pool family's
(test_max_pool_indices_gpu, test_max_unpool_gpu)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st


@dataclass(frozen=True)
class ConvGeometry:
    """A convolution's shapes and attributes: x [n, group * cg, *ins], w [m, cg, *k],
    m = group * mg; ``attrs`` as the node writes them (auto_pad, strides, dilations, pads, group
    and kernel_shape each sometimes omitted where the default would do)."""

    n: int
    group: int
    cg: int
    mg: int
    k: tuple[int, ...]
    ins: tuple[int, ...]
    attrs: dict
    nsp: int

    @property
    def m(self) -> int:
        return self.group * self.mg

    @property
    def x_shape(self) -> tuple[int, ...]:
        return (self.n, self.group * self.cg, *self.ins)

    @property
    def w_shape(self) -> tuple[int, ...]:
        return (self.m, self.cg, *self.k)


@st.composite
def conv_geometries(draw, max_in=None):
    """1-D/2-D/3-D, groups and depthwise, kernel 1-3, strides and dilations 1-2, explicit pads
    0-2 or auto_pad (SAME_UPPER / SAME_LOWER / VALID); ``max_in``: the largest spatial size per
    rank (default 9, 7, 4)."""
    nsp = draw(st.sampled_from([1, 2, 2, 3]))
    n = draw(st.sampled_from([1, 1, 2]))
    depthwise = draw(st.integers(0, 3)) == 0
    if depthwise:
        c = draw(st.sampled_from([1, 3, 4]))
        group, cg, mg = c, 1, draw(st.sampled_from([1, 2]))
    else:
        group = draw(st.sampled_from([1, 1, 2, 3]))
        cg = draw(st.sampled_from([1, 2, 3, 5]))
        mg = draw(st.sampled_from([1, 2, 3, 5, 8]))
    top = (max_in or {1: 9, 2: 7, 3: 4})[nsp]
    k = [draw(st.integers(1, 3)) for _ in range(nsp)]
    strides = [draw(st.integers(1, 2)) for _ in range(nsp)]
    dil = [draw(st.integers(1, 2)) for _ in range(nsp)]
    auto = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    pads_b = [draw(st.integers(0, 2)) for _ in range(nsp)] if auto == "NOTSET" else [0] * nsp
    pads_e = [draw(st.integers(0, 2)) for _ in range(nsp)] if auto == "NOTSET" else [0] * nsp
    ins = []
    for i in range(nsp):
        ek = (k[i] - 1) * dil[i] + 1
        lo = 1 if auto.startswith("SAME") else max(1, ek - pads_b[i] - pads_e[i])
        ins.append(draw(st.integers(lo, max(lo, top))))
    attrs = {}
    if auto != "NOTSET" or draw(st.booleans()):
        attrs["auto_pad"] = auto
    if any(s != 1 for s in strides) or draw(st.booleans()):
        attrs["strides"] = strides
    if any(d != 1 for d in dil) or draw(st.booleans()):
        attrs["dilations"] = dil
    if auto == "NOTSET" and (any(pads_b + pads_e) or draw(st.booleans())):
        attrs["pads"] = pads_b + pads_e
    if group != 1 or draw(st.booleans()):
        attrs["group"] = group
    if draw(st.booleans()):
        attrs["kernel_shape"] = k
    return ConvGeometry(n, group, cg, mg, tuple(k), tuple(ins), attrs, nsp)


@st.composite
def opset_type_window(draw, opsets: dict, max_kernel: int):
    """The pool family's draw (MaxPool with Indices, MaxUnpool): an opset of ``opsets`` (version ->
    the element types the kernel takes there), one of its types and a kernel_shape of 1-3 spatial
    axes; with it, sometimes, strides of 1-3 per axis (None: left to the default)."""
    opset = draw(st.sampled_from(sorted(opsets)))
    dtype = draw(st.sampled_from(opsets[opset]))
    kernel = [draw(st.integers(1, max_kernel)) for _ in range(draw(st.integers(1, 3)))]
    strides = [draw(st.integers(1, 3)) for _ in kernel] if draw(st.booleans()) else None
    return opset, dtype, kernel, strides
