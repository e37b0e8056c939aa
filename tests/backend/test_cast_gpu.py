"""Cast and CastLike on the GPU (templates/cast.base.json, cast*.kernel.json, cast_like*.kernel.json,
cast.wgsl.jinja, snippets/cast.wgsl.jinja) against onnx.reference, bit for bit.

- The specs take exactly onnx.defs' types (less string) at every schema version, with the
  schema's attributes.
- Every (source, target) pair of the 25 types with a device layout, on edge values (NaN, ±inf,
  ±0, subnormals of every format, max / min, rounding ties of every target, values just out of
  range, float64 values that need their low bits) and on every code of the 2- to 16-bit types:
  the GPU's bits equal onnx.reference's (numpy / ml_dtypes). Where onnx.reference itself cannot
  cast (ml_dtypes has no such cast: NO_REFERENCE, checked to still fail), the oracle is the cast
  through int64 (integer sources) or float32 (float sources), which ml_dtypes can do.
- saturate (float8 targets) and round_mode (float8e8m0) in every combination; CastLike (15, 19,
  25) with the same oracle; both variants agree.
- ONNX's node cases of Cast and CastLike all pass on the GPU with no host fallback (DECLINED is
  empty: none is declined); a cast from or to string (no device layout) declines to the host.
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnx_quant.dtypes import BY_NAME

ALL = ["float32", "float16", "bfloat16", "float64", "int64", "uint64", "int32", "uint32", "int16", "uint16", "int8",
       "uint8", "int4", "uint4", "int2", "uint2", "float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz",
       "float8e8m0", "float4e2m1", "float6e2m3", "float6e3m2", "bool"]
INT_BITS = {"int64": 64, "uint64": 64, "int32": 32, "uint32": 32, "int16": 16, "uint16": 16, "int8": 8, "uint8": 8,
            "int4": 4, "uint4": 4, "int2": 2, "uint2": 2}
FLOAT8 = ["float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "float8e8m0"]

#: pairs onnx.reference (ml_dtypes 0.6) cannot cast at all ("Cannot cast array data"), per attributes
NO_REFERENCE = {
    **{(s, d): "always" for s, d in [
        ("int4", "uint4"), ("int4", "int2"), ("int4", "uint2"), ("int4", "float6e2m3"), ("uint4", "int4"),
        ("uint4", "int2"), ("uint4", "uint2"), ("uint4", "float6e2m3"), ("int2", "uint4"), ("int2", "uint2"),
        ("uint2", "int4"), ("uint2", "int2"), ("float8e8m0", "int4"), ("float8e8m0", "uint4"), ("float8e8m0", "int2"),
        ("float8e8m0", "uint2"), ("float8e8m0", "float4e2m1"), ("float8e8m0", "float6e2m3"),
        ("float8e8m0", "float6e3m2"), ("float6e2m3", "int4"), ("float6e2m3", "uint4")]},
    # without saturation the float8 targets are a plain astype, which ml_dtypes lacks from e8m0
    **{("float8e8m0", d): "saturate=0" for d in FLOAT8[:4]},
}


def np_dtype(t: str) -> np.dtype:
    return np.dtype(BY_NAME[t].numpy_dtype) if hasattr(BY_NAME[t], "numpy_dtype") else np.dtype(BY_NAME[t].dtype)


def code(t: str) -> int:
    return BY_NAME[t].code


def float_edges() -> np.ndarray:
    """float64 values: specials, every target's boundaries and ties, and random magnitudes."""
    r = np.random.default_rng(0)
    special = [
        np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.4999, 300.7, -300.7,
        127.5, -128.5, 255.5, 256.0, 65535.5, 65536.0, -32768.7, 2**31, -2**31, 2**31 - 128, -2**31 - 256, 2**32,
        2**32 - 256, 3e9, -3e9, 2**63, -2**63, 2**64, 2**63 - 2**40, -2**63 - 2**41, 1.8e19, 2e19, 1e20, -1e20, 3.4e38,
        -3.4e38, 3.5e38, 1e300, -1e300, 65504, 65519.99, 65520, 65536, 448, 464, 465, 480, 240, 247, 248, 57344, 61439,
        61440, 6, 7, -7, 5, 0.25, 0.75, 1.25, 1.75, 2**-126, 2**-127, 2**-149, 2**-150, 2**-151, 1.4e-45, 3e-45, 2**-24,
        2**-25, 2**-25 * 1.0001, 3 * 2**-26, 2**-14, 2**-9, 2**-10, 2**-17, 2**-16, 1e-310, -1e-320, 2**-1074,
        1 + 2**-11, 1 + 2**-11 + 2**-40, 1 + 2**-8 + 2**-30, 1 + 2**-24, 1 + 2**-24 + 2**-50, 1 + 3 * 2**-24,
        1.5 * 2**127, 2**127, 2**127 * 1.9, 2.0**128 - 2**103, 2.0**128 - 2**104, 1.2e-38, 5.9e-39]
    rand = r.standard_normal(300) * np.exp(r.uniform(-20, 20, 300))
    small = r.standard_normal(100) * 100
    return np.concatenate([np.array(special, np.float64), rand, small, np.round(small)])


