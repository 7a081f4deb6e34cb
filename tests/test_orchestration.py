"""Prefect orchestration against a real server on 127.0.0.1: pools, deployments from infra/prefect.yaml,
a process worker, a triggered pipeline run, a cron run, retries, and a critical validation failure."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path

import pytest
import yaml

from tests.pipeline_repo import ROOT, SEMCOR, make_repo, set_param, write_xc_dataset
from tests.prefect_stack import PrefectStack

pytestmark = pytest.mark.skipif(not SEMCOR.exists(), reason="../shared/datasets/semcor-wn30 not present")

BASELINES_ONLY = ["label_prior", "tfidf_knn"]


def _client_call(stack: PrefectStack, fn):
    import os

    from prefect.client.orchestration import get_client
    from prefect.settings import temporary_settings

    async def run():
        async with get_client() as c:
            return await fn(c)

    with temporary_settings(stack.settings()):
        os.environ.setdefault("PREFECT_HOME", str(stack.home))
        return asyncio.run(run())


def wait_for_run(stack: PrefectStack, flow_run_id, timeout: float = 300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        fr = _client_call(stack, lambda c: c.read_flow_run(flow_run_id))
        if fr.state and fr.state.is_final():
            return fr
        time.sleep(2)
    raise TimeoutError(f"flow run {flow_run_id} not finished in {timeout} s")


def _flaky_stage(repo: Path) -> None:
    """A stage that fails on its first attempt and succeeds on the second (retried by the flow)."""
    dvc = yaml.safe_load((repo / "dvc.yaml").read_text())
    dvc["stages"]["flaky"] = {
        "cmd": "python -c \"import pathlib,sys; m=pathlib.Path('flaky.marker'); "
               "sys.exit(0 if m.exists() and pathlib.Path('flaky.out').write_text('ok') else (m.write_text('1'), 1)[1])\"",
        "outs": [{"flaky.out": {"cache": False}}],
    }
    (repo / "dvc.yaml").write_text(yaml.safe_dump(dvc, sort_keys=False))


def _slow_stages(repo: Path) -> None:
    """``slow``: a stage that holds DVC's lock for a few seconds (two runs of it must not overlap);
    ``sleepy``: a stage that records its PID and would run for two minutes (stopped by a timeout)."""
    dvc = yaml.safe_load((repo / "dvc.yaml").read_text())
    dvc["stages"]["slow"] = {
        "cmd": "python -c \"import time,pathlib; t=time.time(); time.sleep(15); "
               "pathlib.Path('slow.log').open('a').write(f'{t} {time.time()}\\n')\"",
        "always_changed": True}
    dvc["stages"]["bad_input"] = {  # fails like a stage given a malformed file: exit code 2, one error line
        "cmd": "python -c \"import pathlib,sys; p=pathlib.Path('bad_input.count'); "
               "p.write_text(str(int(p.read_text())+1 if p.exists() else 1)); "
               "print('error: data.txt:3: label id 99 out of range [0, 12)', file=sys.stderr); sys.exit(2)\"",
        "always_changed": True}
    dvc["stages"]["sleepy"] = {
        "cmd": "python -c \"import os,time,pathlib; pathlib.Path('sleepy.pid').write_text(str(os.getpid())); "
               "time.sleep(120)\"",
        "always_changed": True}
    (repo / "dvc.yaml").write_text(yaml.safe_dump(dvc, sort_keys=False))


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    home = tmp_path_factory.mktemp("prefect_home")
    s = PrefectStack(home)
    s.start_server()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    r = make_repo(tmp_path_factory.mktemp("orch"), trn_docs=2, tst_docs=1, extra_params={
        "methods": BASELINES_ONLY, "orchestration.retries": 1, "orchestration.retry_delay_seconds": 1})
    _flaky_stage(r)
    _slow_stages(r)
    shutil.copytree(ROOT / "infra", r / "infra")
    return r


@pytest.fixture(scope="module")
def deployed(stack, repo):
    stack.cli("work-pool", "create", "cpu", "--type", "process")
    stack.cli("work-pool", "create", "gpu", "--type", "process", "--base-job-template",
              str(repo / "infra/work-pools/gpu-process.json"))
    out = stack.cli("--no-prompt", "deploy", "--all", "--prefect-file", "infra/prefect.yaml", cwd=repo,
                    XMC_REPO_DIR=str(repo))
    assert "nightly-retrain" in out.stdout + out.stderr
    # registry versions fetched by batch prediction go to a cache inside the test's folders, not ~/.cache
    stack.start_worker("cpu", "cpu-test", cwd=repo, PYTHONPATH=str(repo), XMC_CACHE_DIR=str(repo.parent / "xmc-cache"))
    return repo


def test_pools_and_deployments_from_prefect_yaml(stack, deployed):
    deps = _client_call(stack, lambda c: c.read_deployments())
    names = {d.name: d for d in deps}
    assert {"nightly-retrain", "data-validation", "weekly-benchmark", "index-refresh", "gpu", "batch-predict"} <= set(names)
    assert names["nightly-retrain"].work_pool_name == "cpu" and names["gpu"].work_pool_name == "gpu"
    crons = {d.name: [s.schedule.cron for s in d.schedules] for d in deps}
    assert crons["nightly-retrain"] == ["0 2 * * *"] and crons["weekly-benchmark"] == ["0 4 * * 0"]
    pools = {p.name: p for p in _client_call(stack, lambda c: c.read_work_pools())}
    assert {"cpu", "gpu"} <= set(pools)
    assert "PYTORCH_CUDA_ALLOC_CONF" in json.dumps(pools["gpu"].base_job_template)


def test_triggered_pipeline_run_completes_with_metrics_and_artifacts(stack, deployed):
    from prefect.deployments import run_deployment
    from prefect.settings import temporary_settings

    t0 = time.time()
    with temporary_settings(stack.settings()):
        fr = run_deployment("xmc-pipeline/nightly-retrain", parameters={"targets": ["report"]}, timeout=0)
    fr = wait_for_run(stack, fr.id, timeout=400)
    assert fr.state.is_completed(), fr.state.message
    for m in BASELINES_ONLY:
        assert json.loads((deployed / f"metrics/{m}.json").read_text())["P@1"] >= 0
    assert "| tfidf_knn |" in (deployed / "reports/comparison.md").read_text()
    arts = _client_call(stack, lambda c: c.read_artifacts())
    keys = {a.key for a in arts if a.flow_run_id == fr.id}
    assert {"xmc-comparison", "xmc-data-validation"} <= keys
    print(f"triggered run: {time.time() - t0:.1f} s from trigger to completion")


def test_stage_failing_once_is_retried_and_run_completes(stack, deployed):
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.deployments import run_deployment
    from prefect.settings import temporary_settings

    with temporary_settings(stack.settings()):
        fr = run_deployment("xmc-pipeline/nightly-retrain", parameters={"targets": ["flaky"]}, timeout=0)
    fr = wait_for_run(stack, fr.id, timeout=300)
    assert fr.state.is_completed(), fr.state.message
    trs = _client_call(stack, lambda c: c.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[fr.id]))))
    flaky = [t for t in trs if t.name.startswith("flaky")]
    assert flaky and flaky[0].run_count == 2 and flaky[0].state.is_completed()
    assert (deployed / "flaky.out").read_text() == "ok"


def test_cron_deployment_gets_an_automatic_run_that_completes(stack, deployed):
    # a one-minute cron: the server's scheduler creates the run, the worker executes it
    stack.cli("--no-prompt", "deploy", "flows/validation.py:xmc_data_validation", "--name", "every-minute",
              "--pool", "cpu", "--cron", "* * * * *", "--param", f"repo_dir={deployed}", cwd=deployed,
              XMC_REPO_DIR=str(deployed))
    dep = _client_call(stack, lambda c: c.read_deployment_by_name("xmc-data-validation/every-minute"))
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    deadline = time.time() + 200
    done = None
    while time.time() < deadline and done is None:
        runs = _client_call(stack, lambda c: c.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep.id]))))
        done = next((r for r in runs if r.state and r.state.is_completed() and r.auto_scheduled), None)
        time.sleep(3)
    assert done is not None, "no automatic run of the one-minute cron deployment completed within 200 s"
    took = (done.end_time - done.expected_start_time).total_seconds()
    print(f"scheduled run {done.name}: {took:.1f} s from its scheduled time to completion")
    _client_call(stack, lambda c: c.pause_deployment(dep.id))


def test_critical_validation_failure_fails_the_run_with_the_message(stack, deployed, tmp_path):
    data = write_xc_dataset(tmp_path / "bad", ["alpha label", "beta label"], ["first text", "second text"], ["test text"],
                            ["0:1.0", ""], ["1:1.0"])
    set_param(deployed, "data.dataset_dir", str(data))
    set_param(deployed, "data.subsample", {"trn": 0, "tst": 0, "unit": "documents", "labels": "all"})
    from prefect.deployments import run_deployment
    from prefect.settings import temporary_settings

    with temporary_settings(stack.settings()):
        fr = run_deployment("xmc-data-validation/data-validation", timeout=0)
    fr = wait_for_run(stack, fr.id, timeout=300)
    assert fr.state.is_failed()
    assert "data validation failed: trn: every training instance has at least one label (1 unexpected)" in fr.state.message


def test_api_refuses_requests_without_the_password(stack):
    import base64
    import urllib.error
    import urllib.request

    req = urllib.request.Request(f"{stack.api}/flows/filter", data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 401
    req.add_header("Authorization", "Basic " + base64.b64encode(stack.auth.encode()).decode())
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200


def test_overlapping_scheduled_runs_queue_on_the_repository_slot(stack, deployed):
    """Two runs scheduled for the same moment on one repository: the second waits for the first's slot
    (it does not fail on DVC's lock), and both complete; their DVC stages never overlap."""
    from datetime import datetime, timedelta, timezone

    from prefect.states import Scheduled

    dep = _client_call(stack, lambda c: c.read_deployment_by_name("xmc-pipeline/nightly-retrain"))
    when = datetime.now(timezone.utc) + timedelta(seconds=5)
    (deployed / "slow.log").unlink(missing_ok=True)
    ids = [_client_call(stack, lambda c: c.create_flow_run_from_deployment(
        dep.id, parameters={"targets": ["slow"]}, state=Scheduled(scheduled_time=when))).id for _ in range(2)]
    runs = [wait_for_run(stack, i, timeout=300) for i in ids]
    assert all(r.state.is_completed() for r in runs), [r.state.message for r in runs]
    spans = sorted(tuple(map(float, line.split())) for line in (deployed / "slow.log").read_text().splitlines())
    assert len(spans) == 2 and spans[1][0] >= spans[0][1], f"the two stage runs overlapped: {spans}"
    # the second flow run was already running while the first one's stage ran: it queued on the slot
    assert max(r.start_time.timestamp() for r in runs) < spans[0][1], "the runs did not overlap: nothing was tested"
    print(f"overlapping runs: stage spans {spans}")


def test_stage_timeout_stops_dvc_and_the_stage(stack, deployed, monkeypatch):
    import os
    import signal as _signal

    from prefect.settings import temporary_settings

    from flows.dvc_tasks import StageTimeout
    from flows.stage import xmc_stage

    monkeypatch.setenv("XMC_ALLOWED_REPOS", str(deployed))
    (deployed / "sleepy.pid").unlink(missing_ok=True)
    t0 = time.time()
    with temporary_settings(stack.settings()), pytest.raises(StageTimeout, match="exceeded its timeout of 4 s"):
        xmc_stage(stage="sleepy", repo_dir=str(deployed), timeout_seconds=4)
    assert time.time() - t0 < 90
    pid = int((deployed / "sleepy.pid").read_text())
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.5)
    else:
        os.kill(pid, _signal.SIGKILL)
        pytest.fail("the timed-out stage is still running")


