"""Registry flows: keep what the nightly run trained (DVC push + a git commit) and promote a package to the
``prod`` stage only when its validation metrics pass the gate (params ``registry``).

The nightly deployment runs ``xmc_pipeline(targets=[report], promote=True)``, which ends with ``xmc_promote``.
A package ``packages/<name>/`` is built by ``package@<run>`` or, for a hybrid, ``fuse@<hybrid>``; the packages the
registry versions and promotes are the ``artifacts:`` of dvc.yaml. Run locally: ``python -m flows.registry``
(push, commit and promote the current packages).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from flows.dvc_tasks import _dvc, _env, package_stage
from flows.guard import ParameterRefused, confine_name, confine_repo
from xmc.config import load_params, set_offline_env
from xmc.workspace import product_workspace

# what the commit of a run keeps in git, under results/<data.name>/ (the rest is in the DVC cache and remote, found
# through dvc.lock)
RESULT_PATHS = ("dataset.json", "metrics", "metrics_val", "reports", "plots/eval")


def _git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=120, check=check)


@task(name="keep-results", retries=2, retry_delay_seconds=30)
def keep_results(repo_dir: str, artifacts: list[str], commit: bool = True) -> str | None:
    """``dvc push`` the outputs of the stages that build the packages ``artifacts`` (``package@<run>`` /
    ``fuse@<hybrid>``: the package, its predictions and evaluations) to the default remote, then commit the lock
    file, metrics, reports and evaluation plots (the registry's versions are git commits). Returns the new
    commit, or None when nothing changed."""
    repo = Path(repo_dir)
    logger = get_run_logger()
    params = load_params(repo / "params.yaml")
    targets = [package_stage(params, a) for a in artifacts]
    p = subprocess.run(_dvc() + ["push", *targets], cwd=repo, env=_env(), capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"dvc push failed: {(p.stderr or p.stdout).strip().splitlines()[-1:]}")
    logger.info("pushed %s to the DVC remote", ", ".join(targets))
    if not commit:
        return None
    root = product_workspace(params, ".").root
    kept = ["dvc.lock", *[(root / x).as_posix() for x in RESULT_PATHS]]
    _git(repo, "add", "--", *[x for x in kept if (repo / x).exists()])
    if _git(repo, "diff", "--cached", "--quiet", check=False).returncode == 0:
        logger.info("no new results to commit")
        return None
    _git(repo, "commit", "-q", "-m", "nightly: results and packages of the pipeline run")
    return _git(repo, "rev-parse", "HEAD").stdout.strip()


def check_promotable(repo: Path, names: list[str]) -> None:
    """Before anything is pushed or committed: each name is a package of the pipeline and an artifact of
    dvc.yaml (the registry versions and promotes only those)."""
    from xmc.package.registry import artifacts

    params = load_params(repo / "params.yaml")
    arts = artifacts(repo)
    for n in names:
        try:
            package_stage(params, n)
        except ValueError as e:
            raise ParameterRefused(f"artifact {e}") from None
        if n not in arts:
            raise ParameterRefused(f"{n!r} is not an artifact of {repo / 'dvc.yaml'} (the registry versions and "
                                   f"promotes only those: {', '.join(sorted(arts)) or 'none'}); add it under artifacts:")


@task(name="promote")
def promote_one(repo_dir: str, name: str, stage: str, gate: dict[str, Any]) -> dict[str, Any]:
    from xmc.package.registry import promote

    return promote(Path(repo_dir), name, stage, gate)


@flow(name="xmc-promote", log_prints=True)
def xmc_promote(repo_dir: str = ".", artifacts: list[str] | None = None, commit: bool = True) -> list[dict[str, Any]]:
    """Push and commit the packages, then gate and promote each of ``artifacts`` (default params
    ``registry.promote``) to ``registry.stage``."""
    repo = confine_repo(repo_dir)
    reg = load_params(repo / "params.yaml")["registry"]
    names = [confine_name(a, "artifact") for a in (artifacts or reg["promote"])]
    if not names:
        get_run_logger().info("no artifacts to promote (params registry.promote is empty)")
        return []
    check_promotable(repo, names)
    keep_results(str(repo), names, commit)
    decisions = [promote_one(str(repo), n, reg["stage"], reg["gate"]) for n in names]
    lines = ["| artifact | promoted | version | reasons |", "|---|---|---|---|"]
    for d in decisions:
        lines.append(f"| {d['artifact']} | {'yes' if d['promote'] else 'no'} | {d.get('assigned') or d.get('current_version') or '-'} "
                     f"| {'; '.join(d['reasons'])} |")
    create_markdown_artifact(key="xmc-promotion", markdown="\n".join(lines),
                             description=f"Promotion to {reg['stage']} (validation-metric gate)")
    get_run_logger().info("promotion: %s", json.dumps(decisions))
    return decisions


def main() -> None:
    import argparse

    set_offline_env()
    ap = argparse.ArgumentParser(description="Push, commit and promote the packages of params registry.promote")
    ap.add_argument("--repo-dir", default=".")
    ap.add_argument("--no-commit", action="store_true")
    ap.add_argument("artifacts", nargs="*")
    a = ap.parse_args()
    print(json.dumps(xmc_promote(repo_dir=a.repo_dir, artifacts=a.artifacts or None, commit=not a.no_commit), indent=2))


if __name__ == "__main__":
    main()
