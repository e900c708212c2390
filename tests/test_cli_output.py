"""What the command line prints of stored text, on every backend: a job's key, arguments,
result and errors, a batch's description and failure reasons, an effect's scope, key,
owner and last error, a pause's note and actor, a list position's burial reason. Text
that looks like rich markup is shown as it is (it once crashed the command with a
MarkupError, after ``effects resolve`` had written its verdict); control characters and
bidi overrides are shown as escapes and never reach the terminal."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from justonce import App, JobState
from justonce.cli import cli
from justonce.cli_output import out, visible

HOSTILE = "[/x] [red]R[/red] [bold] :smile: \x1b[2J \x1b]0;T\x07 \u202egnp.exe a\nb"
"""Markup that crashed (``[/x]``) or vanished (``[red]``), an emoji code, a screen clear,
a window-title command, a right-to-left override and a newline."""
SHOWN = "[/x] [red]R[/red] [bold] :smile: \\x1b[2J \\x1b]0;T\\x07 \\u202egnp.exe a\\nb"
"""How the CLI prints HOSTILE."""
LINE = HOSTILE.replace("\n", " ")
"""HOSTILE on one line, for an error or a reason (listings show the last line of one)."""
RAW = ("\x1b", "\x07", "\u202e", "\U0001f604")  # ESC, BEL, RLO, the emoji :smile: becomes


@pytest.fixture(autouse=True)
def wide_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables wide enough to hold the texts whole (rich cuts cells to fit 80 columns)."""
    monkeypatch.setattr(out, "width", 1000)




def run(db_url: str, *args: str, code: int = 0) -> str:
    """The command's output, with no raw ESC, BEL, bidi override or emoji in it."""
    result = CliRunner().invoke(cli, [*args, "--database-url", db_url], catch_exceptions=False)
    assert result.exit_code == code, result.output
    assert not any(c in result.output for c in RAW), repr(result.output)
    return result.output


def test_visible_escapes_control_characters_and_bidi_overrides_and_keeps_the_rest() -> None:
    assert visible(HOSTILE) == SHOWN
    assert visible("\x00\x1f\x7f\x80\x9b\t\r\u2028\u2066\u2069\u200f\udcff") == (
        "\\x00\\x1f\\x7f\\x80\\x9b\\t\\r\\u2028\\u2066\\u2069\\u200f\\udcff")
    assert visible("C:\\temp ünïcode 日本 👍 [b]") == "C:\\temp ünïcode 日本 👍 [b]"


