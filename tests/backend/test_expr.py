"""The spec expression language: evaluation, integer semantics, errors, static checks."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from onnx_quant.backend_wgpu.device_info import KNOWN_FEATURES, WEBGPU_DEFAULT_LIMITS
from onnx_quant.backend_wgpu.expr import Env, Expr, Scope, check, evaluate, free_names, parse
from onnx_quant.errors import ExpressionError, QuantError

ENV = Env(
    shapes={"x": (2, 3, 4), "s": (), "e": (0, 5)},
    tunables={"WG": 256, "EPT": 4},
    limits=dict(WEBGPU_DEFAULT_LIMITS, maxComputeInvocationsPerWorkgroup=128),
    features=frozenset({"subgroup"}),
    names={"n": 10, "z": 0, "neg": -7, "flag": True, "ty": "vec4<f32>", "shape": (5, 6), "half": 0.5},
)

SCOPE = Scope(io=frozenset({"x", "s", "e"}), tunables=frozenset({"WG", "EPT"}),
              names=frozenset({"n", "z", "neg", "flag", "ty", "shape", "half"}))


@pytest.mark.parametrize("text, expected", [
    ("1 + 2 * 3", 7),
    ("numel(shapes.x)", 24),
    ("numel(shapes.s)", 1),
    ("numel(shapes.e)", 0),
    ("ranks.x", 3),
    ("ranks.s", 0),
    ("shapes.x", (2, 3, 4)),
    ("shapes.x[0]", 2),
    ("shapes.x[-1]", 4),
    ("tunables.WG * tunables.EPT", 1024),
    ("device.limits.maxComputeInvocationsPerWorkgroup", 128),
    ("device.limits.maxComputeWorkgroupsPerDimension", 65535),
    ('device.features.has("subgroup")', True),
    ('device.features.has("shader-f16")', False),
    ("ceilDiv(n, 3)", 4),
    ("ceilDiv(9, 3)", 3),
    ("ceilDiv(0, 3)", 0),
    ("ceilDiv(neg, 2)", -3),
    ("min(n, 3, 7)", 3),
    ("max(n, 3, 7)", 10),
    ("min(shapes.x)", 2),
    ("max(shape)", 6),
    ("min(half, 1)", 0.5),
    ("n // 3", 3),
    ("neg // 2", -4),          # floor division, like Python
    ("neg % 3", 2),            # the remainder takes the divisor's sign
    ("n % -3", -2),
    ("-n", -10),
    ("+n", 10),
    ("1 < n <= 10", True),
    ("1 < n < 10", False),
    ("n == 10 != 11", True),
    ("true and not false", True),
    ("True or False", True),
    ("flag and n > 3", True),
    ("4 if flag else 1", 4),
    ("4 if not flag else 1", 1),
    ("[n, 2]", (10, 2)),
    ("[]", ()),
    ("[shapes.x[0], n][1]", 10),
    ('"vec4<f32>"', "vec4<f32>"),
    ("'f32'", "f32"),
    ('ty == "vec4<f32>"', True),
    ('"vec" + "4"', "vec4"),
    ("shape == [5, 6]", True),
    ("shapes.x == [2, 3, 4]", True),
    ("1.5 * 2", 3.0),
    ("  n  ", 10),
    ("(n)", 10),
])
def test_evaluates(text, expected):
    got = evaluate(text, ENV)
    assert got == expected
    assert type(got) is type(expected)


def test_integers_are_exact():
    big = "4294967296 * 4294967296 * 4294967296"
    assert evaluate(big, ENV) == 2 ** 96
    assert evaluate(f"{big} + 1 - {big}", ENV) == 1
    assert evaluate("ceilDiv(18446744073709551617, 2)", ENV) == 2 ** 63 + 1


def test_short_circuit_and_branches_guard_errors():
    assert evaluate("z > 0 and n % z == 0", ENV) is False
    assert evaluate("z == 0 or n // z > 1", ENV) is True
    assert evaluate("0 if z == 0 else n // z", ENV) == 0
    assert evaluate("ranks.s >= 1 and shapes.s[0] > 1", ENV) is False
    with pytest.raises(ExpressionError, match="division by zero"):
        evaluate("z == 0 and n // z > 1", ENV)


@pytest.mark.parametrize("text, reason", [
    # unknown names
    ("m + 1", "unknown name 'm'"),
    ("nn", "did you mean 'n'"),
    ("shapes.w", "unknown input/output 'w'"),
    ("ranks.w", "unknown input/output 'w'"),
    ("tunables.WGS", "unknown tunable 'WGS'"),
    ("device.limits.maxFoo", "unknown device limit 'maxFoo'"),
    ('device.features.has("subgroups")', "did you mean 'subgroup'"),
    ("shapes.__class__", "unknown input/output '__class__'"),
    # unsupported syntax
    ("n / 2", "'/' is not supported: use '//'"),
    ("n ** 2", "'\\*\\*' is not supported"),
    ("lambda: 1", "lambda"),
    ("(1, 2)", "write a list as \\[a, b\\]"),
    ("shapes.x[0:2]", "slices"),
    ("n in shape", "'in' is not supported"),
    ("n is 1", "'is' is not supported"),
    ("n & 1", "'&'"),
    ("n << 1", "'<<'"),
    ("~n", "'~'"),
    ("f'{n}'", "f-strings"),
    ("[i for i in shape]", "comprehensions"),
    ("{1: 2}", "dict"),
    ("None", "unsupported constant"),
    ("x.y", "attribute access is only allowed"),
    ("device.limits", "attribute access is only allowed"),
    ("device.features.has", "must be called"),
    ("shapes", "'shapes' must be followed by"),
    ("numel", "must be called"),
    ("__import__('os')", "unknown function '__import__'"),
    ("().__class__", "attribute access is only allowed"),
    ("n.real", "attribute access"),
    ("max(n, key=1)", "keyword arguments"),
    ("max(*shape)", "'\\*' arguments"),
    ('device.features.has(ty)', "string literal"),
    ("n if", "syntax error"),
    ("", "empty expression"),
    ("1\x00", "cannot parse|syntax error"),
    ("n := 1", "syntax error|':='"),
    # arity
    ("numel()", "numel\\(\\) takes 1 to 3 arguments, got 0"),
    ("ceilDiv(1, 2, 3)", "takes 2 arguments, got 3"),
    ("ceilDiv(1)", "ceilDiv\\(\\) takes 2 arguments, got 1"),
    ("min()", "at least 1"),
    ('device.features.has("a", "b")', "takes 1 argument"),
    # division by zero
    ("n // z", "division by zero"),
    ("n % z", "division by zero"),
    ("ceilDiv(n, z)", "division by zero"),
    ("half // 0.0", "division by zero"),
    # types
    ('"a" < 1', "cannot compare str < int"),
    ('ty == 1', "cannot compare str == int"),
    ("flag == 1", "cannot compare bool == int"),
    ("flag < true", "cannot compare bool < bool"),
    ('"a" + 1', "'\\+' needs two numbers"),
    ("flag + 1", "needs two numbers, found bool and int"),
    ("shape * 2", "needs two numbers"),
    ("not n", "'not' needs a bool"),
    ("n and true", "'and' needs bools, found int"),
    ("false or 0", "'or' needs bools"),
    ("1 if n else 2", "condition of 'if' must be a bool"),
    ("-ty", "needs a number"),
    ("numel(3)", "numel\\(\\) needs a list of ints"),
    ("numel([1.5])", "needs a list of ints"),
    ("ceilDiv(half, 2)", "ceilDiv\\(\\) needs two ints"),
    ("min(ty, 1)", "min\\(\\) needs numbers"),
    ("max(n)", "with one argument needs a list"),
    ("min([])", "empty list"),
    ("n[0]", "only lists can be indexed"),
    ("shapes.x[flag]", "index must be an int"),
    ("shapes.x[3]", "index 3 out of range"),
    ("shapes.s[-1]", "out of range"),
])
def test_errors(text, reason):
    with pytest.raises(ExpressionError, match=reason) as info:
        evaluate(text, ENV)
    assert isinstance(info.value, QuantError)
    if text:
        assert repr(text)[1:-1][:20] in str(info.value)  # the message quotes the expression


def test_overlong_and_deep_expressions_are_expression_errors():
    with pytest.raises(ExpressionError, match="longer than"):
        parse("1+" * 3000 + "1")
    for text in ("-" * 3000 + "1", "(" * 500 + "1" + ")" * 500, "[" * 500 + "]" * 500):
        with pytest.raises(ExpressionError):
            evaluate(text, ENV)


def test_non_string_expression_rejected():
    with pytest.raises(ExpressionError, match="must be a string"):
        Expr(3)  # type: ignore[arg-type]


def test_evaluation_uses_env_not_python():
    # Python builtins and globals are unreachable: bare names only resolve to derived values.
    for name in ("len", "open", "print", "os", "ENV", "__builtins__"):
        with pytest.raises(ExpressionError, match="unknown (name|function)"):
            evaluate(f"{name}(1)" if name != "ENV" else name, ENV)


def test_env_child_scope_wins():
    inner = ENV.with_names({"n": 99, "k": 1})
    assert evaluate("n + k", inner) == 100
    assert evaluate("n", ENV) == 10


# ---------------------------------------------------------------- static checks

@pytest.mark.parametrize("text", [
    "numel(shapes.x) + n",
    "tunables.WG <= device.limits.maxComputeInvocationsPerWorkgroup",
    'device.features.has("subgroup") and device.features.has("shader-f16")',
    "4 if flag else tunables.EPT",
    "[ceilDiv(numel(shapes.e), 4)]",
    "ranks.s == 0 and true",
])
def test_check_accepts_known_names(text):
    assert check(text, SCOPE).text == text


@pytest.mark.parametrize("text, reason", [
    ("m + 1", "unknown name 'm'"),
    ("nn", "did you mean 'n'"),
    ("shapes.w", "unknown input/output 'w'"),
    ("ranks.xx", "did you mean 'x'"),
    ("tunables.wg", "did you mean 'WG'"),
    ("device.limits.maxComputeInvocationPerWorkgroup", "did you mean 'maxComputeInvocationsPerWorkgroup'"),
    ('device.features.has("subgroups")', "unknown device feature 'subgroups' \\(did you mean 'subgroup'\\?\\)"),
    ('device.features.has("f16")', "unknown device feature"),
    ("n / 2", "'/' is not supported"),
    ("foo(1)", "unknown function"),
    ("ceilDiv(1, 2, 3)", "takes 2 arguments"),
    ("1 if m else 2", "unknown name 'm'"),   # names in untaken branches are checked too
    ("false and m", "unknown name 'm'"),
])
def test_check_rejects_without_evaluating(text, reason):
    with pytest.raises(ExpressionError, match=reason):
        check(text, SCOPE)


def test_known_scope_defaults():
    s = Scope()
    assert s.limits == frozenset(WEBGPU_DEFAULT_LIMITS)
    assert s.features == KNOWN_FEATURES
    assert "subgroups" not in KNOWN_FEATURES


def test_free_names():
    assert free_names("a + b * numel(shapes.x) if c else true") == {"a", "b", "c"}
    assert free_names("tunables.A + device.limits.maxBufferSize + ranks.y") == set()
    assert free_names('device.features.has("subgroup") or false or True') == set()
    assert free_names("min(a, max(b, a))") == {"a", "b"}


# ---------------------------------------------------------------- properties

_NAMES = {"n": 10, "z": 0, "neg": -7}


def _leaf():
    ints = st.integers(-10**6, 10**6).map(lambda i: (f"({i})" if i < 0 else str(i), i))
    names = st.sampled_from(sorted(_NAMES.items()))
    return ints | names


def _combine(children):
    def binop(pair):
        (ta, va), op, (tb, vb) = pair
        if va is None or vb is None:
            return (f"({ta} {op} {tb})", None)
        if op in ("//", "%") and vb == 0:
            return (f"({ta} {op} {tb})", None)
        v = {"+": va + vb, "-": va - vb, "*": va * vb}.get(op)
        if op == "//":
            v = va // vb
        elif op == "%":
            v = va % vb
        return (f"({ta} {op} {tb})", v)

    def call(pair):
        fn, (ta, va), (tb, vb) = pair
        text = f"{fn}({ta}, {tb})"
        if va is None or vb is None:
            return (text, None)
        if fn == "ceilDiv":
            return (text, None if vb == 0 else -((-va) // vb))
        return (text, min(va, vb) if fn == "min" else max(va, vb))

    def cond(triple):
        (ta, va), (tb, vb), (tc, vc) = triple
        text = f"({ta} if {tc} < {tb} else {tb})"
        if vc is None or vb is None:
            return (text, None)
        if vc < vb:
            return (text, va)
        return (text, vb)

    return (
        st.tuples(children, st.sampled_from(["+", "-", "*", "//", "%"]), children).map(binop)
        | st.tuples(st.sampled_from(["min", "max", "ceilDiv"]), children, children).map(call)
        | st.tuples(children, children, children).map(cond)
        | children.map(lambda c: (f"-{c[0]}", None if c[1] is None else -c[1]))
    )


@given(st.recursive(_leaf(), _combine, max_leaves=12))
def test_integer_arithmetic_matches_python_semantics(case):
    text, expected = case
    env = Env(names=_NAMES)
    if expected is None:
        with pytest.raises(ExpressionError, match="division by zero"):
            evaluate(text, env)
    else:
        got = evaluate(text, env)
        assert got == expected and type(got) is int


@given(st.text(max_size=60))
def test_arbitrary_text_only_raises_expression_error(text):
    try:
        e = Expr(text)
    except ExpressionError:
        return
    try:
        e.check(SCOPE)
    except ExpressionError:
        pass
    try:
        evaluate(e, ENV)
    except ExpressionError:
        pass


@given(st.lists(st.sampled_from(
    ["n", "1", "(", ")", "+", "//", "%", " if ", " else ", " and ", " or ", "not ", "<", "==", "[", "]", ",",
     "shapes.x", "[0]", "numel(", "ceilDiv(", "min(", "true", "ty", "'s'", "-", "flag", "half"]), max_size=14))
def test_token_soup_only_raises_expression_error(tokens):
    text = "".join(tokens)
    try:
        evaluate(text, ENV)
    except ExpressionError:
        pass


# ---------------------------------------------------------------- spec format v2: attrs, dtypes, present, bits

ENV2 = Env(
    shapes={"x": (2, 3), "zp": ()},
    attrs={"axis": 1, "block_size": 0, "mode": "DCR", "perm": (1, 0), "alpha": 0.5},
    dtypes={"x": "float32", "zp": "int4"},
    present={"x": True, "zp": False},
)
SCOPE2 = Scope(io=frozenset({"x", "zp"}), attributes=frozenset({"axis", "block_size", "mode", "perm", "alpha"}))


@pytest.mark.parametrize("text, expected", [
    ("attrs.axis", 1),
    ("attrs.axis if attrs.axis >= 0 else attrs.axis + ranks.x", 1),
    ("attrs.block_size > 0", False),
    ('attrs.mode == "DCR"', True),
    ("attrs.perm[0]", 1),
    ("attrs.alpha * 2", 1.0),
    ("dtypes.x", "float32"),
    ('dtypes.zp == "int4"', True),
    ("bits(dtypes.zp)", 4),
    ('bits("float8e4m3fn")', 8),
    ('bits("float6e2m3")', 6),
    ('bits("float32")', 32),
    ("32 // bits(dtypes.zp)", 8),
    ("present.x", True),
    ("present.zp", False),
    ("not present.zp and ranks.zp == 0", True),
])
def test_v2_names(text, expected):
    check(text, SCOPE2)
    assert evaluate(text, ENV2) == expected


def test_present_defaults_to_true_for_an_io_with_a_shape():
    assert evaluate("present.x", Env(shapes={"x": (1,)})) is True


@pytest.mark.parametrize("text, reason", [
    ("attrs.axes", "unknown attribute 'axes' in attrs.axes (did you mean 'axis'?)"),
    ("dtypes.y", "unknown input/output 'y' in dtypes.y"),
    ("present.zpp", "unknown input/output 'zpp' in present.zpp (did you mean 'zp'?)"),
])
def test_v2_static_check_rejects_unknown(text, reason):
    with pytest.raises(ExpressionError, match=None) as info:
        check(text, SCOPE2)
    assert reason in str(info.value)


def test_attrs_not_declared_is_a_hint_to_declare():
    with pytest.raises(ExpressionError, match="declare it in the top-level 'attributes'"):
        check("attrs.axis", Scope())


@pytest.mark.parametrize("text, reason", [
    ("bits(1)", "bits() needs an element type name"),
    ('bits("float8e4m3")', "unknown element type 'float8e4m3'"),
    ("attrs", "'attrs' must be followed by '.<name>'"),
    ("dtypes.x.y", "attribute access is only allowed"),
    ("bits()", "bits() takes 1 argument"),
])
def test_v2_errors(text, reason):
    with pytest.raises(ExpressionError) as info:
        evaluate(text, ENV2)
    assert reason in str(info.value)


def test_v2_namespaces_are_reserved():
    assert free_names("attrs.a + bits(dtypes.x) + present.y") == set()


@pytest.mark.parametrize("text, expected", [
    ("numel(shapes.x, 1)", 12),
    ("numel(shapes.x, 0, 2)", 6),
    ("numel(shapes.x, 3)", 1),
    ("numel(shapes.x, -1)", 4),
    ("slice(shapes.x, 1)", (3, 4)),
    ("slice(shapes.x, 0, 1)", (2,)),
    ("slice(shapes.x, 5)", ()),
    ("slice(shapes.x, 0, 2) == [2, 3]", True),
])
def test_numel_and_slice_ranges(text, expected):
    assert evaluate(text, ENV) == expected


@pytest.mark.parametrize("text, reason", [
    ("numel(shapes.x, 0.5)", "bounds must be ints"),
    ("slice(1, 0)", "slice() needs a list"),
    ("slice(shapes.x)", "slice() takes 2 to 3 arguments"),
    ("numel(shapes.x, 1, 2, 3)", "numel() takes 1 to 3 arguments, got 4"),
    ("numel(shape, shape)", "numel() bounds must be ints, found list"),
])
def test_numel_and_slice_errors(text, reason):
    with pytest.raises(ExpressionError) as info:
        evaluate(text, ENV)
    assert reason in str(info.value)


def test_list_length_and_nonzero_indices():
    assert evaluate("listLength([4, 0, 7])", ENV) == 3 and evaluate("numel([4, 0, 7])", ENV) == 0
    assert evaluate("nonzeroIndices([0, 3, 0, 1])", ENV) == (1, 3) and evaluate("nonzeroIndices([])", ENV) == ()
    with pytest.raises(ExpressionError, match="needs a list"):
        evaluate("listLength(3)", ENV)
