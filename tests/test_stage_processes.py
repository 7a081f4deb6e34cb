"""No stage outlives what started it: the supervisor stops dvc and the stage when the flow process dies or a
timeout passes, and a stage under ``dvc repro`` stops when dvc is killed with SIGKILL (no orphan writer)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.pipeline_repo import ROOT, env, run


def _wait_pid(path: Path, timeout: float = 60) -> int:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.2)
    raise TimeoutError(f"{path} not written in {timeout} s")


def _gone(pid: int, timeout: float = 30) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # a zombie child of ours counts as gone
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.2)
    return False


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_supervisor_stops_the_command_group_when_the_flow_process_dies(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    child_code = f"import os,time; open({str(pidfile)!r},'w').write(str(os.getpid())); time.sleep(120)"
    # the command starts a grandchild, as dvc starts the stage
    cmd_code = f"import subprocess,sys,time; subprocess.Popen([sys.executable,'-c',{child_code!r}]); time.sleep(120)"
    flow_code = ("import os,subprocess,sys,time; subprocess.Popen([sys.executable,'-m','flows.supervise',str(os.getpid()),"
                 f"'0','2','--',sys.executable,'-c',{cmd_code!r}]); time.sleep(120)")
    flow = subprocess.Popen([sys.executable, "-c", flow_code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        pid = _wait_pid(pidfile)
        flow.send_signal(signal.SIGKILL)  # the flow process dies without any cleanup
        flow.wait(timeout=10)
        assert _gone(pid), "the stage outlived the flow process"
    finally:
        _kill(flow.pid)
        if pidfile.exists():
            _kill(int(pidfile.read_text()))


def test_supervisor_timeout_stops_the_group_with_exit_124(tmp_path):
    pidfile = tmp_path / "child.pid"
    child_code = f"import os,time; open({str(pidfile)!r},'w').write(str(os.getpid())); time.sleep(120)"
    cmd_code = f"import subprocess,sys,time; subprocess.Popen([sys.executable,'-c',{child_code!r}]); time.sleep(120)"
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "flows.supervise", str(os.getpid()), "3", "2", "--", sys.executable, "-c",
                        cmd_code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 124 and "timeout after 3 s" in p.stderr
    assert time.time() - t0 < 30
    assert _gone(_wait_pid(pidfile, 5))


def test_stage_under_dvc_stops_when_dvc_is_killed(tmp_path):
    """kill -9 of ``dvc repro`` used to leave the stage running next to the writer a rerun starts."""
    repo = tmp_path / "r"
    repo.mkdir()
    run(["git", "init", "-q"], repo)
    run(["dvc", "init", "-q"], repo)
    code = ("from xmc.config import run_entry_point; import os,time,pathlib; "
            "run_entry_point(lambda: (pathlib.Path('stage.pid').write_text(str(os.getpid())), time.sleep(120)))")
    import yaml

    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"long": {"cmd": f'python -c "{code}"', "always_changed": True}}}))
    e = env()
    e["PYTHONPATH"] = str(ROOT)
    dvc = subprocess.Popen([str(Path(sys.executable).with_name("dvc")), "repro", "long"], cwd=repo, env=e,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pid = _wait_pid(repo / "stage.pid")
        dvc.send_signal(signal.SIGKILL)
        dvc.wait(timeout=10)
        assert _gone(pid, 20), "the stage kept running after dvc was killed"
    finally:
        _kill(dvc.pid)
        if (repo / "stage.pid").exists():
            _kill(int((repo / "stage.pid").read_text()))