def test_jobs_show_and_list_print_a_failed_jobs_stored_text_as_it_is(app: App, worker_factory: Any,
                                                                      db_url: str) -> None:
    error = LINE

    @app.task(name="boom", max_attempts=1)
    def boom(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError(error)

    job = boom.configure(key=HOSTILE).enqueue(HOSTILE, k=HOSTILE)
    worker_factory()
    assert app.wait(job.id, 20).state is JobState.DEAD
    shown = run(db_url, "jobs", "show", str(job.id))
    assert f"key               {SHOWN}" in shown, shown
    # JSON-dumped arguments: json.dumps escapes the control characters itself.
    assert '["[/x] [red]R[/red] [bold] :smile: \\u001b[2J' in shown
    assert '{"k": "[/x] [red]R[/red]' in shown
    history, last_error = shown.split("last error\n")
    assert "(" in history and history.rstrip().endswith(f"): RuntimeError: {visible(error)}"), history
    assert last_error.startswith("Traceback (most recent call last):\n")  # whole, line by line
    assert last_error.rstrip().endswith(f"\nRuntimeError: {visible(error)}"), last_error
    listed = run(db_url, "jobs", "list", "--state", "dead")
    assert visible(f"RuntimeError: {error}"[:60]) in listed, listed


def test_a_succeeded_jobs_result_and_the_status_table_are_shown_as_they_are(app: App, worker_factory: Any,
                                                                            db_url: str) -> None:
    @app.task(name="echo")
    def echo(text: str) -> list[str]:
        return [text, "[red]RED[/red]", "[bold]"]

    job = echo.enqueue(HOSTILE)
    worker_factory()
    assert app.wait(job.id, 20).state is JobState.SUCCEEDED
    shown = run(db_url, "jobs", "show", str(job.id))
    assert '"[red]RED[/red]", "[bold]"]' in shown, shown
    assert "default" in run(db_url, "status")


def test_batches_list_and_show_print_descriptions_and_reasons_as_they_are(app: App, db_url: str) -> None:
    batch = app.batches.open(HOSTILE)
    group = batch.add(2)
    app.batches.fail(group.item_id(0), LINE)
    listed = run(db_url, "batches", "list")
    assert visible(HOSTILE[:30]) in listed, listed  # (the listing cuts it at 30)
    shown = run(db_url, "batches", "show", str(batch.id))
    assert f"description   {SHOWN}" in shown, shown
    assert f"{group.item_id(0)} at " in shown and shown.rstrip().endswith(visible(LINE))


def test_effects_in_doubt_and_resolve_print_scopes_keys_and_owners_as_they_are(app: App,
                                                                                db_url: str) -> None:
    claim = app.effects.claim(HOSTILE, HOSTILE, owner=HOSTILE, lease=30)
    claim.release(HOSTILE)
    app.effects.claim(HOSTILE, HOSTILE, owner=HOSTILE, lease=0.05)
    time.sleep(0.2)
    listed = run(db_url, "effects", "in-doubt")
    assert listed.count(SHOWN) == 3, listed  # scope, key and owner
    assert visible(HOSTILE[:40]) in listed  # the last error, cut at 40
    # The verdict is written, then printed: the print must not fail on what it prints
    # (it once raised MarkupError here, leaving the operator unsure whether it took).
    resolved = run(db_url, "effects", "resolve", HOSTILE, HOSTILE, "--done")
    assert resolved == f"effect {SHOWN}:{SHOWN} done\n"
    assert app.effects.get(HOSTILE, HOSTILE).state == "done"
    app.effects.claim(HOSTILE, "k2", lease=0.05)
    time.sleep(0.2)
    many = run(db_url, "effects", "resolve", HOSTILE, "k2", "k3", "--redo", code=1)
    assert many == (f"resolved 1 of 2 effects of {SHOWN} (claimable again)\n"
                    "not in doubt, left as they are: k3\n")


def test_queues_list_and_status_print_a_pause_note_and_actor_as_they_are(app: App, db_url: str) -> None:
    App(db_url, strict=False).enqueue("t", [], queue="mail")
    app.pause_queue("mail", note=HOSTILE, actor=HOSTILE)
    listed = run(db_url, "queues", "list")
    assert "mail: paused since " in listed and f" by {SHOWN}: {SHOWN}" in listed, listed
    assert "paused: mail" in run(db_url, "status")


def test_lists_show_prints_a_burial_reason_as_it_is(app: App, db_url: str) -> None:
    app.lists.create("l1", items=[1, 2])
    reservation = app.lists.reserve("l1", 1)
    assert reservation is not None
    app.lists.bury(reservation, reason=LINE)
    shown = run(db_url, "lists", "show", "l1")
    assert shown.rstrip().endswith(f"): {visible(LINE)}"), shown
    assert "l1" in run(db_url, "lists", "list")


def test_an_error_message_quoting_user_input_has_its_controls_escaped(db_url: str, tmp_path: Path) -> None:
    App(db_url).migrate()
    # A file name is quoted as it is (click prints a message raw to a terminal).
    items = tmp_path / "items\x1b[2J\u202e.jsonl"
    items.write_text("1\nnot json\n")
    bad_line = CliRunner().invoke(cli, ["lists", "create", "l1", "--from", str(items),
                                        "--database-url", db_url], catch_exceptions=False)
    assert bad_line.exit_code == 1, bad_line.output
    assert f"Error: line 2 of {tmp_path}/items\\x1b[2J\\u202e.jsonl: not JSON" in bad_line.output
    for args in (["jobs", "list", "--queue", HOSTILE], ["enqueue", "t", "--queue", HOSTILE],
                 ["lists", "show", HOSTILE], ["effects", "resolve", HOSTILE, "k", "--done"]):
        result = CliRunner().invoke(cli, [*args, "--database-url", db_url], catch_exceptions=False)
        assert result.exit_code != 0, args
        assert not any(c in result.output for c in RAW), (args, result.output)
        assert "Error: " in result.output and "Traceback" not in result.output, (args, result.output)


def test_a_token_name_that_reads_as_an_emoji_code_is_shown_as_it_is(db_url: str) -> None:
    App(db_url).migrate()
    result = CliRunner().invoke(cli, ["tokens", "create", "--name", "ci :smile: bot", "--scope", "read",
                                      "--database-url", db_url], catch_exceptions=False)
    assert result.exit_code == 0 and "(ci :smile: bot, read)" in result.output, result.output
    assert " ci :smile: bot " in run(db_url, "tokens", "list")