def int_edges(t: str) -> np.ndarray:
    r = np.random.default_rng(1)
    v = [0, 1, -1, 2, -2, 3, 7, 8, -8, -9, 15, 16, 127, 128, -128, -129, 255, 256, 300, -300, 32767, 32768, -32768,
         65535, 65536, 65504, 65519, 65520, 65521, 2**24 + 1, 2**24 + 3, 2**24 + 2**16 + 1, -(2**24 + 2**16 + 1),
         2**31 - 1, -2**31, 2**31, 2**32 - 1, 2**32, 2**53 + 1, 2**53 + 3, 2**62 + 2**38 + 1, 2**63 - 1, -2**63,
         2**63 + 2**39 + 1, 2**64 - 1, 448, 464, 57344, 61440]
    v += [int(i) for i in r.integers(-2**63, 2**63 - 1, 100, dtype=np.int64)] + [int(i) for i in r.integers(-70000, 70000, 100)]
    bits, signed = INT_BITS[t], not t.startswith("u")
    wrapped = []
    for x in v:
        x %= 1 << bits
        wrapped.append(x - (1 << bits) if signed and x >= 1 << (bits - 1) else x)
    return np.array(wrapped, np.int64 if signed else np.uint64).astype(np_dtype(t))


def inputs_for(t: str) -> np.ndarray:
    """Every code of the types up to 16 bits; edge values of the wider ones."""
    if t == "bool":
        return np.array([True, False, True, False])
    dt = np_dtype(t)
    if dt.itemsize <= 2 and t not in ("int16", "uint16"):
        n = 1 << (8 * dt.itemsize)
        raw = np.arange(n, dtype=np.uint16 if n > 256 else np.uint8)
        if t in ("int4", "uint4", "float4e2m1"):
            raw = raw[:16]
        elif t in ("int2", "uint2"):
            raw = raw[:4]
        elif t.startswith("float6"):
            raw = raw[:64]
        if t in ("int4", "int2"):
            bits = 4 if t == "int4" else 2
            return np.where(raw >= 1 << (bits - 1), raw.astype(np.int64) - (1 << bits), raw).astype(dt)
        if t in ("uint4", "uint2"):
            return raw.astype(dt)
        return raw.view(dt)
    if t in INT_BITS:
        return int_edges(t)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f = float_edges()
        return f if t == "float64" else f.astype(np.float32).astype(dt)


