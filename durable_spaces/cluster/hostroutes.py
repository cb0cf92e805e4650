"""The host API's routes: what a host agent answers to the requests ``hostapi.py``
describes (a starlette app; ``hostserver.Listener`` serves it over mutual TLS).

Apart from the client so that the processes that only ask (coordinators, drivers) never
import the server's libraries. A request is for this host or refused (421), its numbers
bounded before use, its body at most ``hostapi.MAX_BODY`` bytes (413) and JSON parsed
through the bounded reader; every error an ``{"error": ...}`` of one line.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any, Protocol

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from durable_spaces.cluster.hostapi import MAX_BODY
from durable_spaces.cluster.records import check_name
from durable_spaces.errors import (
    ClusterConflictError,
    ConfigError,
    DurableSpacesError,
    HostAuthError,
    UnknownRecordError,
)
from durable_spaces.host.bounded import parse_json

#: A generation is a PostgreSQL integer (``durable_spaces/cluster/schema.py``).
MAX_GENERATION = 2**31 - 1
#: A lease token is a bigint.
MAX_LEASE = 2**63 - 1
_DIGITS = re.compile(r"[0-9]{1,19}")


class HostService(Protocol):
    """What the API serves (``durable_spaces/cluster/host.py``'s ``HostAgent``)."""

    host_id: str

    async def place(self, space: str, generation: int) -> dict[str, Any]: ...

    async def rotate(self, space: str, generation: int, lease: int) -> dict[str, Any]: ...

    async def status(self, space: str, generation: int) -> dict[str, Any]: ...


class MisdirectedError(HostAuthError):
    """A request for another host than the one that received it."""


def _number(what: str, value: object, lo: int, hi: int) -> int:
    """``value`` (a JSON number or a query's text) as an int in lo..hi; ConfigError."""
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"{what} must be an integer in {lo}..{hi}")
    return value


def _small_int(text: str) -> int:
    """JSON integers, refused before conversion when longer than any field can be."""
    if len(text.lstrip("-")) > 19:
        raise ValueError("a number is too long")
    return int(text)


def _status_for(e: BaseException) -> int:
    if isinstance(e, MisdirectedError):
        return HTTPStatus.MISDIRECTED_REQUEST
    if isinstance(e, ConfigError):
        return HTTPStatus.BAD_REQUEST
    if isinstance(e, ClusterConflictError):
        return HTTPStatus.CONFLICT
    if isinstance(e, UnknownRecordError):
        return HTTPStatus.NOT_FOUND
    return HTTPStatus.SERVICE_UNAVAILABLE


def _one_line(text: str) -> str:
    return " ".join(text.split())[:500]


def _error(status: int, text: str) -> JSONResponse:
    return JSONResponse({"error": _one_line(text)}, status_code=status)


class _TooLarge(ConfigError):
    pass


async def _body(request: Request) -> dict[str, Any]:
    raw = request.headers.get("content-length")
    if raw is not None and (not _DIGITS.fullmatch(raw.strip()) or int(raw) > MAX_BODY):
        raise _TooLarge(f"a request's body is at most {MAX_BODY} bytes")
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > MAX_BODY:
            raise _TooLarge(f"a request's body is at most {MAX_BODY} bytes")
    try:
        req = parse_json(bytes(data), where="a request", parse_int=_small_int) if data else None
    except ValueError:
        req = None
    if not isinstance(req, dict):
        raise ConfigError("a request's body must be a JSON object")
    return req


def make_app(service: HostService) -> Starlette:
    """The API over ``service`` (an ASGI app; ``hostserver.Listener`` serves it)."""

    def handler(
        fn: Callable[[Request], Awaitable[dict[str, Any]]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                host = check_name("host id", request.path_params["host"])
                if host != service.host_id:
                    raise MisdirectedError(
                        f"this is host {service.host_id}: a request for host {host} is refused"
                    )
                return JSONResponse(await fn(request))
            except ClientDisconnect:
                return Response(status_code=HTTPStatus.BAD_REQUEST)  # nobody to tell
            except _TooLarge as e:
                return _error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"ConfigError: {e}")
            except DurableSpacesError as e:
                return _error(_status_for(e), f"{type(e).__name__}: {e}")
            except Exception as e:  # the host must answer something; the caller retries
                return _error(HTTPStatus.SERVICE_UNAVAILABLE, f"{type(e).__name__}: {e}")

        return endpoint

    async def place(request: Request) -> dict[str, Any]:
        req = await _body(request)
        space = check_name("space", req.get("space"))
        gen = _number("generation", req.get("generation"), 1, MAX_GENERATION)
        return await service.place(space, gen)

    async def rotate(request: Request) -> dict[str, Any]:
        req = await _body(request)
        space = check_name("space", req.get("space"))
        gen = _number("generation", req.get("generation"), 1, MAX_GENERATION)
        lease = _number("lease", req.get("lease"), 1, MAX_LEASE)
        return await service.rotate(space, gen, lease)

    async def status(request: Request) -> dict[str, Any]:
        space = check_name("space", request.path_params["space"])
        gens = request.query_params.getlist("generation")
        gen = _number("generation", gens[0] if len(gens) == 1 else "", 1, MAX_GENERATION)
        return await service.status(space, gen)

    async def not_found(request: Request, exc: Exception) -> Response:
        code = exc.status_code if isinstance(exc, HTTPException) else HTTPStatus.NOT_FOUND
        return _error(code, f"no such resource {request.url.path!r} ({request.method})")

    return Starlette(
        routes=[
            Route("/v1/hosts/{host}/place", handler(place), methods=["POST"]),
            Route("/v1/hosts/{host}/rotate", handler(rotate), methods=["POST"]),
            Route("/v1/hosts/{host}/spaces/{space}", handler(status), methods=["GET"]),
        ],
        exception_handlers={404: not_found, 405: not_found},
    )


__all__ = ["HostService", "MisdirectedError", "make_app"]
