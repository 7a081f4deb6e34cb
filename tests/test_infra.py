"""Deployment files parse and say what they claim: compose, Dockerfiles, work-pool templates, prefect.yaml."""

from __future__ import annotations

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
    assert {"nightly-retrain", "data-validation", "weekly-benchmark", "index-refresh", "gpu", "batch-predict"} <= set(names)
    for d in spec["deployments"]:
        path, func = d["entrypoint"].split(":")
        assert f"def {func}(" in (ROOT / path).read_text()
    assert names["nightly-retrain"]["schedules"][0]["cron"] == "0 2 * * *"
    trig = names["index-refresh"]["triggers"][0]
    assert trig["expect"] == ["prefect.flow-run.Completed"] and trig["match_related"]["prefect.resource.name"] == "nightly-retrain"


def test_k8s_manifests_parse():
    docs = [d for d in yaml.safe_load_all((INFRA / "k8s/gpu-worker.yaml").read_text()) if d]
    assert {d["kind"] for d in docs} >= {"Namespace", "ServiceAccount", "Role", "RoleBinding", "PersistentVolumeClaim", "Deployment"}
