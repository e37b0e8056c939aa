"""What the test modules share, importable as ``support`` (pytest puts tests/ on sys.path:
tests/conftest.py's folder has no ``__init__.py``).

- :mod:`support.models`: pieces of test models;
- :mod:`support.oracles`: onnxruntime (exact on any CPU), the bit-for-bit and tolerance assertions;
- :mod:`support.gpu`: the adapter policy (fail in CI, skip elsewhere), devices, node-case checks.

Test modules import from here, never from conftest; fixtures live in tests/conftest.py.
"""
