"""The web pages, their assets, the presets they offer, and the read-only session routes behind the session viewer,
by session id (``/s/{id}``) or by share link (``/shared/{token}``, see ``gateway/shares.py``).

Every file path that comes from a URL is resolved and must stay inside its root (the static folder or one
session's folder): ``..``, absolute paths, encoded separators and symlinks leading out are all refused.
"""

from __future__ import annotations

import asyncio
import html
import shutil
import tempfile
from pathlib import Path

from fastapi import APIRouter, Request
from starlette.background import BackgroundTask
from starlette.responses import FileResponse, HTMLResponse, JSONResponse

from omnipipe.gateway.recording.store import InvalidSessionPath, validate_session_id
from omnipipe.gateway.shares import HIDDEN_FILES, SHARED_PATH, Share, ShareNotFound, ShareRevoked, shared_view
from omnipipe.protocol.errors import APIError

STATIC_DIR = Path(__file__).parent / "static"
PAGES = {"/": "index.html", "/chat": "chat.html", "/voice": "voice.html", "/admin": "admin.html"}
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
    return FileResponse(_session_file(request, session_id, relpath, f"session {session_id!r}"), headers=NOSNIFF)


def _session_file(request: Request, session_id: str, relpath: str, named: str) -> Path:
    """The file ``relpath`` of the session, resolved (400 for a path that leaves it, 404 if missing); errors name
    the session as ``named``."""
    try:
        return Path(request.app.state.store.resolve_file(session_id, relpath))
    except InvalidSessionPath as exc:
        raise APIError(400, f"path: {exc}", param="path", code="invalid_path") from None
    except FileNotFoundError:
        raise APIError(404, f"path: no file {relpath!r} in {named}", param="path", code="not_found") from None


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


@router.get("/api/presets")
async def presets(request: Request) -> dict[str, list[dict[str, object]]]:
    return {"presets": [preset.to_json() for preset in request.app.state.config.presets]}


# ---------------------------------------------------------------------------------------------- share links
_SHARED_PAGE_HEADERS = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}
"""The token in a share link's address is the capability: it must not leak in a Referer or stay in a cache."""


@router.post("/api/sessions/{session_id}/share")
async def share_session(session_id: str, request: Request) -> JSONResponse:
    """A read-only link to the session; whoever may open the session (knows its id) may share it."""
    _existing_session(request, session_id)
    share, token = await asyncio.to_thread(request.app.state.shares.create, session_id)
    return JSONResponse({"url": f"{SHARED_PATH}{token}", "share_id": share.share_id}, status_code=201)


def _shared_session(request: Request, token: str) -> Share:
    """The working share with ``token`` whose session still exists: 404 unknown or deleted, 410 revoked."""
    try:
        share: Share = request.app.state.shares.resolve(token)
    except ShareRevoked:
        raise APIError(410, "token: this share link was revoked", param="token", code="share_revoked") from None
    except ShareNotFound:
        raise APIError(404, "token: no such share link", param="token", code="share_not_found") from None
    try:
        request.app.state.store.session_dir(share.session_id)
    except (FileNotFoundError, InvalidSessionPath):
        raise APIError(404, "token: the shared session was deleted (recordings are kept for a limited time)",
                       param="token", code="not_found") from None
    return share


def _refusal_page(status: int, title: str, text: str) -> HTMLResponse:
    body = (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)} · omnipipe'
            '</title><link rel="stylesheet" href="/static/css/omnipipe.css"></head><body><main id="main">'
            f'<div class="notice error" role="alert"><strong>{html.escape(title)}</strong> {html.escape(text)}'
            '</div><p><a href="/">Back to the start page</a></p></main></body></html>')
    return HTMLResponse(body, status_code=status, headers=_SHARED_PAGE_HEADERS)


@router.get(SHARED_PATH + "{token}", include_in_schema=False, response_model=None)
async def shared_viewer(token: str, request: Request) -> FileResponse | HTMLResponse:
    """The session viewer, read-only, reading ``/api/shared/{token}``; a clear page when the link no longer works."""
    try:
        _shared_session(request, token)
    except APIError as exc:
        title = "Share link revoked" if exc.status == 410 else "Share link not found"
        text = exc.message.removeprefix("token: ")
        return _refusal_page(exc.status, title, f"{text[0].upper()}{text[1:]}.")
    return FileResponse(static_file("session.html"), media_type="text/html", headers=_SHARED_PAGE_HEADERS)


@router.get("/api/shared/{token}")
async def shared_session(token: str, request: Request) -> JSONResponse:
    share = _shared_session(request, token)
    data = await asyncio.to_thread(request.app.state.store.read_session, share.session_id)
    return JSONResponse(shared_view(data), headers={"Cache-Control": "no-store"})


@router.get("/api/shared/{token}/files/{relpath:path}")
async def shared_file(token: str, relpath: str, request: Request) -> FileResponse:
    share = _shared_session(request, token)
    path = _session_file(request, share.session_id, relpath, "the shared session")
    directory = request.app.state.store.session_dir(share.session_id).resolve()
    if path.relative_to(directory).as_posix() in HIDDEN_FILES:  # also when asked as ./meta.json
        raise APIError(404, f"path: {relpath!r} is not part of a shared session", param="path", code="not_found")
    return FileResponse(path, headers=NOSNIFF)