def cast_model(src: str, dsts: list[str], opset: int, x: np.ndarray, attrs=None, like=False) -> onnx.ModelProto:
    nodes, outs, inits = [], [], []
    for i, d in enumerate(dsts):
        if like:
            inits.append(numpy_helper.from_array(np.zeros((1,), np_dtype(d)), f"T{i}"))
            nodes.append(helper.make_node("CastLike", ["X", f"T{i}"], [f"Y{i}"], **(attrs or {})))
        else:
            nodes.append(helper.make_node("Cast", ["X"], [f"Y{i}"], to=code(d), **(attrs or {})))
        outs.append(helper.make_tensor_value_info(f"Y{i}", code(d), list(x.shape)))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", code(src), list(x.shape))], outs,
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def raw_bits(a) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.reshape(-1).view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def oracle(src: str, d: str, x: np.ndarray, opset: int, attrs=None, like=False) -> tuple[np.ndarray, bool]:
    """onnx.reference's output for one node, or (when it cannot cast) the composed cast; the flag
    says which."""
    from onnx.reference import ReferenceEvaluator

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            return np.asarray(ReferenceEvaluator(cast_model(src, [d], opset, x, attrs, like)).run(None, {"X": x})[0]), True
        except Exception:  # noqa: BLE001 - ml_dtypes lacks the cast: NO_REFERENCE names these pairs
            mid = x.astype(np.int64) if src in INT_BITS or src == "bool" else x.astype(np.float32)
            if d in FLOAT8[:4] and (attrs or {}).get("saturate", 1):
                return numpy_helper.saturate_cast(mid, np_dtype(d)), False
            return mid.astype(np_dtype(d)), False


def run_gpu(dev, model, x, **kw):
    from onnx_quant.backend_wgpu.session import Session

    with Session(model, allow_host_fallback=False, device=dev, **kw) as s:
        return s.run(None, {"X": x})


def check_pairs(dev, src, dsts, *, opset=28, attrs=None, like=False, x=None, **kw):
    x = inputs_for(src) if x is None else x
    got = run_gpu(dev, cast_model(src, dsts, opset, x, attrs, like), x, **kw)
    no_ref, wrong = set(), []
    for d, g in zip(dsts, got):
        expected, is_ref = oracle(src, d, x, opset, attrs, like)
        if not is_ref:
            no_ref.add((src, d))
        assert g.dtype == np_dtype(d), (src, d, g.dtype)
        gb, eb = raw_bits(g), raw_bits(expected.astype(np_dtype(d)))
        bad = np.nonzero(gb != eb)[0]
        if len(bad):
            wrong.append(f"{'CastLike' if like else 'Cast'}-{opset} {attrs or {}} {src} -> {d}: {len(bad)} differ, "
                         f"e.g. x={x.reshape(-1)[bad[:4]]} got {[hex(int(v)) for v in gb[bad[:4]]]} "
                         f"expected {[hex(int(v)) for v in eb[bad[:4]]]}")
    assert not wrong, "\n".join(wrong)
    return no_ref


# ----------------------------------------------------------------------------- specs

def test_specs_take_exactly_the_schema_types_and_attributes():
    import onnx.defs

    from onnx_quant.backend_wgpu.spec import load_specs

    reg = load_specs()
    rename = {"float": "float32", "double": "float64"}
    for op, first in (("Cast", 6), ("CastLike", 15)):
        for version in range(first, onnx.defs.onnx_opset_version() + 1):
            schema = onnx.defs.get_schema(op, version)
            spec = reg.find("", op, version)
            assert spec is not None, (op, version)
            for tc in schema.type_constraints:
                allowed = {rename.get(s[7:-1], s[7:-1]) for s in tc.allowed_type_strs} - {"string"}
                assert set(spec.type_constraints[tc.type_param_str]) == allowed, (op, version, tc.type_param_str)
            # an attribute of a later version is fixed at the value it was introduced with (saturate 1
            # before Cast-19, round_mode "up" before 24): a node of this version cannot set it
            assert {a for a, d in spec.attributes.items() if not d.fixed} == set(schema.attributes), (op, version)


# ----------------------------------------------------------------------------- every pair

@pytest.mark.parametrize("src", ALL)
def test_every_pair_matches_onnx_reference(best, src):
    no_ref = check_pairs(best, src, ALL)
    assert no_ref == {p for p, why in NO_REFERENCE.items() if p[0] == src and why == "always"}


