"""One DVC stage as a flow: the unit a GPU worker runs (deployment ``xmc-stage/gpu``)."""

from __future__ import annotations

from prefect import flow

from flows.dvc_tasks import run_dvc_stage, stage_order
from flows.guard import confine_name, confine_repo, repo_lock
from flows.pipeline import stage_timeout
from xmc.config import load_params


@flow(name="xmc-stage", log_prints=True)
def xmc_stage(stage: str, repo_dir: str = ".", force: bool = False, hold_repo_lock: bool = True,
              timeout_seconds: float | None = None) -> str:
    """``hold_repo_lock=False`` only when dispatched by the pipeline flow, which holds the slot already."""
    repo = confine_repo(repo_dir)
    stage = confine_name(stage, "stage")
    if stage not in stage_order(repo, [stage]):
        raise ValueError(f"unknown DVC stage {stage!r}")
    orch = load_params(repo / "params.yaml")["orchestration"]
    timeout = float(timeout_seconds) if timeout_seconds else stage_timeout(orch, stage)
    if not hold_repo_lock:
        return run_dvc_stage(stage, str(repo), force, timeout_seconds=timeout)
    with repo_lock(repo, orch["concurrency_limit_name"], orch["concurrency_wait_seconds"]):
        return run_dvc_stage(stage, str(repo), force, timeout_seconds=timeout)
