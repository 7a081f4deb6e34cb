"""Weekly benchmark: the main pipeline and the ablations, then the trainer-throughput benchmark, as Prefect artifacts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact

from flows.dvc_tasks import _env
from flows.guard import confine_repo
from flows.pipeline import xmc_pipeline


@task(name="trainer-throughput", retries=0, timeout_seconds=3600)
def trainer_throughput(repo_dir: str, steps: int) -> dict:
    out = Path(repo_dir) / "reports" / "bench_trainer_throughput.json"
    subprocess.run([sys.executable, "-m", "bench.trainer_throughput", "--steps", str(steps), "--out", str(out)],
                   cwd=repo_dir, env=_env(), check=True)
    return json.loads(out.read_text())


@flow(name="xmc-benchmark", log_prints=True)
def xmc_benchmark(repo_dir: str = ".", steps: int = 30) -> dict:
    repo = confine_repo(repo_dir)
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 10_000:
        raise ValueError(f"steps must be an integer in [1, 10000] (got {steps!r})")
    xmc_pipeline(repo_dir=str(repo), targets=["report", "report_ablations"])
    res = trainer_throughput(str(repo), steps)
    create_markdown_artifact(key="xmc-trainer-throughput", markdown="\n".join(
        ["| figure | value |", "|---|---|"] + [f"| {k} | {v:.3f} |" for k, v in res.items()]))
    return res
