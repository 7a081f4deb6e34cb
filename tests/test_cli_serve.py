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
import numpy as np
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
    assert [r["id"] for r in rows] == ["1", "2"]   # a text without an id is its line number, as errors count lines
    assert [[(lab["id"], lab["index"]) for lab in r["labels"]] for r in rows] == [[(p.id, p.index) for p in row] for row in ref]
    assert all(set(lab) == {"id", "index", "text", "score"} for r in rows for lab in r["labels"])   # each once
    p = xmc_cmd("predict", pkg, "-k", "2", "--format", "tsv", stdin=b"she was able to swim across\n")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.decode().splitlines()
    assert lines[0].split("\t") == ["id", "rank", "label_id", "label_index", "score", "label_text"]
    assert len(lines) == 3 and lines[1].split("\t")[:4] == ["1", "1", ref[0][0].id, str(ref[0][0].index)]
    jl = tmp_path / "in.jsonl"
    jl.write_text(json.dumps({"id": "q7", "text": "able to swim"}) + "\n")
    p = xmc_cmd("predict", pkg, "--input", str(jl))
    assert p.returncode == 0 and json.loads(p.stdout)["id"] == "q7"
    p = xmc_cmd("info", pkg)
    assert p.returncode == 0 and b"astra" in p.stdout and b"labels      300" in p.stdout
    assert b"score       inner product" in p.stdout and b"not a probability" in p.stdout   # what a score is
    p = xmc_cmd("info", pkg, "--verify", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["labels"]["count"] == 300
    assert "classifier's logit" in json.loads(p.stdout)["score"]


def test_predict_writes_through_devices_fifos_and_links(packages, tmp_path):
    """An atomic rename would replace /dev/null, a named pipe or a symbolic link with a regular file: a device or
    a FIFO is written in place, a link's target is replaced and the link stays."""
    import stat
    import threading

    pkg = str(packages["label_prior"])
    good = tmp_path / "good.txt"
    good.write_text("able to swim\nanother text\n")
    p = xmc_cmd("predict", pkg, "-k", "2", "--input", str(good), "--output", "/dev/null")
    assert p.returncode == 0, p.stderr
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    p = xmc_cmd("predict", pkg, "-k", "2", "--input", str(good), "--output", str(fifo))
    reader.join(30)
    assert p.returncode == 0, p.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and len(got) == 1 and len(got[0].splitlines()) == 2
    target = tmp_path / "real.jsonl"
    target.write_text("old\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    p = xmc_cmd("predict", pkg, "-k", "2", "--input", str(good), "--output", str(link))
    assert p.returncode == 0, p.stderr
    assert link.is_symlink() and [json.loads(x)["id"] for x in target.read_text().splitlines()] == ["1", "2"]


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
    # a pickle where the package keeps arrays (its size entry updated, so only the reader can tell): one line
    planted = tmp_path / "planted"
    shutil.copytree(packages["tfidf_knn"], planted)
    np.savez(planted / "tfidf" / "idf.npz", idf=np.array([{"run": "code"}], dtype=object))
    m = json.loads((planted / "manifest.json").read_text())
    m["files"]["tfidf/idf.npz"]["bytes"] = (planted / "tfidf" / "idf.npz").stat().st_size
    (planted / "manifest.json").write_text(json.dumps(m))
    p = xmc_cmd("predict", str(planted), "--input", str(good), "--output", str(out))
    err = p.stderr.decode().strip()
    assert p.returncode == 2 and len(err.splitlines()) == 1 and "cannot be loaded" in err and not out.exists(), err
    # the output may not overwrite the input, the package, the expected labels or another stage's output
    p = xmc_cmd("predict", pkg, "--input", str(good), "--output", str(good))
    assert p.returncode == 2 and b"would overwrite the input" in p.stderr and good.read_text() == "able to swim\n"
    lbl = tmp_path / "lbl.jsonl"
    shutil.copy(packages["dense"] / "labels.jsonl", lbl) if (packages["dense"] / "labels.jsonl").is_file() else \
        lbl.write_text(other.read_text())
    before = lbl.read_bytes()
    p = xmc_cmd("predict", pkg, "--input", str(good), "--output", str(lbl), "--expect-labels", str(lbl))
    assert p.returncode == 2 and b"would overwrite the expected labels" in p.stderr and lbl.read_bytes() == before
    proj = tmp_path / "proj"
    (proj / ".dvc").mkdir(parents=True)
    (proj / "dvc.yaml").write_text("stages: {}\n")
    (proj / "dvc.lock").write_text("schema: '2.0'\nstages:\n  ingest:\n    cmd: python -m stages.ingest\n"
                                   "    outs:\n    - path: results/d/data/processed\n      md5: 0.dir\n")
    (proj / "results/d/data/processed").mkdir(parents=True)
    (proj / "results/d/data/processed/lbl.jsonl").write_text("kept\n")
    p = xmc_cmd("predict", pkg, "--input", str(good), "--output", "results/d/data/processed/lbl.jsonl", cwd=proj)
    err = p.stderr.decode().strip()
    assert p.returncode == 2 and len(err.splitlines()) == 1 and "an output of the project's pipeline" in err, err
    assert (proj / "results/d/data/processed/lbl.jsonl").read_text() == "kept\n"


# ------------------------------------------------------------------------------------------------
# the HTTP service
# ------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model: str, host: str = "127.0.0.1", env: dict | None = None,
                 args: list[str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([*XMC, "serve", model, "--host", host, "--port", str(self.port), *(args or [])],
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
    assert [[p["id"] for p in row] for row in body["predictions"]] == [[p.id for p in row] for row in ref]
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


@pytest.mark.parametrize("body,status,pattern", [
    (b'{"texts": ["fine"], "k": ' + b"7" * 5000 + b"}", 400, "too many digits"),
    (b'{"texts": [' + b"7" * 5000 + b"]}", 400, "too many digits"),
    ({"texts": ["7" * 5000], "k": 3}, 200, None),
    ({"texts": ["fine"], "k": -(10 ** 40)}, 422, "an integer of 41 digits"),
])
def test_service_answers_numbers_of_many_digits_without_a_500(server, body, status, pattern):
    import re

    if isinstance(body, bytes):
        r = httpx.post(server.url + "/predict", content=body, headers={"content-type": "application/json"}, timeout=30)
    else:
        r = httpx.post(server.url + "/predict", json=body, timeout=30)
    assert r.status_code == status, r.text
    assert pattern is None or re.search(pattern, r.json()["error"]), r.text


def test_service_has_one_error_envelope_a_typed_schema_and_offline_docs(server):
    for method, path, status in (("GET", "/nope", 404), ("GET", "/predict", 405), ("DELETE", "/health", 405)):
        r = httpx.request(method, server.url + path, timeout=10)
        assert r.status_code == status and set(r.json()) == {"error"} and r.json()["error"], (path, r.text)
    schema = httpx.get(server.url + "/openapi.json", timeout=10).json()
    op = schema["paths"]["/predict"]["post"]
    body = op["requestBody"]["content"]["application/json"]["schema"]
    assert body["required"] == ["texts"] and body["properties"]["texts"]["items"]["type"] == "string"
    assert body["additionalProperties"] is False
    ok = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    assert ok.endswith("/PredictResponse")
    for status in ("400", "413", "422"):
        assert op["responses"][status]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    comps = schema["components"]["schemas"]
    assert set(comps["LabelScore"]["properties"]) == {"id", "index", "text", "score"}
    assert "/health" in schema["paths"] and "/docs" not in schema["paths"]
    page = httpx.get(server.url + "/docs", timeout=10)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<script" not in page.text and "http" not in page.text.replace("/openapi.json", "")   # nothing remote
    assert "POST /predict" in page.text and "PredictResponse" in page.text


def test_serve_on_port_0_listens_on_a_free_port_and_logs_it(packages):
    import queue
    import re
    import threading

    proc = subprocess.Popen([*XMC, "serve", str(packages["label_prior"]), "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env={**os.environ, "XMC_REPO_DIR": ""}, start_new_session=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x.decode(errors="replace")) for x in proc.stdout], daemon=True).start()
    try:
        deadline, port, seen = time.monotonic() + 90, None, []
        while port is None and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                assert proc.poll() is None, "".join(seen)
                continue
            seen.append(line)
            m = re.search(r"serving label_prior .* on http://127\.0\.0\.1:(\d+)", line)
            port = int(m.group(1)) if m else None
        assert port and port != 8000 and port > 0, "".join(seen)
        for _ in range(60):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()["model"] == "label_prior"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_idle_connections_are_closed_and_bounded_so_the_service_keeps_answering(packages):
    """Connections that send nothing are closed after --idle-timeout, and those beyond --max-connections as soon as
    they are accepted: a flood of idle sockets does not take every file descriptor."""
    s = Server(str(packages["label_prior"]), args=["--idle-timeout", "1", "--max-connections", "20"])
    idle: list[socket.socket] = []
    try:
        s.wait()
        for _ in range(200):
            c = socket.create_connection(("127.0.0.1", s.port), timeout=5)
            idle.append(c)
        time.sleep(2.0)   # past the idle timeout: the service has closed every one of them
        closed = 0
        for c in idle:
            c.settimeout(0.5)
            try:
                closed += c.recv(1) == b""
            except ConnectionResetError:
                closed += 1
            except socket.timeout:   # still open: the service would hold it
                pass
        assert closed == len(idle)
        r = httpx.post(s.url + "/predict", json={"texts": ["x"], "k": 2}, timeout=10)
        assert r.status_code == 200 and len(r.json()["predictions"][0]) == 2
    finally:
        for c in idle:
            c.close()
        s.stop()


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
