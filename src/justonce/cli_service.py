"""``justonce serve`` and ``justonce tokens …``: thin — parse, call the App, print."""

from __future__ import annotations

import os
import secrets
from typing import Any

import click
from rich.table import Table

from .backends import redact_url
from .cli import ID, Integer, cli, database_option, host_option, load_app
from .cli_output import out, visible


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, callback=host_option,
              help="Address to bind; loopback unless you mean to expose the service.")
@click.option("--port", default=8080, show_default=True, type=Integer(0, 65535))
@database_option
@click.option("--app", "app_path", default=None, metavar="MODULE:APP",
              help="Your App, for its task defaults; without it any task name is accepted "
              "(enqueue-only, as App(strict=False)).")
@click.option("--secret-key", envvar="JUSTONCE_SECRET_KEY", default=None,
              help="Signs session cookies [env JUSTONCE_SECRET_KEY]; random per process if unset.")
@click.option("--max-body-bytes", default=8 * 1024 * 1024, show_default=True,
              type=Integer(1024, 1 << 30), help="Larger request bodies get 413.")
@click.option("--workers", default=1, show_default=True, type=Integer(1, 64),
              help="Server processes (one is enough below a few hundred requests/s).")
@click.option("--log-level", default="warning", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]))
def serve(host: str, port: int, database_url: str | None, app_path: str | None,
          secret_key: str | None, max_body_bytes: int, workers: int, log_level: str) -> None:
    """Serve the JSON API (and OpenAPI document at /openapi.json) over HTTP."""
    try:
        import uvicorn

        from .web.app import create_app
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise click.ClickException(f"justonce serve needs fastapi and uvicorn: {exc}") from None
    app = load_app(app_path, database_url, strict=False)
    version = app.backend.schema_version()  # fail now, not on the first request, if unreachable
    if version < app.backend.schema_latest() and not app.database_url.startswith("sqlite"):
        # (Served anyway, as a worker waits: a deploy may start the service before migrate.)
        out.print(f"the justonce schema is at v{version}, this version needs "
                  f"v{app.backend.schema_latest()}: requests answer 503 until `justonce migrate` "
                  "runs", style="yellow")
    elif version > app.backend.schema_latest():
        out.print(f"the justonce schema is at v{version}, newer than this justonce "
                  f"(v{app.backend.schema_latest()}): requests answer 503; upgrade justonce",
                  style="yellow")
    out.print(f"justonce serving {redact_url(app.database_url).split('?')[0]} on http://{host}:{port} "
              f"(API /api/v1, docs /docs)")
    options: dict[str, Any] = {"host": host, "port": port, "log_level": log_level,
                               "access_log": False, "timeout_keep_alive": 30, "server_header": False}
    if workers == 1:
        uvicorn.run(create_app(app, max_body_bytes=max_body_bytes, secret=secret_key), **options)
        return
    # Several processes: each builds the app from the environment, with one shared key.
    os.environ.update(JUSTONCE_SERVE_PARENT=str(os.getpid()),  # (each worker ends with us)
                      JUSTONCE_SERVE_DATABASE_URL=app.database_url, JUSTONCE_SERVE_APP=app_path or "",
                      JUSTONCE_SERVE_MAX_BODY_BYTES=str(max_body_bytes),
                      JUSTONCE_SECRET_KEY=secret_key or secrets.token_hex(32))
    app.close()
    uvicorn.run("justonce.web.app:from_environment", factory=True, workers=workers, **options)


@cli.group()
def tokens() -> None:
    """API tokens of `justonce serve`: create, list, revoke."""


@tokens.command("create")
@click.option("--name", required=True, help="Who or what uses it (shown in lists and the audit).")
@click.option("--scope", required=True, type=click.Choice(["read", "admin"]),
              help="read: see everything, change nothing; admin: also act.")
@database_option
def tokens_create(name: str, scope: str, database_url: str | None) -> None:
    """Create a token and print its secret (shown this once; only its hash is stored)."""
    app = load_app(None, database_url, strict=False)
    info, secret = app.tokens.create(name, scope)
    click.echo(secret)
    click.echo(f"token {info.id} ({visible(info.name)}, {info.scope}): keep the secret above, it is not "
               "shown again", err=True)


@tokens.command("list")
@database_option
def tokens_list(database_url: str | None) -> None:
    """Every token (never their secrets)."""
    found = load_app(None, database_url, strict=False).tokens.list()
    if not found:
        out.print("no tokens")
        return
    table = Table("id", "name", "scope", "prefix", "created", "last used", "revoked")
    for t in found:
        table.add_row(str(t.id), t.name, t.scope, f"jo_{t.prefix}_…", f"{t.created_at:%Y-%m-%d %H:%M}",
                      f"{t.last_used_at:%Y-%m-%d %H:%M}" if t.last_used_at else "-",
                      f"{t.revoked_at:%Y-%m-%d %H:%M}" if t.revoked_at else "-")
    out.print(table)


@tokens.command("revoke")
@click.argument("token_id", type=ID)
@database_option
def tokens_revoke(token_id: int, database_url: str | None) -> None:
    """Revoke a token: it and the sessions signed in with it stop working at once."""
    info = load_app(None, database_url, strict=False).tokens.revoke(token_id)
    out.print(f"token {info.id} ({info.name}) revoked")
