"""An OpenAI-compatible HTTP worker: streamed completions, health, and a ready callback to a pool manager.

    python -m refllama.serve -m MODEL --host 127.0.0.1 --port 8080 [--api-key KEY]

Starlette + uvicorn serve `GET /health`, `GET /v1/models`, `POST /v1/completions` and
`POST /v1/chat/completions`. The model is not thread-safe, so one generation runs at a time on a worker
thread, off the event loop; up to --max-queue requests wait their turn and the rest get 503 + Retry-After.
Chat templates render in a sandboxed process and prompts are tokenized on other threads, so no request can stall
the event loop. A client that disconnects cancels its generation, streamed or not, at the next token (or the next
prefill chunk). Every error is answered in OpenAI's shape, 404, 405, 413 and malformed HTTP included; a client that
sends its request or reads its response too slowly is disconnected; SIGTERM ends the server within seconds.
"""

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import sys
import threading
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from .cli import add_gpu_layers, gpu_layers, parser
from .errors import RefllamaError
from .formats.safety import parse_json
from .xp import BACKENDS, NUMERICS, threads_notice

log = logging.getLogger("refllama.serve")
SHUTDOWN_S = 2  # after SIGTERM, how long open requests get before they are cancelled


class APIError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status, message, param=None, code=None, kind="invalid_request_error", headers=None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self):
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self):
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def field(body, name, kinds, default=None, check=None, why=""):
    """body[name] if present and of `kinds` (and passing `check`), else default; 400 naming the field."""
    if name not in body or body[name] is None:
        return default
    value = body[name]
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise APIError(400, f"'{name}' must be {why or ' or '.join(k.__name__ for k in kinds)}", param=name)
    if check is not None and not check(value):
        raise APIError(400, f"'{name}' must be {why}", param=name)
    return value


class Worker:
    """The model, its one generation thread, and the bounded queue in front of it."""

    def __init__(self, args):
        self.args = args
        self.model, self.status, self.load_error = None, "loading", None
        self.exit_code, self.on_failed = 0, None  # main() sets on_failed: end the server (unless --stay-up)
        from .api import DEFAULT_MODEL

        self.name = Path(args.model or DEFAULT_MODEL[1]).stem  # the file or directory name, without .gguf
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="generate")
        self.admitted = 0  # requests running or waiting; touched only on the event loop
        self.busy = False
        self.running = set()  # the cancel events of started and queued generations

    def load(self):
        """Load the model; runs on the generation thread, as Numba's thread count is set per thread."""
        from . import api
        from .xp import set_threads

        try:
            set_threads(self.args.threads, self.args.backend)
            self.model = api.load(self.args.model, backend=self.args.backend, n_ctx=self.args.ctx_size,
                                  numerics=self.args.numerics)
            self.status = "ready"
            log.info("model %s ready (%s, context %d)", self.name, self.args.backend, self.model.n_ctx)
            if notice := api.past_training(self.model):
                log.warning("%s", notice)
            if self.args.callback_url:
                threading.Thread(target=self.callback, daemon=True).start()
        except RefllamaError as e:
            self.failed(str(e))
        except Exception as e:  # a bug, not bad input: keep the traceback
            log.exception("loading failed")
            self.failed(f"{type(e).__name__}: {e}")

    def failed(self, why):
        """A failed load: the server ends with exit status 1 and the reason on one line, or with --stay-up keeps
        answering /health with 503 and the reason (for a pool manager that asks it why)."""
        self.status, self.load_error = "failed", why
        if self.args.stay_up:
            log.error("loading failed (--stay-up: serving /health with the error): %s", why)
            return
        print(f"refllama-server: error: {why}", file=sys.stderr)
        self.exit_code = 1
        if self.on_failed is not None:
            self.on_failed()

    def callback(self):
        """The pool manager's handshake: POST who we are once ready, retried with backoff, never fatal."""
        a = self.args
        body = json.dumps({"worker_id": a.worker_id, "model": self.name, "backend": a.backend,
                           "url": f"http://{a.host}:{a.port}", "context_size": self.model.n_ctx}).encode()
        delay = 0.5
        for attempt in range(1, 7):
            try:
                req = urllib.request.Request(a.callback_url, data=body, headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=5) as r:
                    log.info("ready callback to %s answered %d", a.callback_url, r.status)
                    return
            except Exception as e:  # any network failure: log, wait, retry
                log.warning("ready callback to %s failed (attempt %d): %s", a.callback_url, attempt, e)
                time.sleep(delay)
                delay *= 2
        log.error("ready callback to %s gave up; serving anyway", a.callback_url)

    def admit(self):
        if self.status != "ready":
            raise APIError(503, f"model is {self.status}", code="model_not_ready", kind="server_error",
                           headers={"Retry-After": "2"})
        if self.admitted >= self.args.max_queue + 1:
            raise APIError(503, "server busy: the queue is full, retry later", code="queue_full",
                           kind="server_error", headers={"Retry-After": "1"})
        self.admitted += 1

    def release(self):
        self.admitted -= 1

    def start(self, job):
        """Run job(cancel) on the generation thread (awaitable); `cancel` is a threading.Event that stops it at the
        next token or prefill chunk, set by a client's disconnect or by shutdown. The queue place is released when
        the job ends, however it ends."""
        cancel = threading.Event()
        if self.status == "stopping":
            cancel.set()
        self.running.add(cancel)
        future = asyncio.get_running_loop().run_in_executor(self.executor, self._guarded, job, cancel)

        def finished(_):
            self.running.discard(cancel)
            self.release()

        future.add_done_callback(finished)
        return future, cancel

    def _guarded(self, job, cancel):
        self.busy = True
        try:
            return job(cancel)
        finally:
            self.busy = False

    def stop(self):
        """Shutting down: every generation stops at its next token, queued ones do not start."""
        self.status = "stopping"
        for cancel in list(self.running):
            cancel.set()


