"""The web pages, their assets, and the read-only session routes behind the session viewer.

Every file path that comes from a URL is resolved and must stay inside its root (the static folder or one
session's folder): ``..``, absolute paths, encoded separators and symlinks leading out are all refused.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

from fastapi import APIRouter, Request
from starlette.background import BackgroundTask
from starlette.responses import FileResponse, JSONResponse

from omnipipe.gateway.recording.store import InvalidSessionPath, validate_session_id
from omnipipe.protocol.errors import APIError

STATIC_DIR = Path(__file__).parent / "static"
PAGES = {"/": "index.html", "/chat": "chat.html", "/voice": "voice.html", "/omni": "omni.html", "/admin": "admin.html"}
NOSNIFF = {"X-Content-Type-Options": "nosniff"}  # a recorded upload is never sniffed into HTML or script
router = APIRouter()


def static_file(relpath: str) -> Path:
    """The asset ``relpath`` under ``STATIC_DIR``; 404 for anything missing or outside it."""
    root = STATIC_DIR.resolve()
    parts = relpath.split("/")
    if not relpath or relpath.startswith("/") or "\\" in relpath or "\x00" in relpath or ".." in parts:
        raise APIError(404, "no such file", code="not_found")
    path = (root / relpath).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        raise APIError(404, "no such file", code="not_found")
    return path


def _page(name: str) -> FileResponse:
    return FileResponse(static_file(name), media_type="text/html", headers={"Cache-Control": "no-cache"})


for _route, _name in PAGES.items():
    router.add_api_route(_route, lambda _name=_name: _page(_name), methods=["GET"], include_in_schema=False)


@router.get("/static/{relpath:path}", include_in_schema=False)
async def asset(relpath: str) -> FileResponse:
    return FileResponse(static_file(relpath), headers={"Cache-Control": "no-cache", **NOSNIFF})


def _session_id(session_id: str) -> str:
    try:
        return validate_session_id(session_id)
    except InvalidSessionPath as exc:
        raise APIError(400, f"session_id: {exc}", param="session_id", code="invalid_session_id") from None


def _existing_session(request: Request, session_id: str) -> str:
    """``session_id`` if it names a recorded session; 400 for a malformed id, 404 otherwise."""
    try:
        request.app.state.store.session_dir(_session_id(session_id))
    except (FileNotFoundError, InvalidSessionPath):
        raise APIError(404, f"session_id: no recorded session {session_id!r}", param="session_id",
                       code="not_found") from None
    return session_id


@router.get("/s/{session_id}", include_in_schema=False)
async def viewer(session_id: str) -> FileResponse:
    return _page("session.html")  # the page asks /api/sessions/{id} and explains a bad or unknown id


@router.get("/api/sessions/{session_id}")
async def session(session_id: str, request: Request) -> JSONResponse:
    _existing_session(request, session_id)
    return JSONResponse(await asyncio.to_thread(request.app.state.store.read_session, session_id))


@router.get("/api/sessions/{session_id}/files/{relpath:path}")
async def session_file(session_id: str, relpath: str, request: Request) -> FileResponse:
    _existing_session(request, session_id)
    try:
        path = request.app.state.store.resolve_file(session_id, relpath)
    except InvalidSessionPath as exc:
        raise APIError(400, f"path: {exc}", param="path", code="invalid_path") from None
    except FileNotFoundError:
        raise APIError(404, f"path: no file {relpath!r} in session {session_id!r}", param="path",
                       code="not_found") from None
    return FileResponse(path, headers=NOSNIFF)


@router.get("/api/sessions/{session_id}/download")
async def download(session_id: str, request: Request) -> FileResponse:
    store = request.app.state.store
    _existing_session(request, session_id)
    scratch = Path(tempfile.mkdtemp(prefix="omnipipe-zip-"))

    def remove() -> None:
        shutil.rmtree(scratch, ignore_errors=True)

    try:
        archive = await asyncio.to_thread(store.zip_session, session_id, scratch / f"{session_id}.zip")
    except BaseException:
        remove()
        raise

    return FileResponse(archive, media_type="application/zip", filename=f"{session_id}.zip",
                        background=BackgroundTask(remove))
