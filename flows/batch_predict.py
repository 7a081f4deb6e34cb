"""Batch-prediction flow: a model package and a file of texts -> top-k labels with scores as JSON lines.

The model is a registry name (default params ``registry.serve``, the package holding ``prod``) or a package
folder under the repository's ``results/<dataset>/packages/``: ``astra`` is the current dataset's workspace package
``results/<data.name>/packages/astra/``, ``astra#prod`` / ``astra@v1.2.0`` a registered version (fetched into the
package cache), ``results/semcor-wn30/packages/astra`` a folder. A name is never taken as a path: whatever it
resolves to must be a package under ``results/<dataset>/packages/`` or a registered version. Prediction streams its input through the same predictor as ``xmc predict`` and the
service. Input and output paths must lie under the repository's ``orchestration.allowed_paths``; a bad input
file is a deterministic error and is not retried.
"""

from __future__ import annotations

import json
from pathlib import Path

from prefect import flow, get_run_logger, task

from flows.guard import ParameterRefused, confine_path, confine_repo
from xmc.config import load_params
from xmc.errors import ConfigError, XMCError


def _retry_unless_bad_input(task, task_run, state) -> bool:
    try:
        state.result()
    except (XMCError, ParameterRefused):
        return False
    except Exception:  # noqa: BLE001
        return True
    return True


def model_folder(spec: str, repo: Path) -> Path:
    """The package folder ``spec`` names, confined: a folder (``results/semcor-wn30/packages/astra``) must lie under
    one of the repository's ``results/<dataset>/packages/``; a bare name resolves to the current dataset's (params.yaml
    ``data.name``) only, never to a folder of the worker's working directory; a version or stage is fetched from the
    registry into the package cache."""
    from xmc.package.registry import resolve
    from xmc.workspace import RESULTS

    results = (repo / RESULTS).resolve()

    def confined(path: Path) -> bool:
        path = path.resolve()
        if not path.is_relative_to(results):
            return False
        parts = path.relative_to(results).parts
        return len(parts) >= 3 and parts[1] == "packages"

    where = f"{results}/<dataset>/packages/"
    if "/" in spec or spec.startswith("."):
        path = (repo / spec).resolve()
        if not confined(path):
            raise ParameterRefused(f"model {spec!r}: a package folder must be under {where}")
        return path
    path = resolve(spec, repo, paths=False)
    if "#" not in spec and "@" not in spec and not confined(path):
        raise ParameterRefused(f"model {spec!r} resolves to {path}, outside {where}")
    return path


@task(name="predict", retries=1, retry_condition_fn=_retry_unless_bad_input)
def predict_file(repo_dir: str, model: str, input_path: str, output_path: str, k: int, batch_size: int) -> int:
    from xmc.io import atomic_file
    from xmc.package import check_k, load
    from xmc.package.inputs import iter_input

    k = check_k(k)
    pkg = load(model_folder(model, Path(repo_dir)))
    for _ in iter_input(input_path):  # a bad line fails before anything is written
        pass
    n = 0
    with atomic_file(output_path) as fh:
        for uid, text, preds in pkg.predict_stream(iter_input(input_path), k, batch_size):
            fh.write(json.dumps({"id": uid, "text": text, "labels": [p.to_dict() for p in preds]},
                                ensure_ascii=False) + "\n")
            n += 1
    get_run_logger().info("%s (%s, %d labels): top-%d labels of %d texts", pkg.name, pkg.method, pkg.n_labels, k, n)
    return n


@flow(name="xmc-batch-predict", log_prints=True)
def xmc_batch_predict(input_path: str, output_path: str, model: str | None = None, repo_dir: str = ".",
                      k: int = 10) -> int:
    repo = confine_repo(repo_dir)
    params = load_params(repo / "params.yaml")
    roots = params["orchestration"]["allowed_paths"]
    src = confine_path(input_path, repo, roots, "input_path")
    dst = confine_path(output_path, repo, roots, "output_path")
    spec = model or params["registry"]["serve"]
    if not isinstance(spec, str) or not spec.strip():
        raise ParameterRefused(f"model {spec!r}: a package name (astra, astra#prod) or a folder under packages/")
    spec = spec.strip()
    if "#" not in spec and "@" not in spec:
        model_folder(spec, repo)  # a folder or workspace name outside packages/ is refused before the task
    if Path(dst).resolve() == Path(src).resolve():
        raise ConfigError(f"{output_path}: the output would overwrite the input")
    n = predict_file(str(repo), spec, str(src), str(dst), k, int(params["serve"]["batch_size"]))
    get_run_logger().info("wrote top-%d labels for %d texts to %s", k, n, dst)
    return n
