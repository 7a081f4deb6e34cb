"""Index-refresh flow: re-embed every label with the latest model and rebuild its ANN index."""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from flows.dvc_tasks import run_dvc_stage, stage_order
from flows.pipeline import publish_artifacts


@flow(name="xmc-index-refresh", log_prints=True)
def xmc_index_refresh(repo_dir: str = ".", model: str = "dexml", force: bool = True) -> dict:
    """``force`` rebuilds even when DVC sees no change (e.g. after an out-of-band model update)."""
    repo = Path(repo_dir).resolve()
    out = {}
    for stage in stage_order(repo, [f"index@{model}"]):
        is_index = stage == f"index@{model}"
        out[stage] = run_dvc_stage(stage, str(repo), force and is_index)
    for stage in (f"evaluate@{model}", "report"):
        out[stage] = run_dvc_stage(stage, str(repo))
    publish_artifacts(repo)
    return out
