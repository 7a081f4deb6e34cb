"""Prefect orchestration against a real server on 127.0.0.1: pools, deployments from infra/prefect.yaml,
process workers, a triggered pipeline run of the product pipeline (train@, package@, fuse@, report), a cron run,
retries, timeouts, the repository slot, the GPU-pool dispatch of train@/package@ stages, the index refresh, the
nightly push/commit/promotion and batch prediction, and a critical validation failure."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.pipeline_repo import ROOT, SEMCOR, make_repo, set_param, write_xc_dataset, results_of
from tests.prefect_stack import PrefectStack

WORDNET = (ROOT / ".." / "shared" / "datasets" / "wordnet30").resolve()
pytestmark = pytest.mark.skipif(not SEMCOR.exists() or not WORDNET.exists(),
                                reason="../shared/datasets/semcor-wn30 or wordnet30 not present")

BASELINES_ONLY = ["label_prior", "tfidf_knn"]
HYBRID = "tfidf_knn_hybrid"   # the one hybrid of the narrowed pipeline (its base is tfidf_knn)


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
        "runs": {m: {"method": m} for m in BASELINES_ONLY}, "hybrids": {HYBRID: {"base": "tfidf_knn"}},
        "xr_linear": {}, "graph.wordnet_dir": str(WORDNET),
        "orchestration.retries": 1, "orchestration.retry_delay_seconds": 1})
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
    assert set(names) == {"nightly-retrain", "data-validation", "index-refresh", "gpu", "batch-predict"}
    assert names["nightly-retrain"].work_pool_name == "cpu" and names["gpu"].work_pool_name == "gpu"
    assert names["nightly-retrain"].parameters["targets"] == ["report"]
    crons = {d.name: [s.schedule.cron for s in d.schedules] for d in deps}
    assert crons["nightly-retrain"] == ["0 2 * * *"] and crons["data-validation"] == ["15 */4 * * *"]
    pools = {p.name: p for p in _client_call(stack, lambda c: c.read_work_pools())}
    assert {"cpu", "gpu"} <= set(pools)
    assert "PYTORCH_CUDA_ALLOC_CONF" in json.dumps(pools["gpu"].base_job_template)


def test_triggered_pipeline_run_completes_with_metrics_and_artifacts(stack, deployed):
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.deployments import run_deployment
    from prefect.settings import temporary_settings

    t0 = time.time()
    with temporary_settings(stack.settings()):
        fr = run_deployment("xmc-pipeline/nightly-retrain", parameters={"targets": ["report"]}, timeout=0)
    fr = wait_for_run(stack, fr.id, timeout=400)
    assert fr.state.is_completed(), fr.state.message
    for m in [*BASELINES_ONLY, HYBRID]:
        assert json.loads((results_of(deployed) / f"metrics/{m}.json").read_text())["P@1"] >= 0
        assert (results_of(deployed) / "packages" / m / "manifest.json").is_file()
    assert "| tfidf_knn |" in (results_of(deployed) / "reports/comparison.md").read_text()
    # one task per stage of the product pipeline, in DAG order: every run trained, packaged, the hybrid fused
    trs = _client_call(stack, lambda c: c.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[fr.id]))))
    ran = {t.name for t in trs if t.state.is_completed()}
    assert {"ingest", "validate", "tfidf", "graph", "maclr_pseudo_pairs", "plan", "report", f"fuse@{HYBRID}",
            *[f"{s}@{m}" for m in BASELINES_ONLY for s in ("train", "package")]} <= ran, ran
    arts = _client_call(stack, lambda c: c.read_artifacts())
    keys = {a.key for a in arts if a.flow_run_id == fr.id}
    assert {"xmc-comparison", "xmc-data-validation"} <= keys
    comparison = next(a.data for a in arts if a.flow_run_id == fr.id and a.key == "xmc-comparison")
    assert "train s" in comparison and "predict s" in comparison   # the pipeline's own timings, every run
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


def test_the_nightly_completion_triggers_an_index_refresh_run(stack, deployed):
    """The index-refresh deployment's event trigger: each completed nightly-retrain run creates one of its runs."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    dep = _client_call(stack, lambda c: c.read_deployment_by_name("xmc-index-refresh/index-refresh"))
    deadline = time.time() + 90
    runs = []
    while time.time() < deadline and not runs:
        runs = _client_call(stack, lambda c: c.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep.id]))))
        time.sleep(2)
    assert runs, "no index-refresh run was created by the completed nightly-retrain runs"
    assert runs[0].parameters["model"] == "dexml_bow"   # infra/prefect.yaml's index-refresh model


