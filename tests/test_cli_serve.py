"""The `xmc` command and the HTTP service, as a user runs them: real subprocesses, a real uvicorn server on a
free loopback port, real HTTP. Every bad input is one line (CLI) or a 4xx with a message (HTTP), nothing written."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import xmc
from tests.package_fixtures import build_all
from tests.pipeline_repo import SEMCOR

pytestmark = pytest.mark.skipif(not SEMCOR.exists(), reason="../shared/datasets/semcor-wn30 not present")

XMC = [shutil.which("xmc", path=str(Path(sys.executable).parent))] if shutil.which(
    "xmc", path=str(Path(sys.executable).parent)) else [sys.executable, "-m", "xmc.cli"]


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    return build_all(tmp_path_factory.mktemp("cli_pkgs"))


def xmc_cmd(*args: str, stdin: bytes | None = None, cwd: Path | None = None, env: dict | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
    e = {**os.environ, "XMC_REPO_DIR": "", **(env or {})}
    return subprocess.run([*XMC, *args], input=stdin, capture_output=True, timeout=timeout, cwd=cwd, env=e)


def test_help_everywhere():
    for sub in ([], ["predict"], ["info"], ["serve"], ["registry"], ["promote"]):
        p = xmc_cmd(*sub, "--help")
        assert p.returncode == 0 and b"usage: xmc" in p.stdout, sub


def test_predict_from_file_and_stdin_in_both_formats(packages, tmp_path):
    pkg = str(packages["astra"])
    inp = tmp_path / "in.txt"
    inp.write_text("she was able to swim across\nthat which is known to exist\n")
    out = tmp_path / "out.jsonl"
    p = xmc_cmd("predict", pkg, "-k", "3", "--input", str(inp), "--output", str(out))
    assert p.returncode == 0, p.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    ref = xmc.load(pkg).predict(["she was able to swim across", "that which is known to exist"], 3)
    assert [r["id"] for r in rows] == ["0", "1"]
    assert [[lab["uid"] for lab in r["labels"]] for r in rows] == [[p.uid for p in row] for row in ref]
    p = xmc_cmd("predict", pkg, "-k", "2", "--format", "tsv", stdin=b"she was able to swim across\n")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.decode().splitlines()
    assert len(lines) == 2 and lines[0].split("\t")[:3] == ["0", "1", ref[0][0].uid]
    jl = tmp_path / "in.jsonl"
    jl.write_text(json.dumps({"id": "q7", "text": "able to swim"}) + "\n")
    p = xmc_cmd("predict", pkg, "--input", str(jl))
    assert p.returncode == 0 and json.loads(p.stdout)["id"] == "q7"
    p = xmc_cmd("info", pkg)
    assert p.returncode == 0 and b"astra" in p.stdout and b"labels      300" in p.stdout
    p = xmc_cmd("info", pkg, "--verify", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["labels"]["count"] == 300


def _bad_inputs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    d = tmp_path
    (d / "empty.txt").write_bytes(b"")
    (d / "long.txt").write_bytes(b"ok\n" + b"a" * (10 * 1024 * 1024) + b"\n")
    (d / "bad.jsonl").write_text('{"text": "fine"}\n{"text": oops}\n')
    (d / "latin1.txt").write_bytes("caf\u00e9\n".encode("latin-1"))
    (d / "blank.txt").write_text("fine\n\nmore\n")
    return {"empty": (d / "empty.txt", r"empty input"), "long": (d / "long.txt", r"long\.txt:2: line longer than"),
            "json": (d / "bad.jsonl", r"bad\.jsonl:2: invalid JSON"),
            "utf8": (d / "latin1.txt", r"latin1\.txt:1: not valid UTF-8"),
            "blank": (d / "blank.txt", r"blank\.txt:2: empty text")}


def test_bad_cli_inputs_are_one_line_and_write_nothing(packages, tmp_path):
    import re

    pkg = str(packages["dense"])
    out = tmp_path / "out.jsonl"
    for what, (path, pattern) in _bad_inputs(tmp_path).items():
        p = xmc_cmd("predict", pkg, "--input", str(path), "--output", str(out))
        err = p.stderr.decode().strip()
        assert p.returncode == 2 and len(err.splitlines()) == 1 and re.search(pattern, err), (what, err)
        assert not out.exists() and not list(tmp_path.glob("*.tmp*")), what
    good = tmp_path / "good.txt"
    good.write_text("able to swim\n")
    for k, pattern in (("0", r"k must be an integer in \[1, 10000\]"), ("1000000000", r"k must be an integer")):
        p = xmc_cmd("predict", pkg, "-k", k, "--input", str(good), "--output", str(out))
        assert p.returncode == 2 and re.search(pattern, p.stderr.decode()) and not out.exists()
    # missing, corrupt and foreign packages
    p = xmc_cmd("predict", str(tmp_path / "nope"), "--input", str(good))
    assert p.returncode == 2 and b"model package not found" in p.stderr
    broken = tmp_path / "broken"
    shutil.copytree(packages["dense"], broken)
    (broken / "index" / "index.faiss").write_bytes(b"garbage")
    p = xmc_cmd("predict", str(broken), "--input", str(good), "--output", str(out))
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1 and b"index.faiss" in p.stderr and not out.exists()
    other = tmp_path / "other_lbl.jsonl"
    other.write_text(json.dumps({"uid": "x", "text": "y"}) + "\n")
    p = xmc_cmd("predict", pkg, "--input", str(good), "--expect-labels", str(other))
    assert p.returncode == 2 and b"built for another label set" in p.stderr
    # the output may not overwrite the input or the package
    p = xmc_cmd("predict", pkg, "--input", str(good), "--output", str(good))
    assert p.returncode == 2 and b"would overwrite the input" in p.stderr and good.read_text() == "able to swim\n"


# ------------------------------------------------------------------------------------------------
# the HTTP service
# ------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model: str, host: str = "127.0.0.1", env: dict | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([*XMC, "serve", model, "--host", host, "--port", str(self.port)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env={**os.environ, "XMC_REPO_DIR": "", **(env or {})}, start_new_session=True)

    def wait(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}: {self.proc.stdout.read().decode()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise AssertionError("server did not become healthy in time")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


@pytest.fixture(scope="module")
def server(packages):
    s = Server(str(packages["unidec"]))
    try:
        s.wait()
        yield s
    finally:
        s.stop()


def test_service_predicts_like_the_api(server, packages):
    texts = ["she was able to swim across", "not yet, up to the present time"]
    r = httpx.post(server.url + "/predict", json={"texts": texts, "k": 4}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    ref = xmc.load(str(packages["unidec"])).predict(texts, 4)
    assert body["model"] == "unidec" and body["k"] == 4
    assert [[p["uid"] for p in row] for row in body["predictions"]] == [[p.uid for p in row] for row in ref]
    assert httpx.get(server.url + "/health").json() == {"status": "ok", "model": "unidec", "labels": 300}
    m = httpx.get(server.url + "/model").json()
    assert m["labels"]["count"] == 300 and m["limits"]["max_texts"] == 256 and "files" not in m


@pytest.mark.parametrize("body,status,pattern", [
    ({"texts": ["x"] * 257}, 413, "257 texts in one request; at most 256"),
    ({"texts": ["a" * 10_001]}, 413, "10001 characters; at most 10000"),
    ({"texts": ["fine"], "k": 0}, 422, r"'k' must be an integer in \[1, 1000\]"),
    ({"texts": ["fine"], "k": 10**9}, 422, "'k' must be an integer"),
    ({"texts": ["fine", " "]}, 422, r"texts\[1\] is empty"),
    ({"texts": []}, 422, "non-empty list"),
    ({"texts": [3]}, 422, r"texts\[0\] is not a string"),
    ({"text": ["fine"]}, 422, "unknown field"),
    (b"{not json", 400, "not valid JSON"),
    (b'{"texts": ["caf\xe9"]}', 400, "not valid UTF-8"),
    (b"[" * 100_000, 400, "not valid JSON"),
    (b"x" * (256 * 60_016 + 5000), 413, "request body over"),
])
def test_service_limits_are_4xx_with_a_message(server, body, status, pattern):
    import re

    if isinstance(body, bytes):
        r = httpx.post(server.url + "/predict", content=body, headers={"content-type": "application/json"}, timeout=30)
    else:
        r = httpx.post(server.url + "/predict", json=body, timeout=30)
    assert r.status_code == status and re.search(pattern, r.json()["error"]), r.text


def test_non_loopback_needs_a_token_and_checks_it(packages):
    p = xmc_cmd("serve", str(packages["label_prior"]), "--host", "0.0.0.0", "--port", str(free_port()),
                env={"XMC_SERVE_TOKEN": ""})
    err = p.stderr.decode().strip()
    assert p.returncode == 2 and len(err.splitlines()) == 1 and "bearer token" in err
    other = packages["label_prior"].parent / "other_labels.jsonl"
    other.write_text(json.dumps({"uid": "x", "text": "y"}) + "\n")
    p = xmc_cmd("serve", str(packages["label_prior"]), "--port", str(free_port()), "--expect-labels", str(other))
    assert p.returncode == 2 and b"built for another label set" in p.stderr
    token = "t0k3n-for-the-test-0123456789"
    s = Server(str(packages["label_prior"]), host="0.0.0.0", env={"XMC_SERVE_TOKEN": token})
    try:
        s.wait()
        assert httpx.post(s.url + "/predict", json={"texts": ["x"]}).status_code == 401
        assert httpx.post(s.url + "/predict", json={"texts": ["x"]},
                          headers={"Authorization": "Bearer wrong"}).status_code == 401
        r = httpx.post(s.url + "/predict", json={"texts": ["x"], "k": 2}, headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200 and len(r.json()["predictions"][0]) == 2
    finally:
        s.stop()
