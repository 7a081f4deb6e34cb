"""The pipeline flow: every DVC stage as a Prefect task, in DAG order.

Run locally (ephemeral Prefect server): ``python -m flows.pipeline``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_link_artifact, create_markdown_artifact

from flows.dvc_tasks import run_dvc_stage, stage_order
from xmc.config import load_params, set_offline_env


@flow(name="xmc-pipeline", log_prints=True)
def xmc_pipeline(repo_dir: str = ".", targets: list[str] | None = None) -> dict[str, Any]:
    """Reproduce the DVC pipeline (or ``targets`` and their upstream), stage by stage."""
    logger = get_run_logger()
    repo = Path(repo_dir).resolve()
    orch = load_params(repo / "params.yaml").get("orchestration", {})
    order = stage_order(repo, targets)
    logger.info("stages in order: %s", order)
    results: dict[str, Any] = {}
    for stage in order:
        # validation failures are data problems: retrying cannot fix them
        retries = 0 if stage == "validate" else int(orch.get("retries", 1))
        t = run_dvc_stage.with_options(retries=retries, retry_delay_seconds=float(orch.get("retry_delay_seconds", 10)),
                                       timeout_seconds=float(orch.get("stage_timeout_seconds", 3600)))
        results[stage] = t(stage, str(repo))
    report = repo / "reports" / "comparison.md"
    if report.exists():
        create_markdown_artifact(key="xmc-comparison", markdown=report.read_text(encoding="utf-8"),
                                 description="Comparison table of every evaluated method")
    validation = repo / "reports" / "validation" / "report.html"
    if validation.exists():
        create_link_artifact(key="xmc-data-validation", link=validation.as_uri(), link_text="Data-validation report")
    return results


def main() -> None:
    set_offline_env()
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repo-dir", default=".")
    ap.add_argument("targets", nargs="*", help="DVC stages to reproduce (default: all)")
    args = ap.parse_args()
    print(xmc_pipeline(repo_dir=args.repo_dir, targets=args.targets or None))


if __name__ == "__main__":
    main()