def random_bits(src: str, seed: int) -> np.ndarray:
    """Uniformly random bit patterns, values of every binade, and NaNs with every payload shape."""
    r = np.random.default_rng(seed)
    bits = 8 * np_dtype(src).itemsize
    words = r.integers(0, 2**63 - 1, 5000, dtype=np.int64).astype(np.uint64) * np.uint64(2) + \
        r.integers(0, 2, 5000).astype(np.uint64)
    if bits == 32:
        words = (words & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    x = words.view(np_dtype(src))
    if src not in ("float32", "float64"):
        return x
    exp_bits, frac_bits, utype = (11, 52, np.uint64) if bits == 64 else (8, 23, np.uint32)
    inf = utype(((1 << exp_bits) - 1) << frac_bits)
    payload = r.integers(1, 2**frac_bits, 2000, dtype=np.int64).astype(utype) >> \
        r.integers(0, frac_bits, 2000).astype(utype)
    nans = (inf | np.maximum(payload, utype(1))).view(np_dtype(src))
    binades = (r.standard_normal(5000) * 2.0 ** r.integers(-160, 140, 5000)).astype(np_dtype(src))
    return np.concatenate([x, nans, -nans, binades])


@pytest.mark.parametrize("src", ["float32", "float64", "int64", "uint64", "int32", "uint32"])
def test_random_bit_patterns_match_onnx_reference(best, src):
    with np.errstate(all="ignore"):
        check_pairs(best, src, ALL, x=random_bits(src, 5))


@pytest.mark.parametrize("src", ["float32", "float16", "bfloat16", "float64", "int64", "uint32", "float8e5m2",
                                 "float8e4m3fn", "float8e8m0"])
def test_saturate_and_round_mode(best, src):
    no_ref = set()
    for attrs in ({"saturate": 0}, {"saturate": 0, "round_mode": "down"}, {"round_mode": "down"},
                  {"round_mode": "nearest"}, {"saturate": 0, "round_mode": "nearest"}):
        no_ref |= check_pairs(best, src, FLOAT8, attrs=attrs)
    assert no_ref == {p for p in NO_REFERENCE if p[0] == src and p[1] in FLOAT8}


@pytest.mark.parametrize("src", ["float32", "float64", "int64", "float8e5m2", "int4", "bool"])
def test_cast_like_matches_onnx_reference(best, src):
    import onnx.defs

    rename = {"float": "float32", "double": "float64"}
    for opset in (15, 19, 25):
        allowed = {rename.get(s[7:-1], s[7:-1]) for tc in onnx.defs.get_schema("CastLike", opset).type_constraints
                   for s in tc.allowed_type_strs}
        if src in allowed:
            check_pairs(best, src, [d for d in ALL if d in allowed], opset=opset, like=True)
    check_pairs(best, src, FLOAT8, opset=25, like=True, attrs={"saturate": 0})


def test_variants_agree(best):
    x = np.concatenate([inputs_for("float64")] * 8)
    forced = run_gpu(best, cast_model("float64", ["float32", "int64", "float8e4m3fn", "int4"], 25, x), x,
                     tunables={"COARSE_MIN_WORDS": 0}, variants={"Cast": "words_per_invocation"})
    default = run_gpu(best, cast_model("float64", ["float32", "int64", "float8e4m3fn", "int4"], 25, x), x)
    for f, d in zip(forced, default):
        assert np.array_equal(raw_bits(f), raw_bits(d))


def test_float_to_uint32_follows_numpy_vector_loops(best):
    """ONNX leaves out-of-range float -> int undefined. numpy's float32 / float64 -> uint32 loop gives
    2^31 for NaN, -inf and values <= -2^31 - 1 and 0 from 2^32 up when the array has 8+ elements
    (onnxruntime too), but its scalar remainder loop gives (uint32)(int64)x (0 for NaN): the kernel
    takes the vector loop's answer, also for a 1-element tensor."""
    x = np.array([np.nan], np.float32)
    (got,) = run_gpu(best, cast_model("float32", ["uint32"], 25, x), x)
    assert int(got[0]) == 0x80000000
    with np.errstate(invalid="ignore"):
        assert int(np.concatenate([x] * 16).astype(np.uint32)[0]) == 0x80000000  # numpy, 16 elements


# ----------------------------------------------------------------------------- ONNX's node cases

#: node cases of Cast / CastLike that stay off the GPU: none
DECLINED: dict[str, str] = {}


def test_onnx_node_cases_pass_on_the_gpu(best):
    from onnx_quant.backend_wgpu.conformance import case_op_type, run_case
    from onnx_quant.node_cases import all_node_cases

    cases = [c for c in all_node_cases() if c.name.startswith(("test_cast_", "test_castlike_"))]
    assert len(cases) >= 172
    for case in cases:
        row = run_case(case, device=best, host_fallback=False)
        assert case_op_type(case).split(" ")[0] in ("Cast", "CastLike")
        if case.name in DECLINED:
            assert not row.passed and DECLINED[case.name] in (row.error or ""), (case.name, row.error)
        else:
            assert row.passed, (case.name, row.error)


def test_cast_like_round_mode_is_cast_round_mode(best):
    """CastLike-24/25 declare round_mode with Cast's meaning, but ONNX's function body for CastLike
    does not forward it to its Cast and onnx.reference cannot run a CastLike that sets it: the
    kernel follows the attribute's definition, i.e. Cast's (docs/kernels.md, "Cast")."""
    from onnx.reference import ReferenceEvaluator

    x = inputs_for("float32")
    for mode in ("down", "nearest", "up"):
        for sat in (0, 1):
            attrs = {"round_mode": mode, "saturate": sat}
            (like,) = run_gpu(best, cast_model("float32", ["float8e8m0"], 25, x, attrs, like=True), x)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                (ref,) = ReferenceEvaluator(cast_model("float32", ["float8e8m0"], 25, x, attrs)).run(None, {"X": x})
            assert np.array_equal(raw_bits(like), raw_bits(ref)), attrs
    assert not np.array_equal(raw_bits(numpy_helper.to_float8e8m0(x, True, "down")),
                              raw_bits(numpy_helper.to_float8e8m0(x, True, "up")))  # the modes differ here


def test_opengl_agrees(best):
    """The 64-bit integer paths (float64, int64, uint64) on OpenGL (another shader compiler) give the
    same bits as on the best adapter."""
    from support.gpu import gpu_device

    gl = gpu_device("opengl")
    for src, dsts in (("float64", ["float32", "float16", "bfloat16", "int64", "uint64", "uint32", "int8", "float8e5m2"]),
                      ("int64", ["float32", "float64", "float16", "uint64", "int4"]),
                      ("float32", ["float64", "uint64", "float8e8m0", "float4e2m1"])):
        x = inputs_for(src)
        model = cast_model(src, dsts, 25, x)
        for g, b in zip(run_gpu(gl, model, x), run_gpu(best, model, x)):
            assert np.array_equal(raw_bits(g), raw_bits(b)), src


def test_string_casts_decline_to_the_host(best):
    """string has no device layout: the type constraint declines the node (KernelRejected), which
    runs on the host with a fallback and is refused without one."""
    from onnx import TensorProto

    from onnx_quant.backend_wgpu.session import Session
    from onnx_quant.errors import ExecutionError

    x = np.array([1.5, -2.0], np.float32)
    graph = helper.make_graph([helper.make_node("Cast", ["X"], ["Y"], to=TensorProto.STRING)], "g",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("Y", TensorProto.STRING, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    with pytest.raises(ExecutionError, match="string"):
        Session(model, allow_host_fallback=False, device=best)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Session(model, device=best) as s:
            (y,) = s.run(None, {"X": x})
    assert [str(v) for v in y.tolist()] == [str(v) for v in x.astype(np.str_).tolist()]
