"""Errors as the dashboard's HTML pages (``fastapi_app.state.error_page``; see
problems.wants_html for who gets one).

A person who opens the dashboard while the database is away reads that it is away and that
the page will work again once it is back; a GET page reloads itself every
``problems.RETRY_AFTER`` seconds meanwhile (a POST's answer does not: reloading it would
send the action again, so it links back instead). What the page says comes from the
library's error (whose URLs are already shown through ``backends.redact_url``: no
password) or from the service's own 4xx; a 500 says nothing of its cause (it is logged
by the server). Everything is escaped by Jinja.
"""

from __future__ import annotations

from http import HTTPStatus
from pathlib import Path

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape

from .problems import RETRY_AFTER

_env = Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"),
                   autoescape=select_autoescape(["html"]))
NO_STORE = {"Cache-Control": "no-store"}
UNAVAILABLE = ("The database is unavailable",
               "The dashboard cannot reach its database just now. This page will work again "
               "as soon as the database is back.")
SAID = {
    "SchemaError": ("The database is not ready",
                    "The database does not have this version's tables yet (run justonce "
                    "migrate). This page will work again once it has them."),
    "LockTimeout": ("The database is busy",
                    "Another transaction held a lock this one had to wait for, longer than it may wait."),
    "InternalError": ("Something went wrong",
                      "The server could not show this page. The error was logged on the "
                      "server; nothing more is shown here."),
}


def _said(status: int, error: str) -> tuple[str, str]:
    if error in SAID:
        return SAID[error]
    if status == 503:
        return UNAVAILABLE
    if status >= 500:
        return SAID["InternalError"]
    return HTTPStatus(status).phrase, ""


def _local(path: str) -> bool:
    """A path of this site to link to (the rule of dashboard._safe_next: no //host, no
    backslash, no whitespace or control characters, which browsers drop: ``/\\t/host``)."""
    return (path.startswith("/") and not path.startswith("//") and "\\" not in path
            and not any(c <= " " or c == "\x7f" for c in path))


def render(request: Request, status: int, error: str, detail: str | None = None,
           headers: dict[str, str] | None = None, back: str | None = None) -> HTMLResponse:
    """The HTML page of an error: ``status``, the error's name, what it means for the
    reader, ``detail`` (shown as given: the caller passes nothing secret), and a link
    ``back`` (default: the overview)."""
    heading, text = _said(status, error)
    if not text:  # a 4xx: what was refused is the page's text
        text, detail = detail or "", None
    retry = status == 503 and request.method in ("GET", "HEAD")
    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    again = here if retry and _local(here) else None
    back = back if back and _local(back) else again or "/"
    label = "Try again now" if again else ("Back to the overview" if back == "/" else "Back")
    html = _env.get_template("error.html").render(
        status=status, phrase=HTTPStatus(status).phrase, error=error, heading=heading,
        text=text, detail=detail if status < 500 or status == 503 else None,
        refresh=RETRY_AFTER if retry else None, back=back, back_label=label)
    sent = {**NO_STORE, **({"Retry-After": str(RETRY_AFTER)} if status == 503 else {}), **(headers or {})}
    return HTMLResponse(html, status_code=status, headers=sent)
