"""What a deployment parameter may point at, and one DVC writer per repository at a time.

Deployment parameters come from whoever can reach the Prefect API, so they are not trusted as paths:
- ``repo_dir`` must be one of the allowed repositories: the checkout these flows live in, ``XMC_REPO_DIR``
  (set by the worker's deployment), and the ``os.pathsep``-separated ``XMC_ALLOWED_REPOS``;
- batch-prediction input and output files must lie under the repository's ``orchestration.allowed_paths``
  (``params.yaml``; relative to the repository), symlinks resolved;
- model and stage names are names, not paths.
Every flow that runs DVC holds the repository's global concurrency limit (one slot), so a scheduled run
that meets another one waits for it instead of failing on DVC's lock.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

FLOWS_REPO = Path(__file__).resolve().parents[1]
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,199}$")


class ParameterRefused(ValueError):
    """A deployment parameter outside what the configuration allows (never retried)."""


def allowed_repos() -> list[Path]:
    repos = [FLOWS_REPO]
    for var in ("XMC_REPO_DIR", "XMC_ALLOWED_REPOS"):
        for p in os.environ.get(var, "").split(os.pathsep):
            if p.strip():
                repos.append(Path(p.strip()).resolve())
    return repos


def confine_repo(repo_dir: str | Path) -> Path:
    """``repo_dir`` resolved, if it is an allowed repository with a ``dvc.yaml``."""
    repo = Path(repo_dir).resolve()
    allowed = allowed_repos()
    if repo not in allowed:
        raise ParameterRefused(f"repo_dir {str(repo_dir)!r} is not an allowed repository (allowed: "
                               f"{', '.join(map(str, allowed))}; extend with XMC_ALLOWED_REPOS on the worker)")
    if not (repo / "dvc.yaml").is_file():
        raise ParameterRefused(f"repo_dir {str(repo)!r} has no dvc.yaml")
    return repo


def confine_name(value: str, what: str) -> str:
    if not isinstance(value, str) or not NAME_RE.match(value) or ".." in value:
        raise ParameterRefused(f"{what} {value!r} is not a valid name (letters, digits, _ . @ -)")
    return value


def confine_path(path: str | Path, repo: Path, roots: list[str], what: str) -> Path:
    """``path`` (relative to ``repo`` unless absolute) resolved, if it lies under one of ``roots``."""
    p = Path(path)
    resolved = (p if p.is_absolute() else repo / p).resolve()
    allowed = [(repo / r).resolve() for r in roots]
    if not any(resolved == a or a in resolved.parents for a in allowed):
        raise ParameterRefused(f"{what} {str(path)!r} is outside the allowed paths "
                               f"({', '.join(map(str, allowed)) or 'none configured'}; params orchestration.allowed_paths)")
    return resolved


def repo_limit_name(repo: Path, prefix: str = "xmc-dvc-repo") -> str:
    return f"{prefix}-{hashlib.sha1(str(repo).encode()).hexdigest()[:12]}"


def ensure_limit(name: str, limit: int = 1) -> None:
    """Create the global concurrency limit if the server does not have it yet."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            with contextlib.suppress(ObjectAlreadyExists):
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=limit))


@contextlib.contextmanager
def repo_lock(repo: Path, prefix: str = "xmc-dvc-repo", wait_seconds: float = 6 * 3600) -> Iterator[str]:
    """Hold the repository's one slot while DVC runs: a second flow on the same repository queues here."""
    from prefect import get_run_logger
    from prefect.concurrency.sync import concurrency

    name = repo_limit_name(repo, prefix)
    ensure_limit(name)
    with contextlib.suppress(Exception):
        get_run_logger().info("waiting for the repository slot %s", name)
    with concurrency(name, occupy=1, timeout_seconds=wait_seconds, strict=True):
        with contextlib.suppress(Exception):
            get_run_logger().info("holding the repository slot %s", name)
        yield name