def test_deployment_parameters_outside_the_allow_list_are_refused(stack, deployed, tmp_path):
    from flows.guard import ParameterRefused, confine_name, confine_path, confine_repo

    with pytest.raises(ParameterRefused, match="not an allowed repository"):
        confine_repo(tmp_path)
    with pytest.raises(ParameterRefused, match="outside the allowed paths"):
        confine_path("/etc/passwd", deployed, ["batch"], "input_path")
    with pytest.raises(ParameterRefused, match="outside the allowed paths"):
        confine_path("batch/../params.yaml", deployed, ["batch"], "input_path")
    (deployed / "batch").mkdir(exist_ok=True)
    (deployed / "batch" / "link").symlink_to("/etc/passwd")
    with pytest.raises(ParameterRefused, match="outside the allowed paths"):
        confine_path("batch/link", deployed, ["batch"], "input_path")
    assert confine_path("batch/in.txt", deployed, ["batch"], "input_path") == (deployed / "batch/in.txt").resolve()
    with pytest.raises(ParameterRefused, match="not a valid name"):
        confine_name("../../etc", "model")
    # through the deployment: a batch prediction reading /etc/passwd fails without retry and writes nothing
    from prefect.deployments import run_deployment
    from prefect.settings import temporary_settings

    with temporary_settings(stack.settings()):
        fr = run_deployment("xmc-batch-predict/batch-predict", parameters={
            "input_path": "/etc/passwd", "output_path": "batch/out.jsonl", "repo_dir": str(deployed)}, timeout=0)
    fr = wait_for_run(stack, fr.id, timeout=200)
    assert fr.state.is_failed() and "outside the allowed paths" in fr.state.message
    assert not (deployed / "batch/out.jsonl").exists()


