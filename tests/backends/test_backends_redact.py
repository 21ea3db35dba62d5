"""The Redactor's fast path (a trigger pre-check) must still mask every credential shape."""
import base64
import json
import os
import urllib.parse

import pytest

from caldera.backends.forwarder import process_secret, run_token
from caldera.redact import MASK, Redactor


@pytest.mark.parametrize("text,secret", [
    ("AUTHORIZATION: Bearer abcdefghijk123", "abcdefghijk123"),
    ('"authorization":"Basic dXNlcjpwYXNzd29yZA=="', "dXNlcjpwYXNzd29yZA=="),
    ("curl -H 'X: BEARER abcdefghijklmnop'", "abcdefghijklmnop"),
    ("key SK-no but sk-proj-ABCDEFGHIJKLMN", "sk-proj-ABCDEFGHIJKLMN"),
    ("session agt_sess_abcdefgh1", "agt_sess_abcdefgh1"),
    ("HTTPS://User:Pa55word@example.com/x", "Pa55word"),
    ("GET /v1?API_KEY=QWERTY123&x=1", "QWERTY123"),
    ("http://h/x;signature=abcdef99", "abcdef99"),
    ('{"Client_Secret": "cs-value-1"}', "cs-value-1"),
    ("PASSWD: hunter2hunter", "hunter2hunter"),
    ("refresh_token=rt-1234567", "rt-1234567"),
])
def test_shapes_are_masked_in_any_case(text, secret):
    out = Redactor().text(text)
    assert secret not in out and MASK in out


def test_plain_lines_pass_unchanged():
    line = '{"method":"item/agentMessage/delta","params":{"itemId":"msg_1","delta":"Hello there"}}'
    assert Redactor(["zzzzzzzz-not-here"]).text(line) == line


def test_known_value_in_every_form():
    value = "line-one-secret\nline-two-secret"
    r = Redactor([value])
    forms = [value, "line-two-secret", base64.b64encode(value.encode()).decode(), json.dumps(value)[1:-1],
             urllib.parse.quote(value, safe="")]
    for form in forms:
        assert r.text(f"x {form} y") == f"x {MASK} y"


def test_no_line_of_the_projected_config_reaches_an_event(tmp_path):
    """SPEC section 10: base URL, model and profile names may appear; no other config line."""
    from backends_helpers import environment, execute, mock_binary, request, workspace, write_projection

    secrets = write_projection(tmp_path, extra_toml='approval_note = "internal-only-setting"\n')
    config = (secrets / "codex" / "config.toml").read_text()
    snippet = [f"{n} | {line}" for n, line in enumerate(config.splitlines(), 1) if line.strip()]
    # Codex echoing config lines: in a configWarning, a warning, and the stderr tail of its exit.
    script = {"stderr": ["TOML parse error at line 7, column 1", *snippet], "on_turn": [
        {"method": "configWarning", "params": {"summary": "Invalid configuration:\n" + "\n".join(snippet)}},
        *({"method": "warning", "params": {"message": line}} for line in config.splitlines() if line.strip()),
        {"exit": 3}]}
    env = environment(tmp_path, mock_binary(tmp_path, script), secrets)
    _, events = execute(request(workspace(tmp_path)), env)
    text = json.dumps(events)
    for hidden in ('env_key = \\"FAKE_PROVIDER_API_KEY\\"', 'wire_api = \\"responses\\"',
                   'approval_note = \\"internal-only-setting\\"'):
        assert hidden not in text, hidden
    assert "http://127.0.0.1:9/v1" in text and "gpt-5.5" in text  # what may be shown still is


def test_the_run_log_never_follows_a_planted_symlink(tmp_path):
    from caldera.backends import runlog
    from caldera.errors import CommandError

    logs = tmp_path / "logs"
    logs.mkdir()
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep me\n")
    path = runlog.log_path(logs, "run-9")
    path.symlink_to(target)
    with pytest.raises(CommandError, match="symlink there is never followed"):
        runlog.RunLog(path, Redactor())
    assert target.read_text() == "keep me\n"


def test_triggers_behind_an_equals_sign_are_still_found_in_text_and_blocks():
    """The "=" gate skips the scans of sig= / signature= / token= only when no "=" is there."""
    r = Redactor()
    for line in ["https://h/p?sig=abcdefgh", "u?signature=abcdefgh", "a?token=abcdefgh&x=1", "k;SIG=abcdefgh"]:
        assert "abcdefgh" not in r.text(line) and "abcdefgh" not in r.text_lines(["no trigger here", line])
    assert r.text("plain words, no equals sign") == "plain words, no equals sign"