def sampling(body, m):
    """Model.generate keyword arguments from an OpenAI request (OpenAI's defaults where it has them)."""
    max_tokens = field(body, "max_completion_tokens", (int,)) or field(body, "max_tokens", (int,), 256)
    if max_tokens <= 0:
        raise APIError(400, "'max_tokens' must be at least 1", param="max_tokens")
    if max_tokens > m.n_ctx:
        raise APIError(400, f"'max_tokens' {max_tokens} exceeds the context size {m.n_ctx}", param="max_tokens")
    stop = field(body, "stop", (str, list), [])
    stop = [stop] if isinstance(stop, str) else stop
    if len(stop) > 4 or not all(isinstance(s, str) for s in stop):
        raise APIError(400, "'stop' must be a string or a list of up to 4 strings", param="stop")
    num = (int, float)
    return dict(
        max_tokens=max_tokens, stop=stop,
        temperature=float(field(body, "temperature", num, 1.0, lambda v: 0 <= v <= 2, "a number from 0 to 2")),
        top_p=float(field(body, "top_p", num, 1.0, lambda v: 0 < v <= 1, "a number in (0, 1]")),
        top_k=field(body, "top_k", (int,), 0, lambda v: v >= 0, "a non-negative integer"),
        min_p=float(field(body, "min_p", num, 0.0, lambda v: 0 <= v <= 1, "in [0, 1]")),
        repeat_penalty=float(field(body, "repeat_penalty", num, 1.0, lambda v: v > 0, "a positive number")),
        frequency_penalty=float(field(body, "frequency_penalty", num, 0.0, lambda v: -2 <= v <= 2, "from -2 to 2")),
        presence_penalty=float(field(body, "presence_penalty", num, 0.0, lambda v: -2 <= v <= 2, "from -2 to 2")),
        seed=field(body, "seed", (int,), None, lambda v: 0 <= v < 2 ** 64, "an integer from 0 to 2^64 - 1"),
    )


