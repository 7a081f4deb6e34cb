"""Prefect tasks that run DVC stages, so DVC's cache decides what actually reruns."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import networkx as nx
from prefect import get_run_logger, task

from xmc.config import OFFLINE_ENV
from xmc.io import stage_from_address


_TQDM = re.compile(r"\d+%\|")


def _dvc() -> list[str]:
    # the dvc of the interpreter running the flow (the project venv), not whatever is on PATH
    exe = Path(sys.executable).with_name("dvc")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "dvc"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for k, v in OFFLINE_ENV.items():
        env.setdefault(k, v)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def stage_graph(repo_dir: str | Path) -> nx.DiGraph:
    """The product pipeline's stages (the repository's root ``dvc.yaml``) and their dependencies, from
    ``dvc dag --dot``. Stages of other ``dvc.yaml`` files in the repository (addresses ``<path>/dvc.yaml:<stage>``)
    are left out: these flows reproduce the product pipeline only, and none of its stages depends on them."""
    out = subprocess.run(_dvc() + ["dag", "--dot"], cwd=repo_dir, env=_env(), capture_output=True, text=True,
                         check=True, timeout=600).stdout
    g = nx.DiGraph()
    for line in out.splitlines():
        line = line.strip().rstrip(";")
        if "->" in line:
            a, b = (x.strip().strip('"') for x in line.split("->"))
            g.add_edge(a, b)
        elif line.startswith('"') and line.endswith('"'):
            g.add_node(line.strip('"'))
        elif line.startswith('"') and "[" in line:
            g.add_node(line.split("[")[0].strip().strip('"'))
    return g.subgraph([n for n in g if ":" not in n]).copy()


def _matches(g: nx.DiGraph, target: str) -> list[str]:
    """The stages a target names: a stage (``package@astra``) or a group of foreach stages (``package``)."""
    if target in g:
        return [target]
    matches = [n for n in g if n.split("@")[0] == target]
    if not matches:
        raise ValueError(f"unknown DVC stage {target!r}; stages: {sorted(g)}")
    return matches


def stage_order(repo_dir: str | Path, targets: list[str] | None = None) -> list[str]:
    """The product pipeline's stages in dependency order (restricted to ``targets`` and their upstream).
    A target is a stage name (``package@astra``) or a stage group (``package``: every ``package@<run>``)."""
    g = stage_graph(repo_dir)
    if targets:
        keep: set[str] = set()
        for t in targets:
            for m in _matches(g, stage_from_address(t)):
                keep |= {m} | nx.ancestors(g, m)
        g = g.subgraph(keep)
    return list(nx.lexicographical_topological_sort(g))


def downstream_order(repo_dir: str | Path, stages: list[str]) -> list[str]:
    """The stages that depend on any of ``stages`` (not those themselves), in dependency order."""
    g = stage_graph(repo_dir)
    below: set[str] = set()
    for s in stages:
        for m in _matches(g, stage_from_address(s)):
            below |= nx.descendants(g, m)
    below -= set(stages)
    return list(nx.lexicographical_topological_sort(g.subgraph(below)))


def package_stage(params: dict, name: str) -> str:
    """The stage that builds package ``name`` (``packages/<name>/``): ``package@<run>`` for a run of params
    ``runs``, ``fuse@<hybrid>`` for a hybrid of params ``hybrids``."""
    if name in params["runs"]:
        return f"package@{name}"
    if name in params["hybrids"]:
        return f"fuse@{name}"
    why = " (the linear peer is reported, not packaged)" if name in params.get("xr_linear", {}) else ""
    raise ValueError(f"{name!r} is not a packaged run or hybrid of params.yaml{why}; packages: "
                     f"{', '.join([*params['runs'], *params['hybrids']]) or 'none'}")


class StageInputError(RuntimeError):
    """A stage failed on its input or parameters (exit code 2): a retry would fail the same way."""


class StageTimeout(RuntimeError):
    """A stage ran past its timeout; its whole process group was stopped."""


def _retry_only_transient(task, task_run, state) -> bool:
    """Prefect retry condition: bad data or parameters are not retried, everything else is."""
    try:
        state.result()
    except StageInputError:
        return False
    except Exception:  # noqa: BLE001
        return True
    return True


GRACE_SECONDS = 20.0
PROGRESS_EVERY_S = 30.0   # at most one progress line (and artifact update) per stage in this many seconds


class StageProgress:
    """A running stage's tqdm bars, as a bounded-rate log line and a Prefect progress artifact.

    Every ``PROGRESS_EVERY_S`` seconds (and at each bar's 100 %) the latest bar line is logged and the
    artifact ``<stage>-progress`` shows its percentage, so a training stage is visible in the UI while it runs.
    """

    def __init__(self, stage: str, every_s: float = PROGRESS_EVERY_S) -> None:
        self.stage, self.every_s = stage, every_s
        self.last = -float("inf")
        self.artifact_id = None

    def due(self, line: str) -> bool:
        now = time.monotonic()
        m = _TQDM.search(line)
        done = "100%|" in line
        if not done and now - self.last < self.every_s:
            return False
        self.last = now
        if m is not None:
            self._artifact(float(m.group(0)[:-2]), line)
        return True

    def _artifact(self, percent: float, line: str) -> None:
        from prefect.artifacts import create_progress_artifact, update_progress_artifact
        from prefect.context import FlowRunContext, TaskRunContext

        if TaskRunContext.get() is None and FlowRunContext.get() is None:
            return   # not inside a flow run (a plain call): the log line is all there is

        desc = f"{self.stage}: {line.split('|')[0].strip()}"[:200]
        try:
            if self.artifact_id is None:
                key = re.sub(r"[^a-z0-9-]+", "-", f"{self.stage}-progress".lower()).strip("-")
                self.artifact_id = create_progress_artifact(percent, key=key, description=desc)
            else:
                update_progress_artifact(self.artifact_id, percent, description=desc)
        except Exception:  # noqa: BLE001 - outside a flow run (or the API away) the log line is enough
            self.artifact_id = None


@task(name="dvc-stage", task_run_name="{stage}", retry_condition_fn=_retry_only_transient)
def run_dvc_stage(stage: str, repo_dir: str, force: bool = False, timeout_seconds: float = 0) -> str:
    """``dvc repro --single-item <stage>``; output streamed to the Prefect log.

    The command runs under :mod:`flows.supervise`: a timeout, a cancellation or the death of this process
    stops dvc *and* the stage it started (the whole process group), so a retry never meets a second writer.
    Raises with the stage's first error line (stages print one line starting with 'error:');
    :class:`StageInputError` (not retried) when the stage exited with the input-error code 2.
    """
    logger = get_run_logger()
    cmd = _dvc() + ["repro", "--single-item"] + (["--force"] if force else []) + [stage]
    sup = [sys.executable, "-m", "flows.supervise", str(os.getpid()), str(float(timeout_seconds)), str(GRACE_SECONDS), "--"]
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(sup + cmd, cwd=repo_dir, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    error_line, ran, input_error, timed_out = "", False, False, False
    progress = StageProgress(stage)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            line = line.rstrip()
            if not line:
                continue
            if _TQDM.search(line) and not progress.due(line):
                continue  # tqdm redraws: one line per PROGRESS_EVERY_S seconds keeps the Prefect log readable
            logger.info("%s | %s", stage, line)
            if line.startswith("error:") or line.startswith("ERROR:"):
                error_line = error_line or line
            if re.search(r"exited with 2\b", line):  # the stage's input-error exit code (xmc.config)
                input_error = True
            if line.startswith("supervise: timeout"):
                timed_out = True
            if line.startswith("Running stage"):
                ran = True
        rc = proc.wait()
    finally:
        if proc.poll() is None:  # cancelled or interrupted while the stage runs: stop it, do not orphan it
            logger.warning("%s: stopping the stage (flow cancelled or interrupted)", stage)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=GRACE_SECONDS + 10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    if rc == 0:
        return "ran" if ran else "cached"
    if timed_out:
        raise StageTimeout(f"stage {stage} exceeded its timeout of {timeout_seconds:.0f} s and was stopped")
    if input_error:
        raise StageInputError(f"stage {stage} failed on its input: {error_line or 'see log'}")
    raise RuntimeError(f"stage {stage} failed (exit {rc}): {error_line or 'see log'}")
