"""Prefect tasks that run DVC stages, so DVC's cache decides what actually reruns."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import re

import networkx as nx
from prefect import get_run_logger, task

from xmc.config import OFFLINE_ENV


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


def stage_order(repo_dir: str | Path, targets: list[str] | None = None) -> list[str]:
    """Stages in dependency order, from ``dvc dag --dot`` (restricted to ``targets`` and their upstream)."""
    out = subprocess.run(_dvc() + ["dag", "--dot"], cwd=repo_dir, env=_env(), capture_output=True, text=True, check=True).stdout
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
    if targets:
        keep = set()
        for t in targets:
            if t not in g:
                matches = [n for n in g if n.split("@")[0] == t]
                if not matches:
                    raise ValueError(f"unknown DVC stage {t!r}; stages: {sorted(g)}")
            else:
                matches = [t]
            for m in matches:
                keep |= {m} | nx.ancestors(g, m)
        g = g.subgraph(keep)
    return list(nx.lexicographical_topological_sort(g))


@task(name="dvc-stage", task_run_name="{stage}")
def run_dvc_stage(stage: str, repo_dir: str, force: bool = False) -> str:
    """``dvc repro --single-item <stage>``; output streamed to the Prefect log.

    Raises with the stage's last error line (stages print one line starting with 'error:').
    """
    logger = get_run_logger()
    cmd = _dvc() + ["repro", "--single-item"] + (["--force"] if force else []) + [stage]
    proc = subprocess.Popen(cmd, cwd=repo_dir, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    error_line, ran = "", False
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        if not line or (_TQDM.search(line) and "100%|" not in line):
            continue  # tqdm redraws: keep the Prefect log readable (the final 100% line stays)
        logger.info("%s | %s", stage, line)
        if line.startswith("error:") or line.startswith("ERROR:"):
            error_line = error_line or line
        if line.startswith("Running stage"):
            ran = True
    rc = proc.wait()
    if rc != 0:
        raise RuntimeError(f"stage {stage} failed (exit {rc}): {error_line or 'see log'}")
    return "ran" if ran else "cached"
