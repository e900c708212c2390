"""The public names are a contract: adding or removing one is a decision, not an accident."""

import justonce

EXPECTED = {
    "MAX_PAYLOAD_BYTES", "MAX_RESULT_BYTES", "App", "Backoff", "ConfigurationError",
    "DatabaseUnavailable", "Enqueue", "InvalidArguments", "InvalidName", "InvalidOption",
    "InvalidTransition", "Job", "JobNotFound", "JobState", "JustonceError", "KeyConflict",
    "NonRetryable", "PayloadTooLarge", "SchemaError", "Task", "UnknownTask", "ValidationError",
    "Worker", "__version__",
    # batches
    "AckResult", "Batch", "BatchExpired", "BatchInfo", "BatchNotFound", "BatchState", "Batches",
    "InvalidItemId", "ItemGroup", "ItemNotFound", "SealResult",
    # partitions
    "LeaseLost", "NoFreeSlot", "PartitionConflict", "PartitionLease", "PartitionSetNotFound",
    "Partitions", "SlotInfo", "partition_of", "slot_predicate",
    # effects
    "AT_LEAST_ONCE", "AT_MOST_ONCE", "EffectClaim", "EffectInfo", "EffectInDoubt", "EffectNotFound",
    "EffectOutcome", "Effects", "EffectsOutcome", "LockTimeout",
    # the service: job filters and actions on all matching, queue stats and pauses, tokens, audit
    "JobFilter", "CountChanged", "QueueStats", "QueuePause", "Tokens", "TokenInfo", "TokenNotFound", "Audit",
    "AuditEntry",
    # lists
    "Lists", "ListInfo", "ListProgress", "ListCompletion", "ListRun", "Reservation",
    "ListExists", "ListNotFound", "ListNotSealed", "ListSealed", "StaleReservation",
    "PositionNotReserved",
    # inside a task
    "current_job",
}


def test_public_names_are_exactly_the_documented_ones() -> None:
    assert set(justonce.__all__) == EXPECTED
    for name in justonce.__all__:
        assert hasattr(justonce, name)


def test_every_error_is_a_justonce_error() -> None:
    for name in justonce.__all__:
        obj = getattr(justonce, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, justonce.JustonceError), name
