"""A command is parsed once, from the plane's untrusted object, into a frozen Command."""
import threading

import pytest

from caldera.protocol.command import DEFAULT_TIMEOUT_SECONDS, MalformedCommand, parse_command


@pytest.mark.parametrize("raw, why", [
    ([1, 2], "must be a JSON object"),
    ("x", "must be a JSON object"),
    ({"command_type": "pause"}, "without an id"),
    ({"id": None, "command_type": "pause"}, "without an id"),
    ({"id": True, "command_type": "pause"}, "not bool"),
    ({"id": [1], "command_type": "pause"}, "not list"),
    ({"id": {"n": 1}}, "not dict"),
    ({"id": 1.5}, "not float"),
])
def test_a_command_that_cannot_be_named_is_refused_with_a_sentence(raw, why):
    with pytest.raises(MalformedCommand, match=why):
        parse_command(raw)


def test_a_well_formed_command():
    raw = {"id": 12, "command_type": "agent_run", "payload": {"run_id": "r-1", "prompt": "hi"},
           "timeout_seconds": 30, "issued_at": "2026-01-01T00:00:00Z"}
    command = parse_command(raw)
    assert (command.id, command.key, command.type, command.timeout_seconds) == (12, "12", "agent_run", 30.0)
    assert command.payload == {"run_id": "r-1", "prompt": "hi"} and command.run_id == "r-1"
    assert command.refusal is None and not command.local
    assert command.raw is raw  # journaled verbatim
    with pytest.raises(AttributeError):  # frozen
        command.type = "pause"  # type: ignore[misc]
    # raw is left out of == and repr(), as the dataclass's compare=False, repr=False did
    again = parse_command({**raw, "issued_at": "2026-01-02T00:00:00Z"})
    assert again == command and again != command._replace(payload={})
    assert "issued_at" not in repr(command) and repr(command).startswith("Command(id=12, type='agent_run'")


def test_what_is_wrong_beyond_the_id_is_kept_as_the_reason_to_finish_failed():
    bad_payload = parse_command({"id": "7", "command_type": "pause", "payload": ["x"]})
    assert bad_payload.payload == {} and bad_payload.refusal == "invalid payload for pause: must be a JSON object"
    too_large = parse_command({"id": 8, "command_type": "log_get"}, too_large="over 8388608 bytes")
    assert too_large.refusal == "payload too large: the command's answer was over 8388608 bytes"
    forged = parse_command({"id": 8, "command_type": "log_get", "payload": {}, "payload_too_large": "over 1 byte"})
    assert forged.refusal is None and forged.too_large is None  # the plane's object cannot say it
    untyped = parse_command({"id": 9, "payload": None})
    assert untyped.type == "" and untyped.payload == {} and untyped.refusal is None  # dispatch refuses ""


@pytest.mark.parametrize("value, seconds", [
    (None, DEFAULT_TIMEOUT_SECONDS), ("30", 30.0), (0, DEFAULT_TIMEOUT_SECONDS), (-5, DEFAULT_TIMEOUT_SECONDS),
    ("soon", DEFAULT_TIMEOUT_SECONDS), ([30], DEFAULT_TIMEOUT_SECONDS), ("nan", DEFAULT_TIMEOUT_SECONDS),
    (10 ** 400, DEFAULT_TIMEOUT_SECONDS), ("inf", threading.TIMEOUT_MAX), (1e300, threading.TIMEOUT_MAX),
    (2.5, 2.5), (True, DEFAULT_TIMEOUT_SECONDS), (False, DEFAULT_TIMEOUT_SECONDS),  # JSON true is no 1 s
])
def test_the_timeout_is_the_planes_when_usable(value, seconds):
    assert parse_command({"id": 1, "timeout_seconds": value}).timeout_seconds == seconds


def test_only_a_string_run_id_counts_and_local_is_never_read_from_the_plane():
    assert parse_command({"id": 1, "payload": {"run_id": 5}}).run_id is None
    assert parse_command({"id": 1, "local": True}).local is False
    assert parse_command({"id": "desired-3"}, local=True).local is True
