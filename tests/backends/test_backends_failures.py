"""The failure mapping, case by case as codex-notes section 5 recorded Codex 0.169.0's errors."""
import pytest

from caldera.backends import failures as fk


def err(message="", info=None, details=None):
    return {"message": message, "codexErrorInfo": info, "additionalDetails": details}


def status(variant, code):
    return {variant: {"httpStatusCode": code}}


@pytest.mark.parametrize("error,kind", [
    (err("unexpected status 401 Unauthorized", status("httpConnectionFailed", 401)), fk.PROVIDER_AUTH_FAILED),
    (err("Reconnecting... 1/5", status("responseStreamDisconnected", 401)), fk.PROVIDER_AUTH_FAILED),
    (err("x", status("httpConnectionFailed", 403)), fk.PROVIDER_AUTH_FAILED),
    (err("x", "unauthorized"), fk.PROVIDER_AUTH_FAILED),
    (err("exceeded retry limit", status("responseTooManyFailedAttempts", 429)), fk.PROVIDER_RATE_LIMITED),
    (err("Quota exceeded.", "usageLimitExceeded"), fk.PROVIDER_RATE_LIMITED),
    (err("x", "rateLimitExceeded"), fk.PROVIDER_RATE_LIMITED),
    (err("high demand", "internalServerError"), fk.PROVIDER_UNAVAILABLE),
    (err("x", "serverOverloaded"), fk.PROVIDER_UNAVAILABLE),
    (err("unexpected status 503 Service Unavailable", status("httpConnectionFailed", 503)), fk.PROVIDER_UNAVAILABLE),
    (err("x", status("responseStreamDisconnected", 503)), fk.PROVIDER_UNAVAILABLE),
    (err("x", status("responseStreamConnectionFailed", 500)), fk.PROVIDER_UNAVAILABLE),
    (err("x", status("responseTooManyFailedAttempts", 502)), fk.PROVIDER_UNAVAILABLE),
    # connection refused with bounded retries: no status, and a message that says nothing useful
    (err("zzz", status("httpConnectionFailed", None)), fk.PROVIDER_UNAVAILABLE),
    (err("stream disconnected before completion: error decoding response body", "other"), fk.PROVIDER_UNAVAILABLE),
    (err("stream disconnected before completion: idle timeout waiting for SSE", "other"), fk.PROVIDER_UNAVAILABLE),
    (err("Service Unavailable", "other"), fk.PROVIDER_UNAVAILABLE),
    (err("the provider is temporarily unavailable", None), fk.PROVIDER_UNAVAILABLE),
    (err("temporary unavailable", None), fk.PROVIDER_UNAVAILABLE),
    (err("provider unavailable", None), fk.PROVIDER_UNAVAILABLE),
    (err("Missing environment variable: `FAKE_PROVIDER_API_KEY`.", "other"), fk.SECRET_UNAVAILABLE),
    (err('{"error": {"message": "HTTP 400"}}', "other"), fk.BACKEND_FAILED),
    (err("x", status("httpConnectionFailed", 404)), fk.BACKEND_FAILED),
    (err("x", "contextWindowExceeded"), fk.BACKEND_FAILED),
    (err("x", {"somethingNew": {"a": 1}}), fk.BACKEND_FAILED),  # unknown variants stay open-ended
    (None, fk.BACKEND_FAILED),
])
def test_classify(error, kind):
    assert fk.classify_turn_error(error) == kind


def test_a_5xx_is_never_backend_failed_whatever_the_message():
    for code in range(500, 600):
        for variant in ("httpConnectionFailed", "responseStreamDisconnected"):
            assert fk.classify_turn_error(err("weird text", status(variant, code))) == fk.PROVIDER_UNAVAILABLE


def test_status_wins_over_text():
    # A 404 whose body says "unavailable" is a configuration problem, not provider availability.
    assert fk.classify_turn_error(err("Service Unavailable", status("httpConnectionFailed", 404))) == fk.BACKEND_FAILED


def test_retry_attempt():
    assert fk.retry_attempt("Reconnecting... 2/5") == (2, 5)
    assert fk.retry_attempt("Reconnecting... waiting for network") == (None, None)
    assert fk.retry_attempt(None) == (None, None)


def test_backend_failure_rejects_unknown_kinds():
    with pytest.raises(ValueError, match="unknown failure kind"):
        fk.BackendFailure("bogus", "x")
    assert len(set(fk.FAILURE_KINDS)) == 11
