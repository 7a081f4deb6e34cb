"""The pipeline flow: every DVC stage as a Prefect task, in DAG order.

The stages are those of the product pipeline (the root ``dvc.yaml``): ingest, validate, tfidf, graph,
maclr_pseudo_pairs, plan, ``train@<run>``, ``package@<run>``, ``fuse@<hybrid>``, ``xr_linear@<run>``, report.
The GPU-heavy ones (``train@*``: training; ``package@*``: the label encoding and index of a dense run) go to the
GPU work pool when a deployment ``xmc-stage/gpu`` exists and its pool has an online worker; otherwise they run
in-process. Run locally (ephemeral Prefect server): ``python -m flows.pipeline [stage ...]``.
"""

from __future__ import annotations

import argparse
import fnmatch
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_link_artifact, create_markdown_artifact

from flows.dvc_tasks import run_dvc_stage, stage_order
from flows.guard import confine_name, confine_repo, repo_lock
from xmc.config import load_params, set_offline_env
from xmc.io import stage_from_address
from xmc.workspace import product_workspace

# the stages that train or encode with a neural encoder; the others (features, fusion, the linear peer, the
# report) run on the CPU worker
GPU_STAGE_PATTERNS = ("train@*", "package@*")


def _gpu_deployment_ready(name: str) -> bool:
    """True when deployment ``name`` exists and its work pool is not paused and has an online worker (a paused
    pool's worker takes no run: a stage sent there would wait until its timeout)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import WorkerFilter, WorkerFilterStatus

    try:
        with get_client(sync_client=True) as client:
            dep = client.read_deployment_by_name(name)
            if not dep.work_pool_name or client.read_work_pool(dep.work_pool_name).is_paused:
                return False
            workers = client.read_workers_for_work_pool(
                dep.work_pool_name, worker_filter=WorkerFilter(status=WorkerFilterStatus(any_=["ONLINE"])))
            return len(workers) > 0
    except Exception:  # no such deployment / pool, or no API: run in-process
        return False


def _run_on_gpu(stage: str, repo_dir: str, deployment: str, timeout: float) -> str:
    from prefect.deployments import run_deployment

    # this flow holds the repository slot; the stage flow runs inside it
    run = run_deployment(deployment, parameters={"stage": stage, "repo_dir": repo_dir, "hold_repo_lock": False,
                                                 "timeout_seconds": timeout},
                         timeout=timeout + 600, flow_run_name=f"stage-{stage}")
    if not run.state or not run.state.is_completed():
        raise RuntimeError(f"stage {stage} on {deployment} ended {run.state.name if run.state else 'without state'}: "
                           f"{run.state.message if run.state else ''}")
    return "ran-on-gpu-pool"


@flow(name="xmc-pipeline", log_prints=True)
def xmc_pipeline(repo_dir: str = ".", targets: list[str] | None = None,
                 gpu_deployment: str | None = "xmc-stage/gpu", promote: bool = False) -> dict[str, Any]:
    """Reproduce the product pipeline (or ``targets`` and their upstream), stage by stage, holding the
    repository's concurrency slot (a second scheduled run waits for this one). ``promote``: then push and
    commit the results and promote the packages of params ``registry.promote`` through the validation gate."""
    logger = get_run_logger()
    repo = confine_repo(repo_dir)
    targets = [confine_name(t, "target") for t in (targets or [])] or None
    if gpu_deployment:
        confine_name(gpu_deployment.replace("/", "-"), "gpu_deployment")
    orch = load_params(repo / "params.yaml")["orchestration"]
    with repo_lock(repo, orch["concurrency_limit_name"], orch["concurrency_wait_seconds"]):
        order = stage_order(repo, targets)
        logger.info("stages in order: %s", ", ".join(map(str, order)))
        use_gpu = bool(gpu_deployment) and _gpu_deployment_ready(gpu_deployment)
        logger.info("GPU pool: %s", f"deployment {gpu_deployment}" if use_gpu else
                    "none ready (no online worker, or the pool is paused); heavy stages run in-process")
        results: dict[str, Any] = {}
        for stage in order:
            timeout = stage_timeout(orch, stage)
            if use_gpu and any(fnmatch.fnmatch(stage_from_address(stage), p) for p in GPU_STAGE_PATTERNS):
                results[stage] = _run_on_gpu(stage, str(repo), gpu_deployment, timeout)
                continue
            # validation failures are data problems: retrying cannot fix them (nor any input error: exit code 2)
            retries = 0 if stage == "validate" else int(orch["retries"])
            t = run_dvc_stage.with_options(retries=retries, retry_delay_seconds=float(orch["retry_delay_seconds"]))
            results[stage] = t(stage, str(repo), timeout_seconds=timeout)
        publish_artifacts(repo)
        if promote:
            from flows.registry import xmc_promote

            results["promotion"] = xmc_promote(repo_dir=str(repo))
    return results


def stage_timeout(orch: dict[str, Any], stage: str) -> float:
    """``orchestration.stage_timeouts`` (fnmatch patterns such as ``train@*``) or ``stage_timeout_seconds``."""
    for pattern, seconds in orch["stage_timeouts"].items():
        if fnmatch.fnmatch(stage_from_address(stage), pattern):
            return float(seconds)
    return float(orch["stage_timeout_seconds"])


def publish_artifacts(repo: Path) -> None:
    ws = product_workspace(load_params(repo / "params.yaml"), repo)
    report = ws.reports / "comparison.md"
    if report.exists():
        create_markdown_artifact(key="xmc-comparison", markdown=report.read_text(encoding="utf-8"),
                                 description="Every run and hybrid: metrics with intervals, training and prediction seconds")
    validation = ws.validation_reports / "report.html"
    if validation.exists():
        create_link_artifact(key="xmc-data-validation", link=validation.as_uri(), link_text="Data-validation report")


def main() -> None:
    set_offline_env()
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repo-dir", default=".")
    ap.add_argument("--no-gpu-pool", action="store_true")
    ap.add_argument("targets", nargs="*", help="stages to reproduce with their upstream (default: report, the whole "
                    "pipeline); a stage (package@astra) or a group (package)")
    args = ap.parse_args()
    print(xmc_pipeline(repo_dir=args.repo_dir, targets=args.targets or ["report"],
                       gpu_deployment=None if args.no_gpu_pool else "xmc-stage/gpu"))


if __name__ == "__main__":
    main()
