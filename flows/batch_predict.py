"""Batch-prediction flow: a model and a file of texts -> top-k labels with scores as JSON lines.

Input and output paths must lie under the repository's ``orchestration.allowed_paths`` (params.yaml);
a bad input file is a deterministic error and is not retried.
"""

from __future__ import annotations

from prefect import flow, get_run_logger, task

from flows.guard import ParameterRefused, confine_name, confine_path, confine_repo
from xmc.config import load_params
from xmc.errors import XMCError
from xmc.predict import predict_file


def _retry_unless_bad_input(task, task_run, state) -> bool:
    try:
        state.result()
    except (XMCError, ParameterRefused):
        return False
    except Exception:  # noqa: BLE001
        return True
    return True


@task(name="predict", retries=1, retry_condition_fn=_retry_unless_bad_input)
def _predict(model_dir: str, index_dir: str, label_file: str, input_path: str, output_path: str, k: int) -> int:
    return predict_file(model_dir, index_dir, label_file, input_path, output_path, k)


@flow(name="xmc-batch-predict", log_prints=True)
def xmc_batch_predict(input_path: str, output_path: str, model: str = "dexml", repo_dir: str = ".", k: int = 10) -> int:
    repo = confine_repo(repo_dir)
    model = confine_name(model, "model")
    roots = load_params(repo / "params.yaml")["orchestration"]["allowed_paths"]
    src = confine_path(input_path, repo, roots, "input_path")
    dst = confine_path(output_path, repo, roots, "output_path")
    n = _predict(str(repo / "models" / model), str(repo / "indexes" / model), str(repo / "data/processed/lbl.jsonl"),
                 str(src), str(dst), k)
    get_run_logger().info("wrote top-%d labels for %d texts to %s", k, n, dst)
    return n
