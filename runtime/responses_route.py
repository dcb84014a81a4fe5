"""`POST /v1/responses` on the OpenAI server: the request runs as the chat request it reads
as (runtime/responses_api.py), through the server's own engine path; the reply comes back as
a Response object, or streamed as the Responses API's typed events (created, output items and
their text deltas or function-call arguments, completed or incomplete)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from sandwich.runtime import openai_api as api
from sandwich.runtime import responses_api as rs
from sandwich.runtime.engine import Request
from sandwich.runtime.openai_api import ApiError

if TYPE_CHECKING:
    from sandwich.runtime.http_server import OpenAIServer


class ResponsesRoute:
    """The route, over an OpenAIServer; it keeps the stored responses' conversations."""

    def __init__(self, server: OpenAIServer) -> None:
        self.server, self.store = server, rs.ResponseStore()

    async def handle(self, request):
        from starlette.responses import JSONResponse, StreamingResponse

        from sandwich.runtime.http_server import until_done

        srv = self.server
        arrival = time.perf_counter()
        r = rs.parse_responses(await srv.read_body(request), self.store)
        (req,) = await srv.requests_of(r.params)
        rid, created = rs.new_id("resp"), rs.now()
        if r.params.stream:
            return StreamingResponse(self._events(r, req, rid, created, arrival),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        done = await until_done(request, srv.collect(req, r.params, arrival))
        if done is None:
            return JSONResponse(ApiError("client closed the request", status=499).body(), 499)
        c = srv.choice(r.params, *done)
        return JSONResponse(self._finish(r, req, rid, created, c, rs.output_items(c, rs.new_id("msg")),
                                         done[1].completion_tokens))

    def _finish(self, r: rs.ResponsesRequest, req: Request, rid: str, created: int, c: api.Choice,
                output: list[dict], tokens: int) -> dict:
        """The finished Response; kept, with its conversation for a continuation, unless store
        is false."""
        status = "incomplete" if c.finish == "length" else "completed"
        body = rs.response_body(r, rid, self.server.settings.model_name, created, output,
                                status=status, usage=(len(req.prompt), tokens))
        if r.store:
            self.store.put(rid, [*r.conversation, rs.reply_message(c)], body)
        return body

    async def retrieve(self, request):
        """`GET /v1/responses/{id}`: a stored Response, or a 404."""
        from starlette.responses import JSONResponse

        return JSONResponse(self._stored(request.path_params["rid"]))

    async def delete(self, request):
        """`DELETE /v1/responses/{id}`: forget a stored response (a continuation then fails)."""
        from starlette.responses import JSONResponse

        rid = request.path_params["rid"]
        self._stored(rid)
        self.store.delete(rid)
        return JSONResponse({"id": rid, "object": "response", "deleted": True})

    def _stored(self, rid: str) -> dict:
        body = self.store.body(rid)
        if body is None:
            raise ApiError(f"no stored response {rid!r} (responses are kept in memory, the last "
                           f"{rs.STORE_LIMIT}, unless sent with store: false)", status=404,
                           kind="not_found_error", param="response_id")
        return body

    async def _events(self, r: rs.ResponsesRequest, req: Request, rid: str, created: int,
                      arrival: float) -> AsyncIterator[str]:
        from sandwich.runtime.http_server import CallPieces, Outcome

        srv, p, ev = self.server, r.params, rs.Events()
        model = srv.settings.model_name
        yield ev("response.created", response=rs.response_body(r, rid, model, created, [], status="in_progress"))
        msg_id, text, calls, opened = rs.new_id("msg"), [], (), False
        items: list[str] = []  # the item ids of the calls streamed
        source = srv.tool_stream(req, p, arrival) if p.tools is not None else srv.generate(req, p, arrival)
        where = {"item_id": msg_id, "output_index": 0, "content_index": 0}

        def opening() -> list[str]:  # the message item and its text part, before any text
            return [ev("response.output_item.added", output_index=0, item=rs.message_item(msg_id, None, "in_progress")),
                    ev("response.content_part.added", **where, part={"type": "output_text", "text": "",
                                                                      "annotations": []})]
        try:
            async for x in source:
                if isinstance(x, api.Choice):
                    calls = x.tool_calls
                elif isinstance(x, CallPieces):  # a call's item, then its arguments as they come
                    for d in x.deltas:
                        if d.id is not None:
                            items.append(rs.new_id("fc"))
                            yield ev("response.output_item.added", output_index=d.index, item=rs.function_item(
                                d.id, d.name or "", "", items[-1], "in_progress"))
                        else:
                            yield ev("response.function_call_arguments.delta", item_id=items[d.index],
                                     output_index=d.index, delta=d.arguments)
                elif isinstance(x, Outcome):
                    finish, tokens = x.finish, x.completion_tokens
                elif x.text:
                    if not opened:
                        opened = True
                        for e in opening():
                            yield e
                    text.append(x.text)
                    yield ev("response.output_text.delta", **where, delta=x.text, logprobs=[])
        except ApiError as e:  # the headers are gone: the error travels as an event
            yield ev("error", code=e.code or e.kind, message=e.message, param=e.param)
            return
        c = api.Choice(None if calls else "".join(text), "tool_calls" if calls else finish, None, calls)
        output = rs.output_items(c, msg_id, items)
        if calls:
            for i, item in enumerate(output):
                if i >= len(items):  # not streamed: its item and arguments whole
                    yield ev("response.output_item.added", output_index=i,
                             item={**item, "arguments": "", "status": "in_progress"})
                    yield ev("response.function_call_arguments.delta", item_id=item["id"],
                             output_index=i, delta=item["arguments"])
                yield ev("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                         arguments=item["arguments"])
                yield ev("response.output_item.done", output_index=i, item=item)
        else:
            if not opened:
                for e in opening():
                    yield e
            part = output[0]["content"][0]
            yield ev("response.output_text.done", **where, text=part["text"], logprobs=[])
            yield ev("response.content_part.done", **where, part=part)
            yield ev("response.output_item.done", output_index=0, item=output[0])
        body = self._finish(r, req, rid, created, c, output, tokens)
        yield ev("response.incomplete" if body["status"] == "incomplete" else "response.completed",
                 response=body)
