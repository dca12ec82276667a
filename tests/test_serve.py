"""The HTTP worker, run as a real server process on loopback and driven by real clients."""

import json
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, HTTPServer

import httpx
import openai
import pytest

NAME = "SmolLM2-135M-Instruct.Q4_1"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, tmp_path, *args):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp_path / f"server-{self.port}.log"
        cmd = [sys.executable, "-m", "refllama.serve", "--port", str(self.port), "-t", "1", *args]
        self.proc = subprocess.Popen(cmd, stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=2).json()["status"] == "ready":
                    return
            except httpx.HTTPError:
                pass
            assert self.proc.poll() is None, self.log.read_text()
            time.sleep(0.3)
        raise TimeoutError(self.log.read_text())

    def health(self):
        return httpx.get(self.url + "/health", timeout=5).json()

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=20)


class Receiver(BaseHTTPRequestHandler):
    received = []

    def do_POST(self):
        Receiver.received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Open server, small context and queue; its ready callback points at a closed port (and fails)."""
    s = Server(tmp_path_factory.mktemp("srv"), "-c", "1024", "--max-queue", "4", "--max-body", "65536",
               "--callback-url", f"http://127.0.0.1:{free_port()}/ready")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """Server with an API key, reporting ready to a local receiver."""
    rx = HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=rx.serve_forever, daemon=True).start()
    s = Server(tmp_path_factory.mktemp("sec"), "--api-key", "s3cret", "--worker-id", "w-7",
               "--callback-url", f"http://127.0.0.1:{rx.server_port}/ready")
    yield s
    s.stop()
    rx.shutdown()


def cli(*args):
    r = subprocess.run([sys.executable, "-m", "refllama.run", "-t", "1", *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.slow
def test_openai_client_streams_a_chat_completion_equal_to_the_cli(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    question = "What is the capital of France?"
    stream = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": question}],
                                            stream=True, temperature=0, max_tokens=24)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert text + "\n" == cli("--chat", "-p", question, "-n", "24", "--temp", "0")


@pytest.mark.slow
def test_openai_client_streams_a_completion_equal_to_the_cli(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    prompt = "The history of the printing press begins"
    chunks = list(client.completions.create(model=NAME, prompt=prompt, stream=True, temperature=0, max_tokens=16))
    text = "".join(c.choices[0].text for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert prompt + text + "\n" == cli("-p", prompt, "-n", "16", "--temp", "0")


def test_non_streaming_answer_has_usage_and_finish_reason(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    r = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Say hi."}],
                                       temperature=0, max_tokens=40, seed=1)
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content
    assert r.usage.prompt_tokens > 10 and 0 < r.usage.completion_tokens < 40
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    r = client.completions.create(model=NAME, prompt="One, two, three,", max_tokens=5, temperature=0, stop=[","])
    assert "," not in r.choices[0].text and r.choices[0].finish_reason == "stop"


def test_health_and_models(server):
    assert httpx.get(server.url + "/health").status_code == 200
    h = server.health()
    assert h["status"] == "ready" and h["model"] == NAME and h["backend"] == "numpy" and h["context_size"] == 1024
    assert h["queue_depth"] == 0
    models = openai.OpenAI(base_url=server.url + "/v1", api_key="unused").models.list()
    assert [m.id for m in models.data] == [NAME]


CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("path, body, status, param", [
    (CHAT, b"{not json", 400, None),
    (CHAT, b"[1, 2]", 400, None),
    (CHAT, {"model": NAME, "messages": "hi"}, 400, "messages"),
    (CHAT, {"model": NAME, "messages": MSG, "temperature": "hot"}, 400, "temperature"),
    (CHAT, {"model": NAME, "messages": MSG, "temperature": -1}, 400, "temperature"),
    (CHAT, {"model": NAME, "messages": MSG, "max_tokens": 0}, 400, "max_tokens"),
    (CHAT, {"model": NAME, "messages": MSG, "max_tokens": 5000}, 400, "max_tokens"),
    (CHAT, {"model": NAME, "messages": MSG, "max_tokens": 1000}, 400, "max_tokens"),  # prompt + 1000 > 1024
    (CHAT, {"model": "gpt-4", "messages": MSG}, 404, "model"),
    (CHAT, {"model": NAME, "messages": [{"role": "user", "content": 5}]}, 400, "messages"),
    ("/v1/completions", {"model": NAME, "prompt": 5}, 400, "prompt"),
    ("/v1/completions", {"model": NAME, "prompt": "word " * 1100}, 400, "prompt"),
    ("/v1/completions", {"model": NAME, "prompt": "x", "stop": [1]}, 400, "stop"),
    ("/v1/completions", {"model": NAME, "prompt": "x" * 70000}, 413, None),
    (CHAT, {"model": NAME, "messages": MSG, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools"),
    (CHAT, {"model": NAME, "messages": MSG, "response_format": {"type": "json_object"}}, 400, "response_format"),
    (CHAT, {"model": NAME, "messages": MSG, "logit_bias": {"15": 100}}, 400, "logit_bias"),
    ("/v1/completions", {"model": NAME, "prompt": "x", "echo": True}, 400, "echo"),
])
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(server, path, body, status, param):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(server.url + path, content=content, headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"] and err["param"] == param
    assert server.health()["status"] == "ready"


def test_disconnect_cancels_the_generation(server):
    body = {"model": NAME, "prompt": "Once upon a time", "max_tokens": 900, "temperature": 0.8, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
    assert any(line.startswith("data: ") for line in got)
    deadline = time.time() + 10  # 900 tokens would take ~30 s; a cancelled one stops at the next token
    while server.health()["busy"] and time.time() < deadline:
        time.sleep(0.1)
    assert not server.health()["busy"]
    assert "generation cancelled" in server.log.read_text()


def stream_one(url, i):
    body = {"model": NAME, "messages": [{"role": "user", "content": f"Count to {i}."}], "max_tokens": 8,
            "temperature": 0, "stream": True}
    with httpx.stream("POST", url + CHAT, json=body, timeout=120) as r:
        if r.status_code == 503:
            return "refused" if r.headers.get("retry-after") else "503 without Retry-After"
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    finished = any(json.loads(line[6:])["choices"][0]["finish_reason"] for line in lines[:-1])
    return "served" if r.status_code == 200 and lines[-1] == "data: [DONE]" and finished else f"broken {r.status_code}"


@pytest.mark.slow
def test_burst_of_20_streaming_clients_each_served_or_refused(server):
    with ThreadPoolExecutor(20) as pool:
        results = list(pool.map(lambda i: stream_one(server.url, i), range(20)))
    assert set(results) <= {"served", "refused"}, results
    assert results.count("served") >= 5  # the running one plus a full queue of 4, at least
    h = server.health()
    assert h["status"] == "ready" and h["queue_depth"] == 0 and not h["busy"]


def test_failing_ready_callback_is_logged_and_server_serves(server):
    deadline = time.time() + 10
    while "ready callback" not in server.log.read_text() and time.time() < deadline:
        time.sleep(0.2)
    assert "ready callback" in server.log.read_text() and server.health()["status"] == "ready"


@pytest.mark.slow  # a server of its own (the fast tier keeps one)
def test_api_key_is_required_except_for_health(secured):
    assert httpx.get(secured.url + "/health").status_code == 200
    r = httpx.get(secured.url + "/v1/models")
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(secured.url + "/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    client = openai.OpenAI(base_url=secured.url + "/v1", api_key="s3cret")
    assert client.chat.completions.create(model=NAME, messages=MSG, max_tokens=4).choices[0].message.content is not None
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=secured.url + "/v1", api_key="nope").models.list()


def test_ready_callback_reaches_the_pool_manager(secured):
    deadline = time.time() + 10
    while not Receiver.received and time.time() < deadline:
        time.sleep(0.1)
    assert Receiver.received[0] == {"worker_id": "w-7", "model": NAME, "backend": "numpy",
                                    "url": secured.url, "context_size": 4096}


@pytest.mark.slow
def test_generation_thread_runs_numba_with_the_threads_asked_for():
    import numba
    from starlette.testclient import TestClient

    from refllama.serve import Worker, create_app, parse_args

    w = Worker(parse_args(["-t", "1", "--backend", "numba", "-c", "64"]))
    with TestClient(create_app(w)) as client:  # runs the app's startup, which starts loading
        deadline = time.time() + 60
        while client.get("/health").json()["status"] == "loading" and time.time() < deadline:
            time.sleep(0.1)
        assert w.status == "ready"
        assert w.executor.submit(numba.get_num_threads).result() == 1  # numba's default here: every core


@pytest.mark.slow  # a server of its own, loading slowly
def test_health_is_503_while_loading_and_200_once_ready(monkeypatch):
    from starlette.testclient import TestClient

    from refllama import api
    from refllama.serve import Worker, create_app, parse_args

    go, real_load = threading.Event(), api.load

    def slow_load(*args, **kwargs):
        go.wait(30)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(api, "load", slow_load)
    w = Worker(parse_args(["-t", "1", "-c", "64"]))
    with TestClient(create_app(w)) as client:
        r = client.get("/health")
        assert (r.status_code, r.json()["status"]) == (503, "loading")
        go.set()
        deadline = time.time() + 60
        while w.status == "loading" and time.time() < deadline:
            time.sleep(0.05)
        r = client.get("/health")
        assert (r.status_code, r.json()["status"]) == (200, "ready")


def test_a_model_that_fails_to_load_ends_the_server_with_status_1_and_the_reason():
    r = subprocess.run([sys.executable, "-m", "refllama.serve", "-m", "nope.gguf", "--port", str(free_port())],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert "refllama-server: error: nope.gguf: no such model file" in r.stderr.splitlines()


def test_stay_up_keeps_answering_health_with_503_and_the_error(tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "refllama.serve", "-m", "nope.gguf", "--port", str(port),
                             "--stay-up"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, r = time.time() + 60, None
        while time.time() < deadline:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
                if r.json()["status"] == "failed":
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, "the server ended despite --stay-up"
            time.sleep(0.2)
        assert r is not None and r.status_code == 503 and "nope.gguf: no such model file" in r.json()["error"]
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_unexpected_loading_error_is_reported_not_left_loading(monkeypatch):
    from refllama import api
    from refllama.serve import Worker, parse_args

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(api, "load", broken)
    w = Worker(parse_args(["-t", "1"]))
    w.executor.submit(w.load).result()
    assert (w.status, w.load_error) == ("failed", "RuntimeError: boom")


def test_non_loopback_bind_without_key_is_refused():
    r = subprocess.run([sys.executable, "-m", "refllama.serve", "--host", "0.0.0.0", "--port", str(free_port())],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "without --api-key" in r.stderr
