"""Test-session settings. ``make test`` runs the files on pytest-xdist workers (``-n``): each worker's stages
then use their share of the cores instead of all of them, so two workers do not oversubscribe two cores."""

from __future__ import annotations

import os


def pytest_configure(config) -> None:  # noqa: ANN001 (pytest's Config)
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers and "XMC_THREADS" not in os.environ:
        share = str(max(1, (os.cpu_count() or 1) // int(workers)))
        os.environ["XMC_THREADS"] = share          # torch threads of every stage the tests start
        os.environ.setdefault("OMP_NUM_THREADS", share)   # faiss / BLAS


# the files that take minutes (Prefect, end-to-end pipelines, the scale path), slowest first: started first, the
# short files fill the other worker around them instead of one long file starting last and running alone. This
# order holds only with xdist's --no-loadscope-reorder (the Makefile's), which otherwise queues the files with
# the most tests first, so these few-test files last
SLOW_FILES = ["test_orchestration.py", "test_dense_e2e.py", "test_methods_e2e.py", "test_distributed.py",
              "test_scale.py", "test_pipeline_e2e.py", "test_own_dataset_e2e.py", "test_registry.py",
              "test_kill_recovery.py", "test_cli_serve.py", "test_serving_imports.py"]


def pytest_collection_modifyitems(session, config, items) -> None:  # noqa: ANN001 (pytest's objects)
    rank = {name: i for i, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FILES)))   # stable: a file's own order stays