def test_flows_run_only_the_product_pipeline(deployed):
    """Stages of another dvc.yaml in the repository (as the lab's) are not the product's: the flows never run them,
    even when a name or a group is the same."""
    from flows.dvc_tasks import downstream_order, stage_order

    nested = deployed / "lab"
    nested.mkdir()
    (nested / "dvc.yaml").write_text(yaml.safe_dump({"stages": {
        "plan": {"cmd": "exit 1"}, "package": {"foreach": ["zzz"], "do": {"cmd": "exit 1", "deps": ["../plans"]}}}}))
    try:
        every = stage_order(deployed)
        assert "plan" in every and not [s for s in every if ":" in s or "zzz" in s], every
        assert [s for s in stage_order(deployed, ["package"]) if s.startswith("package@")] == \
            [f"package@{m}" for m in BASELINES_ONLY]
        assert stage_order(deployed, ["plan"])[-1] == "plan"
        assert downstream_order(deployed, ["package@tfidf_knn"]) == [f"fuse@{HYBRID}", "report"]
        assert set(downstream_order(deployed, ["plan"])) == {
            *[f"{s}@{m}" for m in BASELINES_ONLY for s in ("train", "package")], f"fuse@{HYBRID}", "report"}
        with pytest.raises(ValueError, match="unknown DVC stage 'package@zzz'"):
            stage_order(deployed, ["package@zzz"])
    finally:
        shutil.rmtree(nested)


def test_training_and_package_stages_go_to_the_gpu_pool(stack, deployed):
    """With an online worker on the gpu pool, the pipeline flow sends train@<run> and package@<run> to the
    xmc-stage/gpu deployment (one flow run each) and runs the other stages itself; with the pool paused, none."""
    from prefect.settings import temporary_settings

    from flows.pipeline import _gpu_deployment_ready

    worker = stack.start_worker("gpu", "gpu-test", cwd=deployed, PYTHONPATH=str(deployed),
                                XMC_CACHE_DIR=str(deployed.parent / "xmc-cache"))
    try:
        _dispatch_to_the_gpu_pool(stack, deployed)
    finally:
        # the later tests' runs do their stages in-process: the worker stopped, its pool paused (the server marks
        # a stopped worker offline only after its missed heartbeats)
        stack.stop_worker(worker)
        stack.cli("work-pool", "pause", "gpu")
    with temporary_settings(stack.settings()):
        assert not _gpu_deployment_ready("xmc-stage/gpu")   # a paused pool is never sent a stage


def _dispatch_to_the_gpu_pool(stack: PrefectStack, deployed: Path) -> None:
    from prefect.client.schemas.filters import (DeploymentFilter, DeploymentFilterId, FlowRunFilter, FlowRunFilterId,
                                                WorkerFilter, WorkerFilterStatus)
    from prefect.deployments import run_deployment
    from prefect.settings import temporary_settings

    deadline = time.time() + 90
    while time.time() < deadline and not _client_call(stack, lambda c: c.read_workers_for_work_pool(
            "gpu", worker_filter=WorkerFilter(status=WorkerFilterStatus(any_=["ONLINE"])))):
        time.sleep(2)
    gpu = _client_call(stack, lambda c: c.read_deployment_by_name("xmc-stage/gpu"))
    with temporary_settings(stack.settings()):
        fr = run_deployment("xmc-pipeline/nightly-retrain", parameters={"targets": ["package@label_prior"]}, timeout=0)
    fr = wait_for_run(stack, fr.id, timeout=400)
    assert fr.state.is_completed(), fr.state.message
    stage_runs = _client_call(stack, lambda c: c.read_flow_runs(
        deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[gpu.id]))))
    mine = {r.name: r for r in stage_runs if r.parameters.get("stage") in ("train@label_prior", "package@label_prior")}
    assert set(mine) == {"stage-train@label_prior", "stage-package@label_prior"}, [r.name for r in stage_runs]
    assert all(r.state.is_completed() for r in mine.values())
    assert all(r.parameters["hold_repo_lock"] is False for r in mine.values())   # the pipeline flow holds the slot
    assert {r.parameters["timeout_seconds"] for r in mine.values()} == {86400.0, 14400.0}   # orchestration.stage_timeouts
    trs = _client_call(stack, lambda c: c.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[fr.id]))))
    names = {t.name for t in trs}
    assert {"ingest", "validate", "plan"} <= names and not names & {"train@label_prior", "package@label_prior"}, names