UNSUPPORTED = {  # request fields refllama cannot honour: refused unless they ask for nothing (OpenAI's default)
    "tools": (lambda v: v == [], "tool calls are not supported"),
    "tool_choice": (lambda v: v == "none", "tool calls are not supported"),
    "functions": (lambda v: v == [], "function calls are not supported"),
    "function_call": (lambda v: v == "none", "function calls are not supported"),
    "response_format": (lambda v: v == {"type": "text"}, "only plain text output ({'type': 'text'}) is supported"),
    "logit_bias": (lambda v: v == {}, "logit_bias is not supported"),
    "n": (lambda v: v == 1, "only n=1 is supported"),
    "logprobs": (lambda v: v is False or v == 0, "logprobs are not supported"),
    "top_logprobs": (lambda v: v == 0, "logprobs are not supported"),
    "echo": (lambda v: v is False, "echo is not supported"),
    "suffix": (lambda v: v == "", "suffix (insertion) is not supported"),
    "best_of": (lambda v: v == 1, "only best_of=1 is supported"),
}


def refuse_unsupported(body):
    """A 400 naming the first field the server would otherwise have to ignore silently."""
    for name, (harmless, why) in UNSUPPORTED.items():
        if body.get(name) is not None and not harmless(body[name]):
            raise APIError(400, f"'{name}': {why}", param=name)


def chat_messages(body):
    messages = field(body, "messages", (list,))
    if not messages:
        raise APIError(400, "'messages' must be a non-empty list", param="messages")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise APIError(400, f"messages[{i}] must be an object with a string 'role'", param="messages")
        content = msg.get("content")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise APIError(400, f"messages[{i}].content: only text parts are supported", param="messages")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise APIError(400, f"messages[{i}].content must be a string", param="messages")
        out.append({"role": msg["role"], "content": content})
    return out


async def read_json(request):
    """The request body as a JSON object (formats.safety's limits on depth, numbers and text), its size bounded by
    --max-body and its arrival by --client-timeout; 400, 408 or 413 otherwise."""
    limit, timeout = request.app.state.worker.args.max_body, request.app.state.worker.args.client_timeout
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > limit:
        raise APIError(413, f"request body over {limit} bytes")

    async def body():
        raw = b""
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > limit:
                raise APIError(413, f"request body over {limit} bytes")
        return raw

    try:
        raw = await asyncio.wait_for(body(), timeout)
    except asyncio.TimeoutError:
        raise APIError(408, f"request body not received within {timeout:g} s") from None
    try:
        return parse_json(raw, "request body")
    except RefllamaError as e:
        raise APIError(400, str(e)) from None


