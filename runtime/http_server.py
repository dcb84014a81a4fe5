"""The OpenAI-compatible HTTP server: Starlette routes over one `EngineLoop`, so concurrent
requests join the engine's continuous batch. A refused request gets a 4xx with an OpenAI
error body; a client that goes away has its slot freed; nothing one client does stops the
others."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import secrets
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandwich.errors import SandwichError
from sandwich.runtime import openai_api as api
from sandwich.runtime.engine import Request, Result
from sandwich.runtime.engine_loop import EngineLoop, Job
from sandwich.runtime.logprobs import TokenLogprob
from sandwich.runtime.openai_api import ApiError, GenParams
from sandwich.runtime.server_metrics import ServerMetrics
from sandwich.runtime.structured import Grammars
from sandwich.runtime.text_stream import TextStream
from sandwich.runtime.tokenizer import TextTokenizer
from sandwich.runtime.tool_calls import CallDelta, ReplyStream

log = logging.getLogger("sandwichc.server")
DRAIN_LIMIT = 64 << 20  # an oversized body is read (and dropped) up to this, then cut off
# the field an engine refusal is about, by how its message starts
ENGINE_PARAMS = {"logit_bias": "logit_bias", "min_tokens": "min_tokens",
                 "stop token id": "stop_token_ids", "a structured reply": "response_format"}


@dataclass(frozen=True)
class ServerSettings:
    model_name: str  # what /v1/models lists and requests must name
    max_body_bytes: int = 1 << 20
    api_key: str | None = None  # /v1/ routes then need `Authorization: Bearer <key>`


@dataclass(frozen=True)
class Outcome:
    finish: str  # "stop" or "length", as OpenAI reports them ("tool_calls": a streamed choice's calls)
    completion_tokens: int


@dataclass(frozen=True)
class Piece:
    """Text for the client, and the log-probabilities of the tokens that made it (when the
    request asks for them; a token whose text is held back, an unfinished character or a
    possible stop string, travels with the next piece); `offset`: where the text starts in
    the reply."""

    text: str
    logprobs: tuple[TokenLogprob, ...] = ()
    offset: int = 0


@dataclass(frozen=True)
class CallPieces:
    """Pieces of a streamed choice's tool calls (starts, argument text), and the logprobs of
    the tokens that made them (a logprobs body, or None)."""

    deltas: tuple[CallDelta, ...]
    logprobs: dict | None = None


class OpenAIServer:
    """Builds the Starlette app; the engine loop must be running before requests arrive."""

    def __init__(self, loop: EngineLoop, tokenizer: TextTokenizer, settings: ServerSettings) -> None:
        self.loop, self.tok, self.settings = loop, tokenizer, settings
        eng = loop.engine
        if eng.grammars is None:  # structured replies (response_format) over this tokenizer
            eng.grammars = Grammars.of(tokenizer, eng.vocab_size or tokenizer.backend.get_vocab_size())
        self.created = int(time.time())
        self.metrics = ServerMetrics(loop.engine)

    def app(self):
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.routing import Route

        from sandwich.runtime.responses_route import ResponsesRoute

        responses = ResponsesRoute(self)

        routes = [Route("/health", self.health, methods=["GET"]),
                  Route("/metrics", self.prometheus, methods=["GET"]),
                  Route("/v1/models", self.models, methods=["GET"]),
                  Route("/v1/models/{model:path}", self.model, methods=["GET"]),
                  Route("/v1/completions", self.completions, methods=["POST"]),
                  Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                  Route("/v1/responses", responses.handle, methods=["POST"]),
                  Route("/v1/responses/{rid}", responses.retrieve, methods=["GET"]),
                  Route("/v1/responses/{rid}", responses.delete, methods=["DELETE"]),
                  Route("/tokenize", self.tokenize, methods=["POST"]),
                  Route("/detokenize", self.detokenize, methods=["POST"])]
        app = Starlette(routes=routes, exception_handlers={
            ApiError: self._api_error, HTTPException: _http_error, Exception: _internal_error})
        key = self.settings.api_key
        return app if not key else _KeyCheck(app, key, self.metrics)

    # -- routes ----------------------------------------------------------------------------
    async def health(self, request):
        from starlette.responses import JSONResponse

        if not self.loop.alive:
            return JSONResponse({"status": "error", "message": "the engine has stopped"}, 503)
        return JSONResponse({"status": "ok", "in_flight": self.loop.in_flight})

    async def prometheus(self, request):
        """Prometheus' text format (runtime/server_metrics.py)."""
        from prometheus_client import CONTENT_TYPE_LATEST
        from starlette.responses import Response

        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def _api_error(self, request, exc: ApiError):
        from starlette.responses import JSONResponse

        if exc.status != 499:  # a client that left: its choices count as cancelled
            self.metrics.errors.labels(str(exc.status)).inc()
        return JSONResponse(exc.body(), status_code=exc.status)

    async def models(self, request):
        from starlette.responses import JSONResponse

        return JSONResponse(api.models_list(self.settings.model_name, self.created))

    async def model(self, request):
        """OpenAI's model retrieval: this server's one model, or a 404 naming it."""
        from starlette.responses import JSONResponse

        name = request.path_params["model"]
        if name != self.settings.model_name:
            raise self._unknown_model(name, status=404)
        return JSONResponse(api.model_card(name, self.created))

    def _unknown_model(self, name: str, *, status: int) -> ApiError:
        return ApiError(f"model {name!r} is not served here; this server serves "
                        f"{self.settings.model_name!r} (GET /v1/models)", param="model",
                        code="model_not_found", status=status,
                        kind="not_found_error" if status == 404 else "invalid_request_error")

    async def tokenize(self, request):
        """vLLM's token count: the ids of a prompt, or of chat messages as the template
        renders them (as the chat API would prefill them)."""
        from starlette.concurrency import run_in_threadpool
        from starlette.responses import JSONResponse

        t = api.parse_tokenize(await self.read_body(request))
        self.check_model(t.model)

        def ids() -> list[int]:
            try:
                if t.messages is not None:
                    return self.tok.encode(self.tok.render_chat(
                        list(t.messages), add_generation_prompt=t.add_generation_prompt))
                return self.tok.encode(t.prompt or "", add_bos=None if t.add_special_tokens else False)
            except SandwichError as e:
                raise ApiError(str(e), param="messages" if t.messages is not None else "prompt") from None
        out = await run_in_threadpool(ids)
        return JSONResponse({"count": len(out), "max_model_len": self.loop.engine.max_seq, "tokens": out})

    async def detokenize(self, request):
        from starlette.responses import JSONResponse

        eng = self.loop.engine
        model, ids = api.parse_detokenize(await self.read_body(request),
                                          eng.vocab_size or self.tok.backend.get_vocab_size())
        self.check_model(model)
        return JSONResponse({"prompt": self.tok.decode(ids)})

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.settings.model_name:
            raise self._unknown_model(name, status=400)

    async def completions(self, request):
        return await self._serve(request, api.parse_completion(await self.read_body(request)))

    async def chat_completions(self, request):
        return await self._serve(request, api.parse_chat(await self.read_body(request)))

    # -- one request -----------------------------------------------------------------------
    async def _serve(self, request, p: GenParams):
        from starlette.responses import JSONResponse, StreamingResponse

        arrival = time.perf_counter()
        reqs = await self.requests_of(p)
        rid, model = api.new_id(p.chat), self.settings.model_name
        if p.stream:
            return StreamingResponse(self._events(p, reqs, rid, arrival), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        done = await until_done(request, _every([self.collect(r, p, arrival) for r in reqs]))
        if done is None:
            return JSONResponse(ApiError("client closed the request", status=499).body(), 499)
        choices = [self.choice(p, *x) for x in done]
        return JSONResponse(api.response(p, rid, model, choices,
                                         _usage(p, reqs, [out.completion_tokens for _, out, _, _ in done])))

    async def requests_of(self, p: GenParams) -> list[Request]:
        """The engine requests of a checked body (see `_requests`), once the model and the
        engine are checked."""
        from starlette.concurrency import run_in_threadpool

        self.check_model(p.model)
        if not self.loop.alive:
            raise ApiError("the engine has stopped; restart the server", status=503,
                           kind="server_error")
        return await run_in_threadpool(self._requests, p)  # tokenizing long prompts takes a while

    def choice(self, p: GenParams, text: str, out: Outcome, lps: list, offsets: list[int]) -> api.Choice:
        return api.Choice.of(p, text, out.finish, api.logprobs_body(p, lps, self.tok.token_bytes, offsets))

    def _echo(self, req: Request) -> tuple[str, list[int]]:
        """The prompt as its tokens decode, and where each token's text starts in it."""
        step, text, offsets = self.tok.stream(), "", []
        for t in req.prompt:
            offsets.append(len(text))
            text += step(t)
        return self.tok.decode(req.prompt), offsets

    def _requests(self, p: GenParams) -> list[Request]:
        """The engine requests of a checked body, one per choice: prompt by prompt, `n` of
        each (choice j seeded seed + j, so the choices differ and a seeded request repeats).
        Each prompt is tokenized, max_tokens defaults to the rest of the context, and every
        reason the engine would refuse a prompt is raised as a 400."""
        eng = self.loop.engine
        msgs = list(p.messages or ()) if p.tools is None else p.tools.messages(p.messages or ())
        try:  # a template that refuses the conversation (roles that do not alternate) is the client's
            prompts = p.prompts if not p.chat else (self.tok.render_chat(msgs),)
        except SandwichError as e:
            raise ApiError(str(e), param="messages") from None
        stop = set(p.stop_token_ids) | (set() if p.ignore_eos else set(self.tok.stop_ids))
        out = []
        for x in prompts:
            try:
                ids = list(x) if isinstance(x, tuple) else self.tok.encode(x)
            except SandwichError as e:
                raise ApiError(str(e), param="messages" if p.chat else "prompt") from None
            new = p.max_tokens if p.max_tokens is not None else max(1, eng.max_seq - len(ids) + 1)
            seed = secrets.randbits(63) if p.seed is None else p.seed
            # echo with max_tokens 0 (scoring a text): one token is sampled and dropped
            first = Request(prompt=tuple(ids), max_new_tokens=max(1, new), temperature=p.temperature,
                            top_k=p.top_k, top_p=p.top_p, stop=tuple(sorted(stop)),
                            seed=seed, logprobs=p.logprobs,
                            prompt_logprobs=p.logprobs if p.echo else None,
                            presence_penalty=p.presence_penalty, frequency_penalty=p.frequency_penalty,
                            repetition_penalty=p.repetition_penalty, logit_bias=p.logit_bias,
                            min_tokens=p.min_tokens, structure=p.structure)
            why = eng.problem(first) or first.sampling.problem()
            if why:
                ctx = "max_seq" in why
                param = "max_tokens" if ctx else next(
                    (v for k, v in ENGINE_PARAMS.items() if why.startswith(k)), None)
                raise ApiError(why, param=param, code="context_length_exceeded" if ctx else None)
            out += [dataclasses.replace(first, seed=seed + j) for j in range(p.n)]
        return out

    async def generate(self, req: Request, p: GenParams, arrival: float,
                   prompt_lps: list[TokenLogprob] | None = None) -> AsyncIterator[Piece | Outcome]:
        """Text pieces as the engine samples tokens, then the Outcome. Leaving early (a stop
        string, a cancelled task, a closed stream) cancels the job and frees its slot. The
        token that ends the turn (a stop id) has no text and no logprobs entry, as OpenAI's.
        The prompt's logprobs, when asked, land in `prompt_lps` as soon as it is prefilled.
        However it ends, the choice is counted in the server's metrics (`arrival`: when the
        request reached the server)."""
        aio = asyncio.get_running_loop()
        q: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        job = self.loop.submit(Job(
            req, on_token=lambda t, lp: aio.call_soon_threadsafe(q.put_nowait, ("token", (t, lp))),
            on_done=lambda r: aio.call_soon_threadsafe(q.put_nowait, ("done", r)),
            on_prompt=lambda lps: aio.call_soon_threadsafe(q.put_nowait, ("prompt", lps))))
        text, n, finished = TextStream(self.tok.stream(), p.stop, self.tok.decode), 0, False
        sent, held = 0, []  # characters sent so far; logprobs of tokens whose text is not out yet
        outcome, first = "cancelled", None  # until it ends otherwise; when the first token came

        def piece(delta: str) -> Piece:
            nonlocal sent
            out = Piece(delta, tuple(held), sent)
            sent += len(delta)
            held.clear()
            return out
        try:
            while True:
                kind, x = await q.get()
                if kind == "prompt":
                    if prompt_lps is not None:
                        prompt_lps.extend(x)
                    continue
                if kind == "token":
                    token, lp = x
                    n += 1
                    first = first or time.perf_counter()
                    if lp is not None and token not in req.stop:
                        held.append(lp)
                    delta = text.push(token)
                    if delta:
                        yield piece(delta)
                    if text.stopped:
                        outcome = "stop"
                        if held:
                            yield piece("")
                        yield Outcome("stop", n)
                        return
                    continue
                res: Result = x
                finished = True
                if res.error:
                    outcome = "error"
                    raise ApiError(f"generation failed: {res.error}", status=500, kind="server_error")
                outcome = "stop" if res.finish == "stop" else "length"
                rest = text.flush()
                if rest or held:
                    yield piece(rest)
                yield Outcome(outcome, n)
                return
        finally:
            if not finished:
                self.loop.cancel(job)
            self.metrics.served("chat" if p.chat else "completions", outcome, prompt=len(req.prompt),
                                tokens=n, arrival=arrival, first=first, last=time.perf_counter())

    async def tool_stream(self, req: Request, p: GenParams, arrival: float
                           ) -> AsyncIterator[Piece | CallPieces | api.Choice | Outcome]:
        """A choice that may call tools, streamed: once its JSON shows it answers, the
        answer's text as it comes; once it shows it calls, each call's start and its
        arguments' text as they come (CallPieces), and at the end every call (a Choice;
        finish 'tool_calls'); a reply cut before either shows, as its raw text."""
        reply, lps = ReplyStream(p.tools), []  # type: ignore[arg-type]
        async for x in self.generate(req, p, arrival):
            if isinstance(x, Piece):
                lps.extend(x.logprobs)
                text, deltas = reply.push(x.text)
                if text:
                    yield Piece(text, tuple(lps))
                    lps.clear()
                elif deltas:
                    yield CallPieces(tuple(deltas), self._logprobs(p, lps))
                    lps.clear()
                continue
            content, calls = reply.end()
            if calls:
                yield api.Choice(None, "tool_calls", self._logprobs(p, lps), calls)
                yield Outcome("tool_calls", x.completion_tokens)
                return
            if reply.mode != "answer" and content:  # neither shown: the raw text
                yield Piece(content, tuple(lps))
            elif lps:
                yield Piece("", tuple(lps))
            yield x
            return

    def _logprobs(self, p: GenParams, lps: list[TokenLogprob]) -> dict | None:
        return api.logprobs_body(p, lps, self.tok.token_bytes, [0] * len(lps)) if lps else None

    async def collect(self, req: Request, p: GenParams, arrival: float
                       ) -> tuple[str, Outcome, list[TokenLogprob | int], list[int]]:
        """The whole reply: text, outcome, and each token's logprobs with its text offset.
        With echo the prompt comes first (its first token a bare id: nothing scores it), and
        with max_tokens 0 nothing else."""
        parts: list[str] = []
        out = Outcome("length", 0)
        lps: list[TokenLogprob | int] = []
        offsets: list[int] = []
        prompt_lps: list[TokenLogprob] = []
        async for x in self.generate(req, p, arrival, prompt_lps):  # to the end: its cleanup runs now
            if isinstance(x, Outcome):
                out = x
            else:
                parts.append(x.text)
                lps.extend(x.logprobs)
                offsets.extend([x.offset] * len(x.logprobs))
        text = "".join(parts)
        if p.max_tokens == 0:
            text, out, lps, offsets = "", Outcome("length", 0), [], []
        if p.echo:
            echo, starts = self._echo(req)
            if p.logprobs is not None:
                lps = [req.prompt[0], *prompt_lps, *lps]
                offsets = [*starts, *(len(echo) + o for o in offsets)]
            text = echo + text
        return text, out, lps, offsets

    async def _events(self, p: GenParams, reqs: list[Request], rid: str,
                      arrival: float) -> AsyncIterator[str]:
        """Server-sent events: each choice's text deltas and finish reason as they come (the
        choices interleave, each chunk naming its index), then the usage if asked, [DONE]. A
        reply that may call tools streams its answer's text, or its calls as they come (any
        call whose start was not streamed comes whole at the end)."""
        model = self.settings.model_name
        for i, req in enumerate(reqs):
            if p.chat:
                yield _sse(api.chunk(p, rid, model, None, first=True, index=i))
            if p.echo:  # without logprobs (parse_completion refuses streaming both)
                yield _sse(api.chunk(p, rid, model, self.tok.decode(req.prompt), index=i))
        used, streamed = [0] * len(reqs), [0] * len(reqs)  # tokens; calls started, per choice
        try:
            sources = [self.tool_stream(r, p, arrival) if p.tools is not None else
                       self.generate(r, p, arrival) if p.max_tokens != 0 else _nothing() for r in reqs]
            async for i, x in _merged(sources):
                if isinstance(x, Outcome):
                    used[i] = x.completion_tokens
                    yield _sse(api.chunk(p, rid, model, None, x.finish, index=i))
                elif isinstance(x, CallPieces):
                    streamed[i] += sum(d.id is not None for d in x.deltas)
                    yield _sse(api.tool_chunk(p, rid, model, [d.body() for d in x.deltas],
                                              x.logprobs, i))
                elif isinstance(x, api.Choice):  # the calls not streamed, and the last logprobs
                    rest = [t.body(j) for j, t in enumerate(x.tool_calls) if j >= streamed[i]]
                    if rest or x.logprobs:
                        yield _sse(api.tool_chunk(p, rid, model, rest, x.logprobs, i))
                else:
                    lps = api.logprobs_body(p, x.logprobs, self.tok.token_bytes,
                                            [x.offset] * len(x.logprobs))
                    yield _sse(api.chunk(p, rid, model, x.text, logprobs=lps, index=i))
            if p.include_usage:
                yield _sse(api.chunk(p, rid, model, None, use=_usage(p, reqs, used)))
        except ApiError as e:  # the headers are gone: the error travels as an event
            yield _sse(e.body())
        yield "data: [DONE]\n\n"

    async def read_body(self, request) -> Any:
        """The JSON body, refused (after draining it) when larger than max_body_bytes."""
        limit = self.settings.max_body_bytes
        declared = request.headers.get("content-length")
        size, parts = 0, []
        async for part in request.stream():
            size += len(part)
            if size <= limit:
                parts.append(part)
            elif size > DRAIN_LIMIT:
                break
        if size > limit or (declared and declared.isdigit() and int(declared) > limit):
            raise ApiError(f"request body of {max(size, int(declared or 0))} bytes is larger than "
                           f"the server's limit of {limit} bytes", code="request_too_large")
        try:
            return json.loads(b"".join(parts))
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(f"the request body is not valid JSON: {e}") from None


def _usage(p: GenParams, reqs: list[Request], completion: list[int]) -> dict[str, int]:
    """Each prompt's tokens once (its n choices share it), and every choice's reply tokens."""
    return api.usage(sum(len(r.prompt) for r in reqs[::p.n]), sum(completion))


async def _every(coros: list) -> list:
    """Every coroutine's result, in order; when one fails or the caller is cancelled, the
    others are cancelled too (their jobs leave the engine)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()


async def _merged(gens: list[AsyncIterator]) -> AsyncIterator[tuple[int, Any]]:
    """The items of several async generators as they come, each as (its generator's index,
    item). An error in one is raised here; leaving early closes them all."""
    q: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    end = object()

    async def pump(i: int, g: AsyncIterator) -> None:
        try:
            async for x in g:
                q.put_nowait((i, x))
            q.put_nowait((i, end))
        except Exception as e:  # noqa: BLE001  (handed to the consumer, which raises it)
            q.put_nowait((i, e))

    tasks = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(gens)]
    try:
        left = len(tasks)
        while left:
            i, x = await q.get()
            if x is end:
                left -= 1
            elif isinstance(x, Exception):
                raise x
            else:
                yield i, x
    finally:
        for t in tasks:
            t.cancel()


class _KeyCheck:
    """ASGI: the /v1/ routes answer only a request that carries `Authorization: Bearer <key>`
    (as vLLM's and llama.cpp's --api-key); the routes outside /v1/ (health, metrics,
    tokenize) stay open, as vLLM's do."""

    def __init__(self, app, key: str, metrics: ServerMetrics) -> None:
        self.app, self.key, self.metrics = app, f"Bearer {key}".encode(), metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not secrets.compare_digest(given, self.key):
                from starlette.responses import JSONResponse

                self.metrics.errors.labels("401").inc()
                err = ApiError("missing or wrong API key: send 'Authorization: Bearer <key>'",
                               status=401, kind="authentication_error", code="invalid_api_key")
                await JSONResponse(err.body(), 401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _nothing() -> AsyncIterator[Outcome]:
    """What an echo with max_tokens 0 streams after the prompt: the end, no tokens."""
    yield Outcome("length", 0)


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def until_done(request, work) -> Any:
    """`work`'s result, or None when the client leaves first (cancelling the work frees its
    slots)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnect(request))
    await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    if not task.done():
        task.cancel()
        return None
    gone.cancel()
    return task.result()


async def _disconnect(request) -> None:
    """Returns when the client closes the connection (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _http_error(request, exc):
    from starlette.responses import JSONResponse

    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return JSONResponse(ApiError(f"{request.method} {request.url.path}: {exc.detail}",
                                 status=exc.status_code, kind=kind).body(), exc.status_code)


async def _internal_error(request, exc: Exception):
    from starlette.responses import JSONResponse

    log.exception("request failed", exc_info=exc)
    return JSONResponse(ApiError(f"internal error: {type(exc).__name__}: {exc}", status=500,
                                 kind="server_error").body(), 500)


def served_name(model: str) -> str:
    """`smollm2` stays `smollm2`; a path becomes its file or directory name."""
    p = Path(model)
    return p.stem if p.suffix == ".gguf" else (p.name or model)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0 picks a free one), bound before the server starts so the
    caller knows the port."""
    try:
        sock = socket.create_server((host, port), reuse_port=False)
    except (OSError, OverflowError) as e:  # OverflowError: a port outside 0-65535
        raise SandwichError(f"cannot listen on {host}:{port}: "
                            f"{getattr(e, 'strerror', None) or e}") from None
    return sock


def make_uvicorn(app, *, log_level: str = "warning"):
    """A uvicorn server for `app`; run it with `server.run(sockets=[bind(...)])`."""
    import uvicorn

    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5,
                            lifespan="off", access_log=log_level in ("info", "debug"))
    return uvicorn.Server(config)
