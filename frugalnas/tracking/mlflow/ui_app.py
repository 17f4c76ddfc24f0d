"""The MLflow server app that ``frugalnas ui`` runs (MLflow's ``mlflow.app`` entry point
``frugalnas``): MLflow's own app, whose page opens on the study's runs table.

MLflow 3 opens its assistant chat panel by itself on a browser's first visit to a server on
localhost; the panel takes a third of a 1,400 px window, hiding most of the columns a
reviewer compares. The page served here marks that first opening as done in the browser's
local storage before MLflow's scripts run; nothing else changes (the assistant's button stays,
and a panel the user opened stays open).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: MLflow's local-storage key (``<key>_v<version>``) that records the first automatic opening.
AUTO_OPENED_KEY = "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1"
FIRST_VISIT_SCRIPT = (
    "<script>(function(){try{var s=window.localStorage;"
    f"if(s.getItem({AUTO_OPENED_KEY!r})===null){{s.setItem({AUTO_OPENED_KEY!r},'true');}}"
    "}catch(e){}})();</script>").encode()


class FirstVisitPage:
    """ASGI middleware: the HTML page MLflow serves at ``/`` gets :data:`FIRST_VISIT_SCRIPT`
    at the top of its ``<head>``; every other response passes through untouched."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("method") != "GET" or \
                scope.get("path") not in ("/", "/index.html"):
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        body: list[bytes] = []

        async def buffered(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            body.append(message.get("body", b""))
            if message.get("more_body"):
                return
            assert start is not None
            await self._send_page(start, b"".join(body), send)

        await self.app(scope, receive, buffered)

    @staticmethod
    async def _send_page(start: Message, page: bytes, send: Send) -> None:
        headers = [(k, v) for k, v in start.get("headers", [])]
        html = any(k.lower() == b"content-type" and b"text/html" in v.lower() for k, v in headers)
        if html and b"<head>" in page:
            page = page.replace(b"<head>", b"<head>" + FIRST_VISIT_SCRIPT, 1)
            headers = [(k, str(len(page)).encode() if k.lower() == b"content-length" else v)
                       for k, v in headers]
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": page, "more_body": False})


def create_app() -> ASGIApp:
    """MLflow's FastAPI server app behind :class:`FirstVisitPage` (uvicorn ``--factory``)."""
    from mlflow.server.fastapi_app import app

    return FirstVisitPage(app)