def test_input_errors_are_not_retried(stack, deployed):
    """A stage that exits with the input-error code (2) fails the run at once; a retry would fail the same way."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.deployments import run_deployment
    from prefect.settings import temporary_settings

    (deployed / "bad_input.count").unlink(missing_ok=True)
    with temporary_settings(stack.settings()):
        fr = run_deployment("xmc-pipeline/nightly-retrain", parameters={"targets": ["bad_input"]}, timeout=0)
    fr = wait_for_run(stack, fr.id, timeout=300)
    assert fr.state.is_failed() and "data.txt:3: label id 99 out of range" in fr.state.message
    trs = _client_call(stack, lambda c: c.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[fr.id]))))
    bad = [t for t in trs if t.name.startswith("bad_input")]
    assert bad and bad[0].run_count == 1, [(t.name, t.run_count) for t in trs]
    assert (deployed / "bad_input.count").read_text() == "1"


def test_nightly_run_keeps_packages_promotes_through_the_gate_and_batch_predicts_prod(stack, deployed, tmp_path):
    """The nightly deployment builds the packages, pushes them to the DVC remote, commits the results, promotes
    params registry.promote through the validation gate; batch-predict then serves the prod package."""
    import subprocess

    from prefect.deployments import run_deployment
    from prefect.settings import temporary_settings

    from tests.pipeline_repo import run

    run(["dvc", "remote", "add", "-f", "-d", "local", str(tmp_path / "remote")], deployed)
    # the data of the module's repository (the validation-failure test points it at a broken dataset)
    set_param(deployed, "data.dataset_dir", str(SEMCOR))
    set_param(deployed, "data.subsample", {"trn": 2, "tst": 1, "unit": "documents", "labels": "all"})
    set_param(deployed, "registry.promote", ["tfidf_knn"])
    run(["git", "add", "-A"], deployed)
    run(["git", "commit", "-qm", "promote tfidf_knn nightly"], deployed)
    with temporary_settings(stack.settings()):
        fr = run_deployment("xmc-pipeline/nightly-retrain", parameters={"targets": ["report", "package"]}, timeout=0)
    fr = wait_for_run(stack, fr.id, timeout=600)
    assert fr.state.is_completed(), fr.state.message
    tags = subprocess.run(["git", "tag"], cwd=deployed, capture_output=True, text=True).stdout.split()
    assert "tfidf_knn@v0.1.0" in tags and "tfidf_knn#prod#1" in tags
    log = subprocess.run(["git", "log", "-1", "--format=%s"], cwd=deployed, capture_output=True, text=True).stdout
    assert log.startswith("nightly:")
    assert list((tmp_path / "remote").rglob("*")), "nothing pushed to the remote"
    arts = _client_call(stack, lambda c: c.read_artifacts())
    assert any(a.key == "xmc-promotion" and "tfidf_knn | yes" in (a.data or "") for a in arts)
    # batch prediction with no model named: params registry.serve = #prod = the package just promoted
    (deployed / "batch").mkdir(exist_ok=True)
    (deployed / "batch" / "in.txt").write_text("he went to the bank to deposit his money\nthe cat sat on the mat\n")
    with temporary_settings(stack.settings()):
        fr = run_deployment("xmc-batch-predict/batch-predict", parameters={
            "input_path": "batch/in.txt", "output_path": "batch/out.jsonl", "repo_dir": str(deployed), "k": 3}, timeout=0)
    fr = wait_for_run(stack, fr.id, timeout=300)
    assert fr.state.is_completed(), fr.state.message
    rows = [json.loads(x) for x in (deployed / "batch/out.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["0", "1"] and all(len(r["labels"]) == 3 for r in rows)
