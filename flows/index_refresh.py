"""Index-refresh flow: re-embed every label with the latest model and rebuild its ANN index (its prediction stage)."""

from __future__ import annotations


from prefect import flow

from flows.dvc_tasks import run_dvc_stage, stage_order
from flows.guard import confine_name, confine_repo, repo_lock
from flows.pipeline import publish_artifacts, stage_timeout
from xmc.config import load_params
from xmc.io import stage_from_address


def prediction_stage(repo, model: str) -> str:
    """The DVC stage that builds ``model``'s index: ``predict@<run>``, ``predict_unidec@<run>`` or a baseline's."""
    params = load_params(repo / "params.yaml")
    if model in params["unidec_predictions"]:
        return f"predict_unidec@{model}"
    if model in ("label_prior", "tfidf_zeroshot", "tfidf_knn"):
        return model
    return f"predict@{model}"


@flow(name="xmc-index-refresh", log_prints=True)
def xmc_index_refresh(repo_dir: str = ".", model: str = "dexml", force: bool = True) -> dict:
    """``force`` rebuilds even when DVC sees no change (e.g. after an out-of-band model update)."""
    repo = confine_repo(repo_dir)
    model = confine_name(model, "model")
    orch = load_params(repo / "params.yaml")["orchestration"]
    out = {}
    with repo_lock(repo, orch["concurrency_limit_name"], orch["concurrency_wait_seconds"]):
        target = prediction_stage(repo, model)
        for stage in stage_order(repo, [target]):
            is_index = stage_from_address(stage) == target
            out[stage] = run_dvc_stage(stage, str(repo), force and is_index, timeout_seconds=stage_timeout(orch, stage))
        name = f"evaluate@{model}"
        evaluate = next(s for s in stage_order(repo, [name]) if stage_from_address(s) == name)
        for stage in (evaluate, "report"):
            out[stage_from_address(stage)] = run_dvc_stage(stage, str(repo),
                                                           timeout_seconds=stage_timeout(orch, stage))
        publish_artifacts(repo)
    return out
