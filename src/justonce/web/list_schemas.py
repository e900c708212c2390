"""The JSON shapes of ``/api/v1/lists`` (web/api_lists.py), with the conventions of
web/schemas.py: requests refuse unknown fields and numbers or flags of the wrong JSON type.
Bounds are the library's (justonce.lists), so the document states them; the library checks
them again, with the rest (names, item sizes)."""

from __future__ import annotations

import builtins
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from ..items import MAX_GROUP_ITEMS
from ..lists import DEFAULT_TTR, LOAD_CHUNK, MAX_REQUEST_ID, MAX_RESERVE, MAX_TTR
from ..validate import MAX_ATTEMPTS, MAX_DELAY_SECONDS, MAX_ERROR_CHARS
from .schemas import BIGINT, Out, Request, SBool, SFloat, SInt

ListName = Annotated[str, Field(min_length=1, max_length=63, description=(
    "1-63 letters, digits, '_', '.', ':' or '-', starting with a letter or digit."))]
Positions = Annotated[list[Annotated[SInt, Field(ge=0, le=BIGINT)]], Field(
    max_length=MAX_RESERVE, description="Positions of the reservation; default: all it holds.")]
Ttr = Annotated[SFloat, Field(ge=0.001, le=MAX_TTR, description="Seconds.")]


class ListCreateIn(Request):
    name: ListName
    task: str | None = Field(None, description="What POST /lists/{name}/next runs on each item "
                             "(task(item)); a list only reserved and completed needs none.")
    ttr: Ttr = Field(DEFAULT_TTR, description="Default time to run of a reservation, seconds.")
    max_attempts: SInt | None = Field(None, ge=1, le=MAX_ATTEMPTS, description=(
        "Attempts of `next` on a failing item before it is buried (default: the task's, else 5)."))
    on_complete: str | None = Field(None, description="Task enqueued once when every position is done.")
    items: list[Any] | None = Field(None, max_length=LOAD_CHUNK, description=(
        "Items to load now (more with POST /lists/{name}/items), checked before anything is stored."))
    seal: SBool = Field(True, description="Seal after loading; false leaves the list open for appends.")


class ListProgressOut(Out):
    total: int
    ready: int = Field(description="Not handed out, or due again (timed out, released, kicked).")
    reserved: int = Field(description="Held by a live reservation.")
    done: int
    buried: int = Field(description="Parked until kicked.")


class ListOut(Out):
    id: int
    name: str
    task: str | None
    state: Literal["loading", "sealed", "completed"]
    progress: ListProgressOut
    ttr: float
    max_attempts: int
    created_at: datetime
    sealed_at: datetime | None = None
    finished_at: datetime | None = None
    on_complete: str | None = None
    batch_id: int | None = None


class ListsOut(BaseModel):
    lists: list[ListOut]


class AppendOut(BaseModel):
    appended: int
    total: int = Field(description="Items in the list now.")


class ReserveIn(Request):
    k: SInt = Field(1, ge=1, le=MAX_RESERVE, description="Positions wanted (fewer may be handed out).")
    ttr: Ttr | None = Field(None, description="Time to run, seconds (default: the list's).")
    request_id: str | None = Field(None, min_length=1, max_length=MAX_REQUEST_ID, description=(
        "Ask again with the same id after a lost answer: the same reservation comes back."))
    items: SBool = Field(True, description="Answer with the reserved items (false: positions only).")


class ItemOut(BaseModel):
    position: int
    item: Any


class ReservationOut(BaseModel):
    list: str
    token: str = Field(description="The fencing token: send it with touch, complete, release, bury.")
    ranges: builtins.list[tuple[int, int]] = Field(description="Half-open [lo, hi) position ranges, sorted.")
    count: int
    expires_at: datetime
    attempt: int = Field(description="How often these positions have been handed out.")
    ttr: float
    request_id: str | None = None
    items: builtins.list[ItemOut] | None = Field(None, description="In position order; null when items=false.")
    items_truncated: bool = Field(False, description=(
        "The items stopped at the answer's size budget: read the rest with GET /lists/{name}/items."))


class TokenIn(Request):
    token: str = Field(max_length=64)


class TouchIn(TokenIn):
    ttr: Ttr | None = Field(None, description="Seconds from now (default: the reservation's).")


class TouchOut(BaseModel):
    expires_at: datetime


class CompleteIn(TokenIn):
    positions: Positions | None = None


class CompleteOut(BaseModel):
    completed: int = Field(description="Positions this call marked done.")
    already: list[int] = Field(description="Positions that were done before (a repeat changes nothing).")
    list_completed: bool = Field(description="This call finished the list (on_complete enqueued with it).")


class ReleaseIn(TokenIn):
    delay: SFloat = Field(0.0, ge=0, le=MAX_DELAY_SECONDS,
                          description="Seconds before they are handed out again.")
    positions: Positions | None = None


class ReleaseOut(BaseModel):
    released: int


class BuryIn(TokenIn):
    positions: Positions | None = None
    reason: str | None = Field(None, max_length=MAX_ERROR_CHARS)


class BuryOut(BaseModel):
    buried: int


class KickIn(Request):
    limit: SInt = Field(MAX_GROUP_ITEMS, ge=1, le=MAX_GROUP_ITEMS, description=(
        "Most positions to revive; a buried range goes back whole (the oldest one even if larger)."))


class KickOut(BaseModel):
    kicked: int


class NextIn(Request):
    ttr: Ttr | None = Field(None, description="Time to run of the one position (default: the list's).")


class ListRunOut(BaseModel):
    list: str
    position: int
    item: Any
    attempt: int
    outcome: Literal["completed", "released", "buried", "stale", "late"] = Field(description=(
        "completed: result is the task's return value; released: it raised and the position "
        "comes back after the task's backoff; buried: it raised on its last attempt; stale: "
        "the reservation timed out while the task ran (the position is someone else's); "
        "late: the reservation's time to run had (nearly) run out before the task could "
        "start (the process was paused): given back, the task not run."))
    result: Any = Field(default=None, description=(
        "What the task returned, as a job keeps it: JSON of at most 64 KiB, else null and "
        "a note."))
    error: str | None = None
    list_completed: bool = False
    note: str | None = Field(default=None, description=(
        "Why result is null although the task returned something (not JSON, nested over 64 "
        "deep, over 64 KiB); the position was completed all the same."))


class BuriedOut(BaseModel):
    ranges: list[tuple[int, int]]
    attempt: int
    reason: str | None
    buried_at: datetime


class BuriedListOut(BaseModel):
    buried: list[BuriedOut]


class ItemsOut(BaseModel):
    items: list[ItemOut]
    next: int | None = Field(description="The position to start the next page at; null on the last.")
