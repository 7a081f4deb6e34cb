"""Deployment files parse and say what they claim: compose, Dockerfiles, work-pool templates, prefect.yaml."""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess

import pytest
import yaml

from tests.pipeline_repo import ROOT

INFRA = ROOT / "infra"


def test_compose_file_is_valid_and_secure_by_default():
    compose = yaml.safe_load((INFRA / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "prefect-server", "cpu-worker", "gpu-worker"} <= set(services)
    server = services["prefect-server"]
    assert all(str(p).startswith("127.0.0.1:") for p in server["ports"]), "server must bind to loopback"
    env = server["environment"]
    assert "PREFECT_SERVER_API_AUTH_STRING" in env and env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
    assert env["PREFECT_API_DATABASE_CONNECTION_URL"].startswith("postgresql+asyncpg://")
    dev = services["gpu-worker"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert dev["driver"] == "nvidia" and "gpu" in dev["capabilities"]
    for svc in services.values():
        if "build" in svc:
            assert (ROOT / svc["build"]["dockerfile"]).exists()


def _compose_client() -> list[str] | None:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


@pytest.mark.skipif(_compose_client() is None, reason="no compose client (docker compose / docker-compose)")
def test_compose_config_parses_with_the_docker_client():
    p = subprocess.run(_compose_client() + ["-f", str(INFRA / "docker-compose.yml"), "config", "-q"], capture_output=True,
                       text=True, env={"PATH": "/usr/bin:/bin:/usr/local/bin", "PREFECT_AUTH": "u:p", "POSTGRES_PASSWORD": "x"})
    assert p.returncode == 0, p.stderr


def test_dockerfiles_install_the_project_offline_settings_and_gpu_extra():
    cpu = (INFRA / "docker/Dockerfile.cpu").read_text()
    gpu = (INFRA / "docker/Dockerfile.gpu").read_text()
    for text in (cpu, gpu):
        assert re.search(r"^FROM ", text, re.M) and "pip install" in text and "HF_HUB_OFFLINE=1" in text
        assert "PREFECT_SERVER_ANALYTICS_ENABLED=false" in text and "USER xmc" in text
    assert "nvidia/cuda" in gpu and '".[gpu]"' in gpu and "faiss-cpu" in gpu


@pytest.mark.parametrize("name", ["gpu-process.json", "gpu-kubernetes.json"])
def test_work_pool_templates_define_every_placeholder(name):
    tpl = json.loads((INFRA / "work-pools" / name).read_text())
    placeholders = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", json.dumps(tpl["job_configuration"])))
    assert placeholders <= set(tpl["variables"]["properties"]), placeholders - set(tpl["variables"]["properties"])
    if name == "gpu-kubernetes.json":
        limits = tpl["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == "{{ gpu_count }}"


def test_prefect_yaml_deployments_point_at_real_flows():
    spec = yaml.safe_load((INFRA / "prefect.yaml").read_text())
    names = {d["name"]: d for d in spec["deployments"]}
    # no weekly benchmark: it ran research tools (ablations, trainer throughput) that the product does not run
    assert set(names) == {"nightly-retrain", "data-validation", "index-refresh", "gpu", "batch-predict"}
    for d in spec["deployments"]:
        path, func = d["entrypoint"].split(":")
        assert path.startswith("flows/") and f"def {func}(" in (ROOT / path).read_text()
    assert names["nightly-retrain"]["schedules"][0]["cron"] == "0 2 * * *"
    trig = names["index-refresh"]["triggers"][0]
    assert trig["expect"] == ["prefect.flow-run.Completed"] and trig["match_related"]["prefect.resource.name"] == "nightly-retrain"


def test_deployment_parameters_name_stages_and_packages_of_the_pipeline():
    """The nightly targets are stages of the root dvc.yaml, the index-refresh model is a packaged run of
    params.yaml, and the GPU dispatch and stage timeouts match the pipeline's train@ and package@ stages."""
    from flows.dvc_tasks import package_stage
    from flows.pipeline import GPU_STAGE_PATTERNS, stage_timeout
    from xmc.config import load_params

    spec = yaml.safe_load((INFRA / "prefect.yaml").read_text())
    names = {d["name"]: d for d in spec["deployments"]}
    params = load_params(ROOT / "params.yaml")
    groups = set(yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"])
    assert set(names["nightly-retrain"]["parameters"]["targets"]) <= groups
    model = names["index-refresh"]["parameters"]["model"]
    assert package_stage(params, model) == f"package@{model}"
    stages = [f"{g}@{k}" for g, keys in (("train", params["runs"]), ("package", params["runs"]),
                                          ("fuse", params["hybrids"]), ("xr_linear", params["xr_linear"])) for k in keys]
    gpu = [s for s in stages if any(fnmatch.fnmatch(s, p) for p in GPU_STAGE_PATTERNS)]
    assert gpu == [s for s in stages if s.startswith(("train@", "package@"))] and gpu
    orch = params["orchestration"]
    assert stage_timeout(orch, "train@astra") == 86400 and stage_timeout(orch, "package@astra") == 14400
    assert stage_timeout(orch, "fuse@astra_hybrid") == stage_timeout(orch, "report") == orch["stage_timeout_seconds"]


OLD_STAGES = re.compile(r"\b(?:predict|predict_unidec|evaluate|evaluate_val|train_astra|train_ramen|train_unidec|"
                        r"train_maclr|train_maclr_fewshot|train_st_mnrl)@|pipelines/|report_ablations|(?<![\w.])bench\.")


def test_infra_and_its_docs_name_only_stages_that_exist():
    """No file of infra/ (nor docs/orchestration.md) names a stage or file of the pipeline before its
    restructuring (predict@, evaluate@, train_astra@, pipelines/, the ablations report, bench.)."""
    files = [p for p in INFRA.rglob("*") if p.is_file()] + [ROOT / "docs/orchestration.md"]
    hits = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in files for m in OLD_STAGES.finditer(p.read_text())]
    assert hits == []


def test_k8s_manifests_parse():
    docs = [d for d in yaml.safe_load_all((INFRA / "k8s/gpu-worker.yaml").read_text()) if d]
    assert {d["kind"] for d in docs} >= {"Namespace", "ServiceAccount", "Role", "RoleBinding", "PersistentVolumeClaim", "Deployment"}


def _manifest(name: str) -> dict:
    docs = [d for d in yaml.safe_load_all((INFRA / "k8s" / name).read_text()) if d]
    assert len(docs) == 1
    return docs[0]


def _mounts_workspace_and_shm(pod: dict) -> dict:
    """The pod's one container, after checking the PVC at /workspace and a memory-backed /dev/shm."""
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert volumes[mounts["/workspace"]]["persistentVolumeClaim"]["claimName"] == "xmc-workspace"
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    assert container["workingDir"] == "/workspace/xmc" and container["image"] == "xmc-gpu:latest"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DVC_NO_ANALYTICS": "1",
            "TOKENIZERS_PARALLELISM": "false"}.items() <= env.items()
    return container


def _torchrun_stage(command: list[str]) -> list[str]:
    """The torchrun options of a container command that runs `torchrun ... -m stages.train <run>`."""
    launcher = ["python", "-m", "torch.distributed.run"]
    assert command[:3] == launcher or command[0] == "torchrun", command
    options = command[3:] if command[:3] == launcher else command[1:]
    assert options[-3:-1] == ["-m", "stages.train"] and re.fullmatch(r"[\w.-]+", options[-1]), command
    return options[:-3]


def test_multi_node_manifests_train_a_run_of_params_and_commit_its_train_stage():
    from xmc.config import load_params

    runs = load_params(ROOT / "params.yaml")["runs"]
    job = _manifest("pytorchjob-train.yaml")
    js = _manifest("jobset-train.yaml")
    commands = [job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"],
                js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["command"]]
    for name, command in zip(("pytorchjob-train.yaml", "jobset-train.yaml"), commands):
        run = command[-1]
        assert run in runs, f"{name}: {run!r} is not a run of params.yaml"
        # afterwards its outputs are recorded by the run's train@ stage (one per run, every method)
        assert f"dvc commit train@{run}" in (INFRA / "k8s" / name).read_text()


def test_pytorchjob_trains_one_run_over_master_and_workers_with_torchrun():
    job = _manifest("pytorchjob-train.yaml")
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "PyTorchJob"
    assert job["metadata"]["namespace"] == "xmc"
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert set(specs) == {"Master", "Worker"} and specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] >= 1
    for spec in specs.values():
        container = _mounts_workspace_and_shm(spec["template"]["spec"])
        assert container["name"] == "pytorch"   # the operator's container name (ports, env)
        gpus = container["resources"]["limits"]["nvidia.com/gpu"]
        assert int(gpus) >= 1 and str(gpus) == str(job["spec"]["nprocPerNode"])   # one rank per GPU
        # no rendezvous options: torchrun takes them from the operator's PET_* env
        assert _torchrun_stage(container["command"]) == []


def test_jobset_ranks_nodes_by_completion_index_and_meets_at_pod_zero():
    js = _manifest("jobset-train.yaml")
    assert js["apiVersion"] == "jobset.x-k8s.io/v1alpha2" and js["kind"] == "JobSet"
    assert js["metadata"]["namespace"] == "xmc" and js["spec"]["network"]["enableDNSHostnames"] is True
    (rjob,) = js["spec"]["replicatedJobs"]
    job = rjob["template"]["spec"]
    assert rjob["replicas"] == 1 and job["completionMode"] == "Indexed"
    container = _mounts_workspace_and_shm(job["template"]["spec"])
    pairs = (o.split("=", 1) for o in _torchrun_stage(container["command"]))
    opts = {k.lstrip("-").replace("-", "_"): v for k, v in pairs}
    assert opts["node_rank"] == "$(JOB_COMPLETION_INDEX)"
    assert int(opts["nnodes"]) == job["parallelism"] == job["completions"]
    assert int(opts["nproc_per_node"]) == int(container["resources"]["limits"]["nvidia.com/gpu"])
    # pod 0's stable hostname: <jobset>-<replicatedJob>-<job index>-<pod index>.<subdomain (default: the jobset)>
    name = js["metadata"]["name"]
    subdomain = js["spec"]["network"].get("subdomain") or name
    master = opts.get("master_addr") or opts["rdzv_endpoint"].rsplit(":", 1)[0]
    assert master == f"{name}-{rjob['name']}-0-0.{subdomain}"


def test_kubernetes_pool_jobs_get_a_memory_backed_dev_shm():
    tpl = json.loads((INFRA / "work-pools/gpu-kubernetes.json").read_text())
    pod = tpl["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["/workspace"] == "workspace" and volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