def authorize(request):
    """With --api-key, `Authorization: Bearer KEY` compared in constant time; 401 otherwise."""
    key = request.app.state.worker.args.api_key
    if key is None:
        return
    given = request.headers.get("authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
        raise APIError(401, "invalid or missing API key (Authorization: Bearer ...)", code="invalid_api_key",
                       kind="authentication_error")


def check_model(body, worker):
    name = field(body, "model", (str,))
    if name is not None and name != worker.name:
        raise APIError(404, f"model '{name}' does not exist; this server serves '{worker.name}'",
                       param="model", code="model_not_found")


async def health(request):
    """200 once the model is ready, 503 while it loads, after a failed load and while stopping (as llama-server);
    the body says which."""
    worker = request.app.state.worker
    m = worker.model
    return JSONResponse({"status": worker.status, "model": worker.name, "backend": worker.args.backend,
                         "context_size": m.n_ctx if m else None, "queue_depth": max(worker.admitted - worker.busy, 0),
                         "busy": worker.busy, "error": worker.load_error},
                        status_code=200 if worker.status == "ready" else 503)


async def models(request):
    authorize(request)
    name = request.app.state.worker.name
    return JSONResponse({"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                                     "owned_by": "refllama"}]})


async def completions(request):
    return await generate(request, chat=False)


async def chat_completions(request):
    return await generate(request, chat=True)


def prompt_ids(body, m, chat):
    """The prompt's token ids: the chat template over `messages`, or `prompt` tokenized."""
    if chat:
        return m.chat_tokens(chat_messages(body))
    prompt = field(body, "prompt", (str,))
    if prompt is None:
        raise APIError(400, "'prompt' must be a string", param="prompt")
    return m.tokenize(prompt)


def fit_max_tokens(body, opts, ids, m, chat):
    """max_tokens within the room the prompt leaves: a 400 if asked for more, the room if not given."""
    room = m.n_ctx - len(ids)
    if room < 1:
        raise APIError(400, f"prompt of {len(ids)} tokens does not fit the context size {m.n_ctx}",
                       param="messages" if chat else "prompt", code="context_length_exceeded")
    if "max_tokens" not in body and "max_completion_tokens" not in body:
        opts["max_tokens"] = min(opts["max_tokens"], room)
    elif opts["max_tokens"] > room:
        raise APIError(400, f"prompt ({len(ids)} tokens) + max_tokens ({opts['max_tokens']}) exceeds "
                       f"the context size {m.n_ctx}", param="max_tokens", code="context_length_exceeded")


async def generate(request, chat):
    """A completion or chat completion: validated, admitted to the queue, its prompt rendered and tokenized off the
    event loop, run on the generation thread, answered whole or streamed."""
    worker = request.app.state.worker
    authorize(request)
    body = await read_json(request)
    check_model(body, worker)
    refuse_unsupported(body)
    worker.admit()
    admitted = True  # until a job owns the queue place
    try:
        m = worker.model
        opts = sampling(body, m)
        stream = field(body, "stream", (bool,), False)
        include_usage = stream and bool((field(body, "stream_options", (dict,), {}) or {}).get("include_usage"))
        ids = await asyncio.to_thread(prompt_ids, body, m, chat)
        if not ids:
            raise APIError(400, "the prompt is empty", param="prompt")
        fit_max_tokens(body, opts, ids, m, chat)
        reply = Reply(worker.name, chat, include_usage, len(ids))
        if stream:
            events, cancel = stream_events(worker, m, ids, opts, reply)
            admitted = False
            return EventStream(events, cancel)
        future, cancel = worker.start(lambda cancel: complete(m, ids, opts, cancel))
        admitted = False
        text, finish, n = await until_disconnect(request, future, cancel)
        return JSONResponse(reply.whole(text, finish, n))
    except RefllamaError as e:
        raise APIError(400, str(e)) from None
    finally:
        if admitted:
            worker.release()


async def until_disconnect(request, future, cancel):
    """The result of a generation, cancelled if the client disconnects (or the request is cancelled) first."""
    async def disconnected():
        while (await request.receive())["type"] != "http.disconnect":
            pass

    gone = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({future, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not future.done():
            cancel.set()
            log.info("client disconnected: generation cancelled")  # the tokens so far are dropped
    if not future.done():
        return "", "cancelled", 0  # nobody is there to read it
    return future.result()


class Reply:
    """The OpenAI response bodies of one request: whole, or as stream chunks."""

    def __init__(self, model, chat, include_usage, n_prompt):
        self.model, self.chat, self.include_usage, self.n_prompt = model, chat, include_usage, n_prompt
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())

    def usage(self, n):
        return {"prompt_tokens": self.n_prompt, "completion_tokens": n, "total_tokens": self.n_prompt + n}

    def whole(self, text, finish, n):
        message = {"message": {"role": "assistant", "content": text}} if self.chat else {"text": text, "logprobs": None}
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion", "created": self.created,
                "model": self.model, "choices": [{"index": 0, **message, "finish_reason": finish}],
                "usage": self.usage(n)}

    def event(self, choices, usage=None):
        body = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices}
        if self.include_usage:
            body["usage"] = usage
        return f"data: {json.dumps(body)}\n\n"

    def chunk(self, delta, finish=None):
        choice = {"delta": delta} if self.chat else {"text": delta.get("content", ""), "logprobs": None}
        return self.event([{"index": 0, **choice, "finish_reason": finish}])


def complete(m, ids, opts, cancel):
    """(text, finish_reason, completion tokens) of a whole generation; runs on the generation thread."""
    from .api import stream_text

    gen = m.generate(ids, cancel=cancel, **opts)
    text = "".join(stream_text(m, gen, opts["stop"]))
    return text, gen.finish_reason or "stop", gen.n


class End(NamedTuple):
    """The last item of a stream: how it finished, or the error that ended it."""

    reason: str | None
    error: APIError | None = None


def stream_events(worker, m, ids, opts, reply):
    """(server-sent events, cancel) of a generation started now on the generation thread. A client that goes away
    cancels it at the next token; an error ends the stream with an error event and [DONE], never a hang or a false
    "stop"."""
    from .api import stream_text

    loop = asyncio.get_running_loop()
    pieces, started = asyncio.Queue(), []  # started: the Generation, once made (its `n` counts its tokens)

    def count():
        return started[0].n if started else 0

    def put(item):
        with contextlib.suppress(RuntimeError):  # the loop is closed: the server is gone
            loop.call_soon_threadsafe(pieces.put_nowait, item)

    def produce(cancel):
        end = End(None, APIError(500, "generation ended without a result", kind="server_error"))
        try:
            gen = m.generate(ids, cancel=cancel, **opts)
            started.append(gen)
            for piece in stream_text(m, gen, opts["stop"]):
                put(piece)
            end = End(gen.finish_reason or "stop")
        except RefllamaError as e:
            end = End(None, APIError(400, str(e)))
        except Exception:
            log.exception("generation failed mid-stream")
            end = End(None, APIError(500, "internal error during generation", kind="server_error"))
        finally:
            put(end)

    async def events():
        item = None
        try:
            if reply.chat:
                yield reply.chunk({"role": "assistant", "content": ""})
            while True:
                item = await pieces.get()
                if isinstance(item, End):
                    if item.error is not None:
                        yield f"data: {json.dumps(item.error.body())}\n\n"
                    else:
                        yield reply.chunk({}, item.reason)
                        if reply.include_usage:
                            yield reply.event([], reply.usage(count()))
                    yield "data: [DONE]\n\n"
                    break
                yield reply.chunk({"content": item})
        finally:
            if not isinstance(item, End):
                log.info("client disconnected: generation cancelled after %d tokens", count())

    _, cancel = worker.start(produce)
    return events(), cancel


class EventStream(StreamingResponse):
    """A text/event-stream response that cancels its generation when it ends, however it ends: finished, the client
    gone (even before the first event), or the server shutting down."""

    def __init__(self, events, cancel):
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.cancel = cancel

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.cancel.set()


async def on_error(request, exc):
    return exc.response()


async def on_http(request, exc):
    """Starlette's own errors (404 no such route, 405 wrong method) in OpenAI's shape."""
    return APIError(exc.status_code, exc.detail or "error", kind="invalid_request_error").response()


async def on_unexpected(request, exc):
    log.exception("unexpected error")
    return APIError(500, "internal error", kind="server_error").response()


@contextlib.asynccontextmanager
async def lifespan(app):
    worker = app.state.worker
    worker.executor.submit(worker.load)  # /health answers "loading" meanwhile
    yield
    worker.stop()
    worker.executor.shutdown(wait=False, cancel_futures=True)


ROUTES = [Route("/health", health), Route("/v1/models", models),
          Route("/v1/completions", completions, methods=["POST"]),
          Route("/v1/chat/completions", chat_completions, methods=["POST"])]


def create_app(worker):
    """The Starlette app serving `worker`'s model; the handlers find the worker on `app.state`."""
    app = Starlette(routes=ROUTES, lifespan=lifespan, exception_handlers={APIError: on_error, HTTPException: on_http,
                                                                      Exception: on_unexpected})
    app.state.worker = worker
    return app


def parse_args(argv):
    p = parser("refllama.serve", __doc__)
    p.add_argument("-m", "--model", help="GGUF file or HF directory (default: the installed SmolLM2)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    p.add_argument("--port", type=int, default=8080, help="port (default %(default)s)")
    p.add_argument("--backend", default="numpy", choices=BACKENDS, help="array backend (default %(default)s)")
    add_gpu_layers(p)
    p.add_argument("--numerics", choices=NUMERICS, default="float32",
                   help="float32 (default), or ggml: llama.cpp's CPU arithmetic on a GGUF (8-bit activations, f16 KV)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on every endpoint but /health "
                                     "(default: none; required to listen beyond loopback)")
    p.add_argument("--worker-id", default="refllama-0",
                   help="this worker's id in the ready callback (default %(default)s)")
    p.add_argument("--callback-url", help="POST {worker_id, model, backend, url, context_size} here once ready")
    p.add_argument("--stay-up", action="store_true",
                   help="for a pool manager: after a failed load, keep serving /health (503, with the error) instead "
                        "of exiting with status 1")
    p.add_argument("--max-queue", type=int, default=8,
                   help="requests that may wait behind the running one (default %(default)s)")
    p.add_argument("-c", "--ctx-size", type=int, default=4096,
                   help="context size; 0 = the model's (default %(default)s)")
    p.add_argument("-t", "--threads", type=int, default=None,
                   help="CPU threads (BLAS, or Numba kernels with --backend numba; default: the idle cores, "
                        "followed as other work comes and goes)")
    p.add_argument("--max-body", type=int, default=1 << 20, help="largest request body in bytes (default %(default)s)")
    p.add_argument("--client-timeout", type=float, default=10.0,
                   help="seconds a client may take to send a request, or leave a response unread (default %(default)s)")
    args = p.parse_args(argv)
    gpu_layers(args, p)
    return args


def is_loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(argv=None):
    import uvicorn

    args = parse_args(argv)
    if not is_loopback(args.host) and not args.api_key:
        print(f"refllama-server: error: refusing to listen on {args.host} without --api-key "
              "(anyone on the network could use it); bind 127.0.0.1 or set a key", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    busy = threads_notice(args.threads)
    if busy:
        log.warning(busy)
    worker = Worker(args)
    config = uvicorn.Config(create_app(worker), host=args.host, port=args.port, log_level="info",
                            http=guarded_h11(args.client_timeout), timeout_graceful_shutdown=SHUTDOWN_S)
    server = uvicorn.Server(config)
    exit_on = server.handle_exit

    def handle_exit(sig, frame):  # SIGTERM/SIGINT: generations stop at their next token, then uvicorn shuts down
        worker.stop()
        exit_on(sig, frame)

    server.handle_exit = handle_exit
    worker.on_failed = lambda: setattr(server, "should_exit", True)
    server.run()
    return worker.exit_code


def guarded_h11(timeout):
    """uvicorn's HTTP/1.1 protocol with a deadline on slow clients (a request head not complete, or a response left
    unread, for `timeout` seconds) and its protocol-level 400 in OpenAI's error shape."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11(H11Protocol):
        def connection_made(self, transport):
            super().connection_made(transport)
            self.waiting_since, self.stalled_since = self.loop.time(), None
            self.watchdog = self.loop.call_later(1.0, self.watch)

        def watch(self):
            if self.transport.is_closing():
                return
            now = self.loop.time()
            idle = self.cycle is None or self.cycle.response_complete  # waiting for a request's head
            self.stalled_since = (self.stalled_since or now) if self.flow.write_paused else None
            if (idle and now - self.waiting_since > timeout) or (
                    self.stalled_since is not None and now - self.stalled_since > timeout):
                log.info("closing a connection: the client was too slow")
                self.transport.close()
                return
            self.watchdog = self.loop.call_later(1.0, self.watch)

        def on_response_complete(self):
            self.waiting_since = self.loop.time()
            super().on_response_complete()

        def connection_lost(self, exc):
            self.watchdog.cancel()
            super().connection_lost(exc)

        def send_400_response(self, msg):
            body = json.dumps(APIError(400, f"malformed HTTP request: {msg}").body()).encode()
            headers = [(b"content-type", b"application/json"), (b"connection", b"close"),
                       (b"content-length", str(len(body)).encode())]
            for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=body),
                          h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
            self.transport.close()

    return GuardedH11


if __name__ == "__main__":
    sys.exit(main())