def test_the_stderr_summary_masks_before_it_cuts():
    # A secret straddling the 500-character cut must not leave its tail in the failure message.
    import collections

    from caldera.backends.codex.appserver import AppServer

    secret = "s3cr3t-" + "7h8I9j0K1l2M3n4O5p6q7R8s9" * 2
    server = AppServer.__new__(AppServer)  # only the summary's two fields are used
    server.threads, server.redactor = [], Redactor([secret])
    server.stderr_tail = collections.deque([secret + " " + "x" * (500 - len(secret) // 2)])
    summary = server.stderr_summary()
    assert len(summary) <= 500 and not any(secret[i:] in summary for i in range(len(secret) - 8))


def test_a_long_stderr_line_is_masked_whole(tmp_path):
    # A secret past the first 8 KiB of one stderr line: read as one record, masked as one.
    import collections
    import io

    from caldera.backends.codex.appserver import pump_stderr

    secret = "s3cr3t-" + "Q1w2E3r4T5y6U7i8O9p0" * 2
    line = ("x" * (8192 - 10) + secret + " and more\n").encode()
    tail = collections.deque()

    class Log:
        def __init__(self):
            self.records = []

        def write(self, channel, text):
            self.records.append(Redactor([secret]).text(text))

        def note(self, text):
            self.records.append(text)

    log = Log()
    pump_stderr(io.BytesIO(line), tail, log)
    assert len(log.records) == 1 and not any(secret[i:i + 12] in log.records[0] for i in range(len(secret) - 12))


@pytest.mark.parametrize("order", ["short-first", "long-first"])
def test_secrets_that_share_a_prefix_are_masked_whole(order):
    short, long = "gw-token-0123456789", "gw-token-0123456789-and-more-of-it"
    redactor = Redactor([short, long] if order == "short-first" else [long, short])
    text = redactor.text(f"a={long} b={short} c={base64.b64encode(long.encode()).decode()}")
    assert text == f"a={MASK} b={MASK} c={MASK}"  # never "[REDACTED]-and-more-of-it"


def test_a_prefix_secret_masks_the_whole_token_it_begins():
    # OpenCode's server password, route tokens and placeholders: one random prefix per process
    prefix = "0123456789abcdef0123456789abcdef"
    redactor = Redactor()
    redactor.add(prefix, prefix=True)
    text = redactor.text(f"pw={prefix}Xy_z-9Q route /r/{prefix}beef/chat caldera-secret-{prefix}0a1b")
    assert text == f"pw={MASK} route /r/{MASK}/chat caldera-secret-{MASK}"
    plain = Redactor([prefix])  # added as a plain value first: prefix=True still widens it
    plain.add(prefix, prefix=True)
    assert plain.text(f"{prefix}REST") == MASK


def _b64(data: bytes, urlsafe: bool) -> str:
    return (base64.urlsafe_b64encode if urlsafe else base64.b64encode)(data).decode()


@pytest.mark.parametrize("urlsafe", [False, True])
@pytest.mark.parametrize("lead", ["", "a", "ab"])  # the prefix at each byte alignment in the stream
@pytest.mark.parametrize("where", ["{}", '{{"data": "{}", "n": 1}}', "seen {} in the middle of a line"])
def test_a_run_token_in_base64_is_masked_at_every_alignment(urlsafe, lead, where):
    """A run token is "caldera-run-" + the process prefix + random characters: its base64's
    characters around the prefix depend on the bytes next to it, so the prefix's own base64
    matched only some tokens' base64 (512 of 600 were left whole)."""
    prefix = process_secret()
    redactor = Redactor()
    redactor.add(prefix, prefix=True)
    before = len((lead + "caldera-run-").encode())
    cut = -(-8 * before // 6)  # the first character made of the prefix's bytes alone
    for _ in range(30):
        blob = _b64((lead + run_token()).encode(), urlsafe)
        assert redactor.text(where.format(blob)) == where.format(blob[:cut] + MASK)


def test_ordinary_base64_of_a_run_tokens_length_is_not_masked():
    redactor = Redactor()
    redactor.add(process_secret(), prefix=True)
    length = len(run_token())
    for urlsafe in (False, True):
        for _ in range(200):
            blob = _b64(os.urandom(length), urlsafe)
            assert redactor.text(f"seen {blob}") == f"seen {blob}"


def test_a_prefix_added_again_as_a_plain_value_still_masks_a_whole_base64_blob():
    prefix = "0123456789abcdef0123456789abcdef"
    redactor = Redactor()
    redactor.add(prefix, prefix=True)
    redactor.add(prefix)  # its own base64 forms, longer than its heads, must not come back first
    blob = base64.b64encode(f"{prefix}{'z' * 30}".encode()).decode()
    assert redactor.text(f"x {blob} y") == f"x {MASK} y"
