"""The fuzzer's CI profile: a fixed, derandomized set of random graphs (short chains and DAGs,
every generator drawn) run on the GPU against the oracle; any finding fails the test with the
shrunk graph. The campaign (``python -m tests.fuzz --minutes N``, docs/testing.md) runs the same
loop for as long as it is given and saves what it finds under tests/fuzz/regressions/."""

from __future__ import annotations

import json

from .campaign import Stats, fuzz_batch
from .graphs import GENERATORS

#: graphs in the CI profile (about a minute on lavapipe, cold pipeline cache included)
CI_GRAPHS = 36


def test_random_graphs_agree_with_the_oracle(best):
    stats = Stats()
    fuzz_batch(best, stats, examples=CI_GRAPHS, seed=0, max_nodes=6, derandomize=True, save=False)
    assert not stats.findings, json.dumps(stats.findings, indent=1)
    # the fixed seed set runs graphs end to end, not only refusals and oracle failures
    assert stats.outcomes["pass"] >= CI_GRAPHS // 2, dict(stats.outcomes)


def test_every_generator_makes_valid_graphs():
    """Each generator alone makes graphs onnx's checker and strict shape inference accept."""
    import onnx
    from hypothesis import HealthCheck, given, settings

    from .graphs import fuzz_graphs

    for name in sorted(GENERATORS):
        @settings(max_examples=3, derandomize=True, database=None, deadline=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=fuzz_graphs(max_nodes=3, generators=(name,)))
        def valid(case):
            onnx.checker.check_model(case.model)
            onnx.shape_inference.infer_shapes(case.model, check_type=True, strict_mode=True)

        valid()
