"""Input shapes a model was not made for: the error names the user's node and the rule it
breaks at those shapes (here an FPN Add whose two maps no longer match), never an internal fused
op whose type is unknown or a host fallback that cannot run."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import onnx
import pytest

from onnx_quant import exported_models
from onnx_quant.cli import main
from onnx_quant.errors import ExecutionError

#: DBNet's FPN adds upsampled maps to the stride-16 map: sizes must be multiples of 32; 36 is not
BAD = (1, 3, 36, 36)
#: what the user's QOperator model calls the node (the quantizer renames it); as written elsewhere
USER_NODE = {"qoperator": "add_45_quant", "qdq": "add_45", "float": "add_45"}


@pytest.fixture(scope="module")
def dbnet():
    logging.getLogger().setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {form: exported_models.build("dbnet", form) for form in USER_NODE}


@pytest.mark.parametrize("form", list(USER_NODE))
def test_a_size_the_model_was_not_made_for_names_the_users_node(gpu, capsys, tmp_path, dbnet, form):
    path, x = tmp_path / f"dbnet_{form}.onnx", tmp_path / "x.npy"
    onnx.save(dbnet[form], path)
    np.save(x, np.random.default_rng(0).random(BAD, dtype=np.float32))
    code = main(["run", str(path), "--input", f"x={x}"])
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert f"node '{USER_NODE[form]}'" in err and "do not broadcast" in err and "[1, 3, 36, 36]" in err
    for internal in ("QLinearConcat", "FusedConv", "FusedElementwise", "not known", "onnx.reference cannot"):
        assert internal not in err, err


def test_the_session_raises_the_same(gpu, dbnet):
    from onnx_quant.backend_wgpu.session import Session

    with Session(dbnet["qdq"]) as s, pytest.raises(ExecutionError, match=r"do not fit the model: Add: node 'add_45'"):
        s.run(None, {"x": np.zeros(BAD, np.float32)})
    with Session(dbnet["qdq"]) as s:  # a size it was made for still runs
        (y,) = s.run(None, {"x": np.zeros((1, 3, 32, 32), np.float32)})
        assert y.shape[-2:] == (32, 32)
