"""Data-validation flow: ingest + validate only; fails loudly on a critical expectation."""

from __future__ import annotations

import json

from prefect import flow, get_run_logger
from prefect.artifacts import create_link_artifact, create_table_artifact

from flows.dvc_tasks import run_dvc_stage, stage_order
from flows.guard import confine_repo, repo_lock
from flows.pipeline import stage_timeout
from xmc.config import load_params
from xmc.logs import kv
from xmc.workspace import product_workspace


@flow(name="xmc-data-validation", log_prints=True)
def xmc_data_validation(repo_dir: str = ".") -> dict:
    logger = get_run_logger()
    repo = confine_repo(repo_dir)
    orch = load_params(repo / "params.yaml")["orchestration"]
    with repo_lock(repo, orch["concurrency_limit_name"], orch["concurrency_wait_seconds"]):
        for stage in stage_order(repo, ["validate"]):
            run_dvc_stage.with_options(retries=0)(stage, str(repo), timeout_seconds=stage_timeout(orch, stage))
    reports = product_workspace(load_params(repo / "params.yaml"), repo).validation_reports
    summary = json.loads((reports / "summary.json").read_text())
    create_link_artifact(key="xmc-data-validation", link=(reports / "report.html").as_uri(),
                         link_text="Data-validation report")
    create_table_artifact(key="xmc-validation-checks", table=[
        {"table": c["table"], "check": c["description"], "severity": c["severity"], "passed": c["success"]}
        for c in summary["checks"]])
    logger.info("validation: %s", kv(summary["metrics"]))
    return summary["metrics"]
