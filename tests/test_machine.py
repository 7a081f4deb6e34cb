"""The machine description that training records and benchmarks carry next to their times."""

from __future__ import annotations

import os

from xmc.machine import cpu_model, describe_machine, vector_isa


def test_describe_machine_names_the_cpu_and_measures_a_rate():
    d = describe_machine()
    assert d["cpu"] == cpu_model() and d["cpu"]
    assert d["cores"] == os.cpu_count() and d["torch_threads"] >= 1
    assert d["vector_isa"] == vector_isa()
    assert d["matmul_GFLOPs"] > 0.1
    assert "matmul_GFLOPs" not in describe_machine(measure=False)

