"""What the test modules share, importable as ``support`` (pytest puts tests/ on sys.path:
tests/conftest.py's folder has no ``__init__.py``).

- :mod:`support.models`: the model builders (``make_model``, ``node_model``) and shared models;
- :mod:`support.arrays`: seeded inputs of any element type;
- :mod:`support.oracles`: onnxruntime (exact on any CPU), onnx.reference, numpy models of
  onnxruntime's kernels, the bit-for-bit and tolerance assertions;
- :mod:`support.run`: a node planned and run on a device (``run_node``), a model through a
  Session (``session_run``, ``session_and_oracle``), every variant forced;
- :mod:`support.gpu`: the adapter policy (fail in CI, skip elsewhere), devices, node-case checks;
- :mod:`support.specs`: kernel spec files written for a test;
- :mod:`support.elementwise_accuracy`: the elementwise table's dense samples and references.

Test modules import from here, never from conftest or from each other; fixtures live in
tests/conftest.py.
"""
