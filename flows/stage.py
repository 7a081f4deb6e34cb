"""One DVC stage as a flow: the unit a GPU worker runs (deployment ``xmc-stage/gpu``)."""

from __future__ import annotations

from prefect import flow

from flows.dvc_tasks import run_dvc_stage


@flow(name="xmc-stage", log_prints=True)
def xmc_stage(stage: str, repo_dir: str = ".", force: bool = False) -> str:
    return run_dvc_stage(stage, repo_dir, force)
