"""Batch-prediction flow: a model and a file of texts -> top-k labels with scores as JSON lines."""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger, task

from xmc.predict import predict_file


@task(name="predict", retries=1)
def _predict(model_dir: str, index_dir: str, label_file: str, input_path: str, output_path: str, k: int) -> int:
    return predict_file(model_dir, index_dir, label_file, input_path, output_path, k)


@flow(name="xmc-batch-predict", log_prints=True)
def xmc_batch_predict(input_path: str, output_path: str, model: str = "dexml", repo_dir: str = ".", k: int = 10) -> int:
    repo = Path(repo_dir).resolve()
    n = _predict(str(repo / "models" / model), str(repo / "indexes" / model), str(repo / "data/processed/lbl.jsonl"),
                 str(Path(input_path).resolve()), str(Path(output_path).resolve()), k)
    get_run_logger().info("wrote top-%d labels for %d texts to %s", k, n, output_path)
    return n