def test_index_refresh_rebuilds_the_package_and_what_depends_on_it(stack, deployed, monkeypatch):
    """Refreshing a hybrid rebuilds its base's package (the label index) and the hybrid, forced; upstream stages
    stay cached; the report follows; an unpackaged name is refused before anything runs."""
    from prefect.settings import temporary_settings

    from flows.guard import ParameterRefused
    from flows.index_refresh import xmc_index_refresh

    monkeypatch.setenv("XMC_ALLOWED_REPOS", str(deployed))
    built = (results_of(deployed) / "packages/tfidf_knn/manifest.json").stat().st_mtime_ns
    with temporary_settings(stack.settings()):
        out = xmc_index_refresh(repo_dir=str(deployed), model=HYBRID)
        assert out["package@tfidf_knn"] == "ran" and out[f"fuse@{HYBRID}"] == "ran", out
        assert all(out[s] == "cached" for s in ("ingest", "validate", "tfidf", "plan", "train@tfidf_knn")), out
        assert list(out)[-1] == "report" and "package@label_prior" not in out
        assert (results_of(deployed) / "packages/tfidf_knn/manifest.json").stat().st_mtime_ns > built
        with pytest.raises(ParameterRefused, match="'nope' is not a packaged run or hybrid"):
            xmc_index_refresh(repo_dir=str(deployed), model="nope")


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
    # a shipped validation split: nothing is carved out of the two training instances (one has no label)
    (data / "val.raw.txt").write_text("validation text\n")
    (data / "val_X_Y.txt").write_text("1 2\n0:1.0\n")
    kept = (deployed / "params.yaml").read_text()
    set_param(deployed, "data.dataset_dir", str(data))
    set_param(deployed, "data.name", "bad")   # another dataset: its own outputs folder
    set_param(deployed, "data.subsample", {"trn": 0, "tst": 0, "unit": "documents", "labels": "all"})
    from prefect.deployments import run_deployment
    from prefect.settings import temporary_settings

    try:
        with temporary_settings(stack.settings()):
            fr = run_deployment("xmc-data-validation/data-validation", timeout=0)
        fr = wait_for_run(stack, fr.id, timeout=300)
    finally:
        (deployed / "params.yaml").write_text(kept)   # the module's dataset again, for the tests after this one
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


