"""Index-refresh flow: re-embed every label of a package with its latest model and rebuild its label index.

The index of a run's package is built by its ``package@<run>`` stage (the predictor over the label vectors,
then the validation and test predictions and their metrics); a hybrid's package holds its base run's predictor,
so refreshing ``<hybrid>`` rebuilds ``package@<base>`` and then ``fuse@<hybrid>``. Those stages are forced
(``force``: even when DVC sees no change, e.g. after an out-of-band model update); what depends on them (the
hybrids of the run, the report) is then reproduced, and DVC's cache decides what reruns.
"""

from __future__ import annotations

from prefect import flow, get_run_logger

from flows.dvc_tasks import downstream_order, package_stage, run_dvc_stage, stage_order
from flows.guard import ParameterRefused, confine_name, confine_repo, repo_lock
from flows.pipeline import publish_artifacts, stage_timeout
from xmc.config import load_params


def index_stages(params: dict, model: str) -> list[str]:
    """The stages that (re)build ``model``'s label index, in order."""
    try:
        stage = package_stage(params, model)
    except ValueError as e:
        raise ParameterRefused(f"model {e}") from None
    if stage.startswith("fuse@"):
        return [f"package@{params['hybrids'][model]['base']}", stage]
    return [stage]


@flow(name="xmc-index-refresh", log_prints=True)
def xmc_index_refresh(repo_dir: str = ".", model: str = "dexml_bow", force: bool = True) -> dict:
    logger = get_run_logger()
    repo = confine_repo(repo_dir)
    model = confine_name(model, "model")
    params = load_params(repo / "params.yaml")
    orch = params["orchestration"]
    targets = index_stages(params, model)
    out: dict[str, str] = {}
    with repo_lock(repo, orch["concurrency_limit_name"], orch["concurrency_wait_seconds"]):
        order = stage_order(repo, targets)
        after = downstream_order(repo, targets)
        logger.info("refreshing %s: %s (forced: %s)", model, ", ".join(order + after), ", ".join(targets) if force else "none")
        for stage in order + after:
            out[stage] = run_dvc_stage(stage, str(repo), force and stage in targets,
                                       timeout_seconds=stage_timeout(orch, stage))
        publish_artifacts(repo)
    return out
