"""Weekly benchmark: the main pipeline and the ablations, then the trainer-throughput benchmark, as Prefect artifacts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact

from flows.dvc_tasks import _env
from flows.pipeline import xmc_pipeline


@task(name="trainer-throughput", retries=0, timeout_seconds=3600)
def trainer_throughput(repo_dir: str, steps: int) -> dict:
    out = Path(repo_dir) / "reports" / "bench_trainer_throughput.json"
    subprocess.run([sys.executable, "-m", "bench.trainer_throughput", "--steps", str(steps), "--out", str(out)],
                   cwd=repo_dir, env=_env(), check=True)
    return json.loads(out.read_text())


@flow(name="xmc-benchmark", log_prints=True)
def xmc_benchmark(repo_dir: str = ".", steps: int = 30) -> dict:
    xmc_pipeline(repo_dir=repo_dir, targets=["report", "report_ablations"])
    res = trainer_throughput(str(Path(repo_dir).resolve()), steps)
    create_markdown_artifact(key="xmc-trainer-throughput", markdown="\n".join(
        ["| figure | value |", "|---|---|"] + [f"| {k} | {v:.3f} |" for k, v in res.items()]))
    return res