def test_deployment_parameters_outside_the_allow_list_are_refused(stack, deployed, tmp_path, monkeypatch):
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
    # a model name is looked up under the dataset's packages only: a package folder of that name in the worker's working
    # directory (the repository root) is not loaded
    shutil.copytree(results_of(deployed) / "packages/tfidf_knn", deployed / "stolen")
    (deployed / "batch" / "in.txt").write_text("the cat sat on the mat\n")
    with temporary_settings(stack.settings()):
        fr = run_deployment("xmc-batch-predict/batch-predict", parameters={
            "input_path": "batch/in.txt", "output_path": "batch/out.jsonl", "repo_dir": str(deployed),
            "model": "stolen"}, timeout=0)
    fr = wait_for_run(stack, fr.id, timeout=200)
    pkgs = (results_of(deployed) / "packages").relative_to(deployed).as_posix()
    assert fr.state.is_failed() and f"no package {pkgs}/stolen/" in fr.state.message, fr.state.message
    assert not (deployed / "batch/out.jsonl").exists()
    from flows.batch_predict import model_folder

    (results_of(deployed) / "packages/linked").symlink_to(deployed / "stolen")
    try:
        for spec in ("linked", f"{pkgs}/linked", f"{pkgs}/../../../stolen", "../stolen", "results/x"):
            with pytest.raises(ParameterRefused, match="outside|must be under"):
                model_folder(spec, deployed)
    finally:
        (results_of(deployed) / "packages/linked").unlink()
        shutil.rmtree(deployed / "stolen")
    assert model_folder("tfidf_knn", deployed) == results_of(deployed) / "packages/tfidf_knn"
    # promotion: only artifacts of dvc.yaml are versioned; refused before anything is pushed or committed
    from flows.registry import xmc_promote

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=deployed, capture_output=True, text=True).stdout
    monkeypatch.setenv("XMC_ALLOWED_REPOS", str(deployed))
    with temporary_settings(stack.settings()), pytest.raises(ParameterRefused, match="'label_prior' is not an artifact"):
        xmc_promote(repo_dir=str(deployed), artifacts=["label_prior"])
    assert subprocess.run(["git", "rev-parse", "HEAD"], cwd=deployed, capture_output=True, text=True).stdout == head


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
    params registry.promote (artifacts of dvc.yaml) through the validation gate; batch-predict then serves the
    prod package, and any workspace package by its name."""
    from prefect.deployments import run_deployment
    from prefect.settings import temporary_settings

    from tests.pipeline_repo import run

    run(["dvc", "remote", "add", "-f", "-d", "local", str(tmp_path / "remote")], deployed)
    # the data of the module's repository (the validation-failure test ran on a dataset of its own)
    set_param(deployed, "data.dataset_dir", str(SEMCOR))
    set_param(deployed, "data.name", SEMCOR.name)
    # new results for the nightly run to keep: the bootstrap's seed moves every interval (a run on an unchanged
    # workspace has nothing to commit)
    set_param(deployed, "evaluate.bootstrap.seed", 1)
    set_param(deployed, "data.subsample", {"trn": 2, "tst": 1, "unit": "documents", "labels": "all"})
    set_param(deployed, "registry.promote", ["tfidf_knn"])
    dvc = yaml.safe_load((deployed / "dvc.yaml").read_text())
    pkgs = (results_of(deployed) / "packages").relative_to(deployed).as_posix()
    dvc["artifacts"]["tfidf_knn"] = {"path": f"{pkgs}/tfidf_knn", "type": "model"}   # the registry versions it
    (deployed / "dvc.yaml").write_text(yaml.safe_dump(dvc, sort_keys=False))
    run(["git", "add", "-A"], deployed)
    run(["git", "commit", "-qm", "promote tfidf_knn nightly"], deployed)
    with temporary_settings(stack.settings()):
        fr = run_deployment("xmc-pipeline/nightly-retrain", timeout=0)   # the deployment's parameters: report, promote
    fr = wait_for_run(stack, fr.id, timeout=600)
    assert fr.state.is_completed(), fr.state.message
    tags = subprocess.run(["git", "tag"], cwd=deployed, capture_output=True, text=True).stdout.split()
    assert "tfidf_knn@v0.1.0" in tags and "tfidf_knn#prod#1" in tags
    log = subprocess.run(["git", "log", "-1", "--format=%s"], cwd=deployed, capture_output=True, text=True).stdout
    assert log.startswith("nightly:")
    files = subprocess.run(["git", "show", "--name-only", "--format=", "HEAD"], cwd=deployed, capture_output=True,
                           text=True).stdout.split()
    assert "dvc.lock" in files, files
    res = results_of(deployed).relative_to(deployed).as_posix()
    # which runs' figures move with the bootstrap's seed depends on the slice (one test document: no interval
    # moves); that some did and that every moved one is committed is what the nightly run owes
    assert [f for f in files if f.startswith(f"{res}/metrics/") and f.endswith(".json")], files
    assert not [f for f in files if f.startswith(tuple(f"{res}/{d}/" for d in ("packages", "models", "predictions")))]
    # every result path is committed: nothing of them is left modified or untracked
    left = subprocess.run(["git", "status", "--porcelain", "--", "dvc.lock", *[f"{res}/{d}" for d in (
        "dataset.json", "metrics", "metrics_val", "reports", "plots/eval")]], cwd=deployed, capture_output=True,
        text=True).stdout
    assert left == "", left
    assert list((tmp_path / "remote").rglob("*")), "nothing pushed to the remote"
    arts = _client_call(stack, lambda c: c.read_artifacts())
    assert any(a.key == "xmc-promotion" and "tfidf_knn | yes" in (a.data or "") for a in arts)
    # batch prediction with no model named: params registry.serve = #prod = the package just promoted; and a
    # workspace package that is no artifact, by its name
    (deployed / "batch").mkdir(exist_ok=True)
    (deployed / "batch" / "in.txt").write_text("he went to the bank to deposit his money\nthe cat sat on the mat\n")
    for model in (None, HYBRID):
        out = f"batch/out-{model or 'prod'}.jsonl"
        with temporary_settings(stack.settings()):
            fr = run_deployment("xmc-batch-predict/batch-predict", parameters={
                "input_path": "batch/in.txt", "output_path": out, "repo_dir": str(deployed), "k": 3,
                **({"model": model} if model else {})}, timeout=0)
        fr = wait_for_run(stack, fr.id, timeout=300)
        assert fr.state.is_completed(), fr.state.message
        rows = [json.loads(x) for x in (deployed / out).read_text().splitlines()]
        assert [r["id"] for r in rows] == ["1", "2"] and all(len(r["labels"]) == 3 for r in rows)
