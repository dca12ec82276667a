"""The server under hostile clients and hostile models: every client input gets a 4xx in OpenAI's shape, streams
always end, abandoned generations free the worker, slow clients and SIGTERM are dealt with in seconds."""

import json
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
from fuzzing import GGUF, request_mutant, request_outcome, rng_for
from test_serve import Server

DATA = Path(__file__).parent / "data"
TINY = DATA / "gguf-llama" / "llama-q8_0.gguf"
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]


def variant(tmp_path, name, template=None, nan=False):
    """The tiny GGUF model with another chat template, or with NaN weights (every logit NaN)."""
    g = GGUF(TINY.read_bytes())
    if template is not None:
        g.kv = [kv for kv in g.kv if kv[0] != "tokenizer.chat_template"] + [["tokenizer.chat_template", 8, template,
                                                                              None]]
    if nan:  # output_norm is float32 and the last tensor: its bytes become NaN
        _, dims, _, off, _ = next(t for t in g.tensors if t[0] == "output_norm.weight")
        data = bytearray(g.data)
        data[off:off + 4 * dims[0]] = b"\x00\x00\xc0\x7f" * dims[0]
        g.data = bytes(data)
    path = tmp_path / f"{name}.gguf"
    g.write(path)
    return str(path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("tiny"), "-m", str(TINY), "-c", "4096", "--client-timeout", "2")
    yield s
    s.stop()


def post(server, path, body, **kw):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(server.url + path, content=content, headers={"Content-Type": "application/json"},
                      timeout=kw.pop("timeout", 30), **kw)


def assert_openai_error(r, status):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], err


@pytest.mark.parametrize("body, fragment", [
    (b'{"messages": ' + b"[" * 5000 + b"]" * 5000 + b"}", "invalid JSON"),
    (b'{"messages": [], "max_tokens": ' + b"9" * 5000 + b"}", "digits"),
    (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "lone surrogate"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', "NaN is not JSON"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e999}', "temperature"),
    (json.dumps({"messages": MSG, "seed": -1}).encode(), "seed"),
    (json.dumps({"messages": MSG, "seed": 2 ** 64}).encode(), "seed"),
    (json.dumps({"messages": MSG, "seed": -1, "stream": True}).encode(), "seed"),
    (json.dumps({"messages": MSG, "top_k": -5}).encode(), "top_k"),
    (json.dumps({"messages": MSG, "frequency_penalty": 1e308 * 10}).encode().replace(b"Infinity", b"1e999"),
     "frequency_penalty"),
])
def test_client_input_never_gets_a_5xx(tiny, body, fragment):
    r = post(tiny, CHAT, body)
    assert_openai_error(r, 400)
    assert fragment in r.json()["error"]["message"]


def test_404_405_and_malformed_http_come_in_openai_shape(tiny):
    assert_openai_error(httpx.get(tiny.url + "/v2/nothing"), 404)
    assert_openai_error(httpx.get(tiny.url + CHAT), 405)
    with socket.create_connection(("127.0.0.1", tiny.port), timeout=5) as s:
        s.sendall(b"GARBAGE / NOT-HTTP\r\n\r\n")
        raw = b""
        while chunk := s.recv(65536):  # the server closes the connection after its 400
            raw += chunk
    head, body = raw.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 400") and b"application/json" in head
    assert json.loads(body)["error"]["message"].startswith("malformed HTTP request")


def test_a_tiny_temperature_streams_to_the_end(tiny):
    body = {"messages": MSG, "stream": True, "temperature": 5e-324, "max_tokens": 8}
    with httpx.stream("POST", tiny.url + CHAT, json=body, timeout=30) as r:
        lines = [x for x in r.iter_lines() if x.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][6:])["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.slow
def test_slow_and_idle_clients_are_disconnected(tiny):
    t = time.perf_counter()
    with socket.create_connection(("127.0.0.1", tiny.port), timeout=15) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # a request head never finished
        assert s.recv(100) == b""  # closed by the server
    assert time.perf_counter() - t < 8  # --client-timeout 2, checked every second
    with socket.create_connection(("127.0.0.1", tiny.port), timeout=15) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{")  # a body never finished
        reply = b""
        while b"}}" not in reply and (chunk := s.recv(65536)):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 408") and b"not received within" in reply


def test_a_model_that_gives_nan_ends_the_stream_with_an_error_event(tmp_path):
    s = Server(tmp_path, "-m", variant(tmp_path, "nan", nan=True), "-c", "256")
    try:
        with httpx.stream("POST", s.url + CHAT, json={"messages": MSG, "stream": True}, timeout=30) as r:
            lines = [x for x in r.iter_lines() if x.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        error = json.loads(lines[-2][6:])["error"]
        assert "NaN or infinite" in error["message"]
        assert not any('"finish_reason": "stop"' in x for x in lines)
        assert_openai_error(post(s, CHAT, {"messages": MSG}), 400)  # not streamed: a 400, not a 500
    finally:
        s.stop()


@pytest.mark.slow
def test_a_looping_template_neither_freezes_the_server_nor_survives_its_time_limit(tmp_path):
    loop = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    s = Server(tmp_path, "-m", variant(tmp_path, "loop", template=loop), "-c", "256")
    try:
        with httpx.Client(timeout=30) as c:
            answer = {}
            t = threading.Thread(target=lambda: answer.update(r=c.post(s.url + CHAT, json={"messages": MSG})))
            t.start()
            time.sleep(0.5)
            t0 = time.perf_counter()
            assert s.health()["status"] == "ready"  # the event loop still answers
            assert time.perf_counter() - t0 < 1
            t.join(20)
        assert_openai_error(answer["r"], 400)
        assert "ran longer than" in answer["r"].json()["error"]["message"]
    finally:
        s.stop()


def wait_idle(server, seconds):
    deadline = time.time() + seconds
    while server.health()["busy"] and time.time() < deadline:
        time.sleep(0.05)
    return not server.health()["busy"]


def test_an_abandoned_non_streamed_generation_frees_the_worker(tiny):
    body = {"prompt": "a " * 100, "max_tokens": 3900, "temperature": 0}  # greedy: it never meets an end token
    for wait in (0.3, 0.6):
        with pytest.raises(httpx.ReadTimeout):
            post(tiny, COMPLETIONS, body, timeout=wait)
        t = time.perf_counter()
        assert wait_idle(tiny, 5)
        assert time.perf_counter() - t < 1.5
    assert "generation cancelled" in tiny.log.read_text()


def test_sigterm_ends_the_server_within_seconds_whatever_it_is_doing(tmp_path):
    s = Server(tmp_path, "-m", str(TINY), "-c", "4096")
    body = {"prompt": "a " * 200, "max_tokens": 3800, "stream": True}
    with httpx.stream("POST", s.url + COMPLETIONS, json=body, timeout=30) as r:
        next(r.iter_lines())
        t = time.perf_counter()
        s.proc.terminate()
        s.proc.wait(timeout=15)
    assert time.perf_counter() - t < 5


@pytest.mark.slow
def test_fuzzed_requests_get_an_answer_or_a_4xx_and_streams_always_end(tiny):
    with httpx.Client(timeout=30) as c:
        for seed in range(150):
            assert request_outcome(c, tiny.url, *request_mutant(rng_for(seed))) in ("answered", "refused")
    h = tiny.health()
    assert h["status"] == "ready" and h["queue_depth"] == 0
