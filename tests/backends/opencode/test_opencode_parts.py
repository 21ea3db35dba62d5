"""The OpenCode backend's parts without the OpenCode binary: where the provider comes from
and the model rule, the config OpenCode gets, the forwarder (against a real loopback
upstream), the policy's rules, the event mapping and failure kinds, the server owner
(with a stand-in binary that only says it listens), the binary and AGENTS.md lookups."""
from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from backends_fake_chat import FakeChat as FakeChatProvider
from backends_proxy import PROXIES
from opencode_helpers import CANARY, KEY_ENV, opencode_json, write_projection

from caldera import errors
from caldera.backends import base, registry
from caldera.backends import failures as fk
from caldera.backends.base import Policy
from caldera.backends.events import EventSink
from caldera.backends.forwarder import Failure
from caldera.backends.opencode import confine, driver, policy, project, provider, route, server
from caldera.backends.opencode.mapping import TurnMapper, classify_error, retry_kind, turn_outcome
from caldera.backends.opencode.owner import ServerOwner
from caldera.backends.opencode.route import ProviderRoutes, process_secret
from caldera.backends.registry import Refused
from caldera.protocol.llm import EXTERNAL, GATEWAY
from caldera.redact import Redactor

# ---------------------------------------------------------------- provider and model


def test_projection_env_references_are_resolved_and_every_value_is_a_secret(tmp_path):
    config = opencode_json("http://127.0.0.1:9/v1")
    config["provider"]["fake"]["options"]["headers"] = {"X-Org": "org-literal-123"}
    sec = write_projection(tmp_path, "", config=config)
    spec = provider.plan_server({}, str(sec), None)
    assert spec.source == "projection" and spec.default_model == "fake/fake-model"
    assert spec.providers["fake"]["options"]["apiKey"] == CANARY
    assert CANARY in spec.secrets and "org-literal-123" in spec.secrets
    assert spec.base_url("fake") == "http://127.0.0.1:9/v1"


@pytest.mark.parametrize("mutate,kind,words", [
    (lambda d, h: (h / "env" / KEY_ENV).unlink(), fk.SECRET_UNAVAILABLE, f"env/{KEY_ENV}"),
    (lambda d, h: (h / "opencode.json").write_text("{\n  \"provider\": sk-not-json}"), fk.BACKEND_FAILED, "line 2"),
    (lambda d, h: (h / "opencode.json").write_text(json.dumps(dict(d, provider={"x": {"options": {
        "apiKey": "{file:/etc/shadow}", "baseURL": "http://h/v1"}}}))), fk.BACKEND_FAILED, "{file:"),
    (lambda d, h: (h / "opencode.json").write_text(json.dumps(dict(d, provider={"x": {"options": {}}}))),
     fk.BACKEND_FAILED, "options.baseURL"),
    (lambda d, h: (h / "opencode.json").unlink(), fk.SECRET_UNAVAILABLE, "opencode.json is missing"),
], ids=["missing-env-file", "bad-json", "file-reference", "no-base-url", "env-without-config"])
def test_projection_problems_are_named_before_anything_starts(tmp_path, mutate, kind, words):
    sec = write_projection(tmp_path, "http://127.0.0.1:9/v1")
    mutate(opencode_json("http://127.0.0.1:9/v1"), sec / "opencode")
    with pytest.raises(fk.BackendFailure) as err:
        provider.plan_server({}, str(sec), None)
    assert err.value.kind == kind and words in err.value.message
    assert "sk-not-json" not in err.value.message  # the config's content is never quoted


def test_systemd_credentials_flat_names(tmp_path):
    (tmp_path / "opencode_opencode.json").write_text(json.dumps(opencode_json("http://127.0.0.1:9/v1")))
    (tmp_path / f"opencode_env_{KEY_ENV}").write_text(CANARY + "\n")
    spec = provider.plan_server({}, str(tmp_path / "none"), str(tmp_path))
    assert spec.providers["fake"]["options"]["apiKey"] == CANARY
    assert spec.label == "$CREDENTIALS_DIRECTORY/opencode.json"


CM_CONTENT = json.dumps({"provider": {"clawmanager": {
    "npm": "@ai-sdk/openai-compatible", "options": {"baseURL": "{env:CLAWMANAGER_LLM_BASE_URL}",
                                                    "apiKey": "{env:CLAWMANAGER_LLM_API_KEY}"},
    "models": {"auto": {}}}}, "model": "clawmanager/auto"})


def test_clawmanager_config_content_takes_its_values_from_the_runtime_environment():
    environ = {"OPENCODE_CONFIG_CONTENT": CM_CONTENT, "CLAWMANAGER_LLM_BASE_URL": "http://gw.example/api/v1/gateway/llm",
               "CLAWMANAGER_LLM_API_KEY": "gw-token-123456", "CLAWMANAGER_LLM_MODEL": '["auto","gpt-4.1"]',
               "OPENAI_MODEL": "auto"}
    spec = provider.plan_server(environ, None, None)
    assert spec.source == "opencode-config-content" and spec.secrets == ("gw-token-123456",)
    assert spec.models("clawmanager") == ["auto", "gpt-4.1"] and spec.catalogue == ("auto", "gpt-4.1")
    assert provider.choose_model(spec, environ, None) == ("clawmanager", "auto")
    assert provider.choose_model(spec, environ, "clawmanager/gpt-4.1") == ("clawmanager", "gpt-4.1")
    with pytest.raises(errors.Refused, match="auto, gpt-4.1"):  # config.Gateway's rule: the run is blocked
        provider.choose_model(spec, environ, "gpt-5")
    without = dict(environ)
    del without["CLAWMANAGER_LLM_BASE_URL"]
    with pytest.raises(fk.BackendFailure) as err:
        provider.plan_server(without, None, None)
    assert err.value.kind == fk.SECRET_UNAVAILABLE and "CLAWMANAGER_LLM_BASE_URL" in err.value.message


def test_the_projection_wins_over_clawmanagers_config_content_and_the_gateway(tmp_path):
    environ = {"OPENCODE_CONFIG_CONTENT": CM_CONTENT, "CLAWMANAGER_LLM_BASE_URL": "http://gw.example/v1",
               "CLAWMANAGER_LLM_API_KEY": "gw-token-123456"}
    spec = provider.plan_server(environ, str(write_projection(tmp_path, "http://127.0.0.1:9/v1")), None)
    assert spec.source == "projection" and list(spec.providers) == ["fake"] and "gw-token-123456" not in spec.secrets
    assert provider.plan_server(environ, str(tmp_path / "none"), None).source == "opencode-config-content"
    del environ["OPENCODE_CONFIG_CONTENT"]
    assert provider.plan_server(environ, str(tmp_path / "none"), None).source == "gateway"


def test_the_gateway_variables_build_a_provider_and_nothing_at_all_is_secret_unavailable():
    environ = {"CLAWMANAGER_LLM_BASE_URL": "https://gw.example/v1", "CLAWMANAGER_LLM_API_KEY": "gw-token-123456"}
    spec = provider.plan_server(environ, None, None, requested_model="gpt-4.1")
    assert spec.source == "gateway" and spec.default_model == "clawmanager/auto"
    assert spec.models("clawmanager") == ["auto", "gpt-4.1"]  # no catalogue: the requested one is declared
    with pytest.raises(fk.BackendFailure) as err:
        provider.plan_server({}, None, None)
    assert err.value.kind == fk.SECRET_UNAVAILABLE and "CLAWMANAGER_LLM_BASE_URL" in err.value.message


def test_the_gateway_model_rule_is_configs_and_a_catalogue_that_is_no_json_list_is_ignored():
    """The model of a run on the gateway is config.Gateway's (issue 34): a CLAWMANAGER_LLM_MODEL
    that is not a JSON list is no catalogue (it was a one-model catalogue in OpenCode's copy)."""
    environ = {"CLAWMANAGER_LLM_BASE_URL": "https://gw.example/v1", "CLAWMANAGER_LLM_API_KEY": "gw-token-123456",
               "CLAWMANAGER_LLM_MODEL": "gpt-4.1"}
    spec = provider.plan_server(environ, None, None, requested_model="o3")
    assert spec.catalogue is None and provider.choose_model(spec, environ, "o3") == ("clawmanager", "o3")
    listed = dict(environ, CLAWMANAGER_LLM_MODEL='["auto","gpt-4.1"]', OPENAI_MODEL="gpt-4.1")
    spec = provider.plan_server(listed, None, None)
    assert provider.choose_model(spec, listed, None) == ("clawmanager", "gpt-4.1")
    with pytest.raises(errors.Refused) as err:
        provider.choose_model(spec, listed, "o3")
    assert str(err.value) == ("model 'o3' is not in the AI gateway's catalogue (CLAWMANAGER_LLM_MODEL: "
                              "auto, gpt-4.1)")


def test_a_projection_model_must_be_one_it_declares(tmp_path):
    spec = provider.plan_server({}, str(write_projection(tmp_path, "http://127.0.0.1:9/v1")), None)
    assert provider.choose_model(spec, {}, None) == ("fake", "fake-model")
    assert provider.choose_model(spec, {}, "fake/fake-model") == ("fake", "fake-model")
    with pytest.raises(Refused, match="fake-model"):  # the run is blocked
        provider.choose_model(spec, {}, "gpt-4.1")


# ---------------------------------------------------------------- the config OpenCode gets, the forwarder

def _spec(base_url: str, **headers: str) -> provider.ServerSpec:
    config = opencode_json(base_url)
    if headers:
        config["provider"]["fake"]["options"]["headers"] = headers
    return provider._from_config(config, {KEY_ENV: CANARY}.get, {CANARY}, "projection", "test", "env/{}")


def test_the_rendered_config_holds_placeholders_and_the_forwarder_not_the_secrets(monkeypatch):
    for name in PROXIES:  # the routes choose the proxy from the runtime's environment: none here
        monkeypatch.delenv(name, raising=False)
    spec = _spec("https://user:pw-in-url@api.example/v1", **{"X-Api-Key": CANARY})
    routes = ProviderRoutes({"fake": "https://user:pw-in-url@api.example/v1"}, spec.secrets)
    rendered = json.dumps(server.render_config(spec, routes, "http://127.0.0.1:4321"))
    assert CANARY not in rendered and "pw-in-url" not in rendered and "api.example" not in rendered
    doc = json.loads(rendered)
    options = doc["provider"]["fake"]["options"]
    assert options["baseURL"] == "http://127.0.0.1:4321" + routes.path_for("fake")
    assert options["apiKey"] == _placeholder(routes, CANARY)
    assert doc["enabled_providers"] == ["fake"] and doc["mcp"] == {} and doc["plugin"] == []
    assert doc["model"] == doc["small_model"] == "fake/fake-model"


def _placeholder(routes: ProviderRoutes, value: str) -> str:
    """What OpenCode is given in place of the secret `value`."""
    [placeholder] = [p for p, v in routes.placeholders.items() if v == value]
    return placeholder


@contextlib.contextmanager
def _forwarding(base_urls: dict[str, str], secret_values: list[str]) -> Iterator[tuple[ProviderRoutes, Any]]:
    """OpenCode's routes on the shared forwarder, as a server starts them."""
    routes = ProviderRoutes(base_urls, secret_values)
    fwd = route.forwarder(routes)
    fwd.start()
    try:
        yield routes, fwd
    finally:
        fwd.close()


def _post(port: int, path: str, headers: dict[str, str], body: bytes = b"{}",
          method: str = "POST") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=dict(headers, **{"Content-Type": "application/json"}))
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def test_the_forwarder_adds_the_key_streams_the_answer_and_refuses_other_paths():
    with FakeChatProvider([{"text": "streamed through"}]) as upstream, \
            _forwarding({"fake": upstream.url}, [CANARY]) as (routes, fwd):
        placeholder = _placeholder(routes, CANARY)
        body = json.dumps({"model": "fake-model", "stream": True, "stream_options": {"include_usage": True}})
        status, raw = _post(fwd.port, routes.path_for("fake") + "/chat/completions",
                            {"Authorization": f"Bearer {placeholder}", "x-session-id": "ses_1"}, body.encode())
        assert status == 200 and b"streamed through"[:16] in raw and b"[DONE]" in raw
        seen = upstream.main[0]
        assert seen["path"] == "/v1/chat/completions" and seen["headers"]["authorization"] == f"Bearer {CANARY}"
        token = routes.path_for("fake")[len(route.PREFIX):]
        for path, method in (("/v1/chat/completions", "POST"), (f"/r/{token}x/chat/completions", "POST"),
                             (f"/r/{token[:-1]}/chat/completions", "POST"), (f"/x/{token}/chat/completions", "POST"),
                             (f"/r/{token}/chat/completions", "PUT"), (f"/r/{token}/chat/completions", "DELETE")):
            status, raw = _post(fwd.port, path, {"Authorization": f"Bearer {placeholder}"}, method=method)
            assert status == 404 and json.loads(raw)["error"]["type"] == "not_found_error", (path, method)
        assert len(upstream.requests) == 1  # no open relay


def test_placeholders_are_filled_in_any_header_and_the_query_and_url_credentials_go_as_basic_auth():
    odd = "q&v= /%+key"  # a secret a query must carry percent-encoded
    with FakeChatProvider([{"text": "ok"}]) as upstream:
        url = upstream.url.replace("http://", "http://us%3Aer:p%40ss@")
        with _forwarding({"fake": url, "same": url}, [CANARY, odd]) as (routes, fwd):
            assert routes.path_for("fake") == routes.path_for("same")  # one route per base URL
            key, other = _placeholder(routes, CANARY), _placeholder(routes, odd)
            body = json.dumps({"model": "fake-model"}).encode()
            target = f"{routes.path_for('fake')}/chat/completions?key={other}&v=1&again={other}"
            assert _post(fwd.port, target, {"X-Custom": f"pre-{key}-post", "X-Plain": "nothing"}, body)[0] == 200
            assert _post(fwd.port, routes.path_for("fake") + "/chat/completions",
                         {"Authorization": f"Bearer {key}"}, body)[0] == 200
    first, second = upstream.main
    quoted = urllib.parse.quote(odd, safe="")
    assert first["path"] == f"/v1/chat/completions?key={quoted}&v=1&again={quoted}"
    assert urllib.parse.parse_qs(first["path"].split("?", 1)[1])["key"] == [odd]
    assert first["headers"]["x-custom"] == f"pre-{CANARY}-post" and first["headers"]["x-plain"] == "nothing"
    assert first["headers"]["authorization"] == "Basic " + base64.b64encode(b"us:er:p@ss").decode()
    assert second["headers"]["authorization"] == f"Bearer {CANARY}"  # the request's own wins
    assert "caldera-secret-" not in json.dumps(upstream.requests)


def test_the_forwarder_takes_a_chunked_request_body_and_asks_for_no_compression():
    with FakeChatProvider([{"text": "ok"}]) as upstream, _forwarding({"fake": upstream.url}, [CANARY]) as (routes, fwd):
        body = json.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "x" * 5000}]}).encode()
        conn = http.client.HTTPConnection("127.0.0.1", fwd.port, timeout=30)
        conn.request("POST", routes.path_for("fake") + "/chat/completions", body=iter([body[:100], body[100:]]),
                     headers={"Content-Type": "application/json", "Accept-Encoding": "gzip, br"},
                     encode_chunked=True)
        assert conn.getresponse().status == 200
        conn.close()
        assert upstream.main[0]["body"] == body.decode()
        assert upstream.main[0]["headers"]["accept-encoding"] == "identity"


@pytest.mark.parametrize("chunked", [False, True])
def test_the_forwarder_masks_the_servers_password_and_route_tokens_in_a_request_body(chunked):
    # OpenCode's read tool follows a symlink to /proc/self/environ: the password would reach the model
    password = process_secret() + "AbC-123_xyz"
    with FakeChatProvider([{"text": "ok"}]) as upstream, _forwarding({"fake": upstream.url}, [CANARY]) as (routes, fwd):
        token = routes.path_for("fake")[len(route.PREFIX):]
        content = f"OPENCODE_SERVER_PASSWORD={password}\u0000route={token}/x " + "y" * 200_000
        body = json.dumps({"model": "fake-model", "messages": [{"role": "tool", "content": content}]}).encode()
        conn = http.client.HTTPConnection("127.0.0.1", fwd.port, timeout=30)
        conn.request("POST", routes.path_for("fake") + "/chat/completions",
                     body=iter([body[:100], body[100:]]) if chunked else body,
                     headers={"Content-Type": "application/json"}, encode_chunked=chunked)
        assert conn.getresponse().status == 200
        conn.close()
    seen = upstream.main[0]["body"]
    assert process_secret() not in seen and "AbC-123" not in seen and token not in seen
    assert json.loads(seen)["messages"][0]["content"].startswith(
        "OPENCODE_SERVER_PASSWORD=[REDACTED]\u0000route=[REDACTED]/x yyy")


def test_the_forwarder_records_failures_per_session_and_answers_a_dead_provider_with_502():
    with FakeChatProvider([{"status": 503, "body": {"error": {"message": "Service Unavailable"}}}]) as upstream, \
            _forwarding({"fake": upstream.url, "dead": "http://127.0.0.1:9/v1"}, [CANARY]) as (routes, fwd):
        answers = [_post(fwd.port, routes.path_for(pid) + "/chat/completions", {"x-session-id": session},
                         json.dumps({"model": "fake-model"}).encode())
                   for pid, session in (("fake", "ses_a"), ("dead", "ses_b"))]
        assert fwd.last_failure("ses_a") == Failure(503, '{"error": {"message": "Service Unavailable"}}')
        dead = fwd.last_failure("ses_b")
        assert dead is not None and dead.status is None
        assert "cannot reach the provider at 127.0.0.1:9" in dead.message
    assert answers[0][0] == 503 and answers[1][0] == 502
    assert "cannot be reached" in json.loads(answers[1][1])["error"]["message"]


def test_cutting_a_session_ends_its_request_on_a_silent_provider():
    with FakeChatProvider([{"stall": 120}]) as upstream, _forwarding({"fake": upstream.url}, []) as (routes, fwd):
        box: dict[str, Any] = {}
        body = json.dumps({"model": "fake-model"}).encode()

        def stalled() -> None:
            try:
                box["out"] = _post(fwd.port, routes.path_for("fake") + "/chat/completions",
                                   {"x-session-id": "ses_s"}, body)[0]
            except http.client.IncompleteRead:
                box["out"] = "cut short"

        thread = threading.Thread(target=stalled)
        thread.start()
        assert upstream.wait_main(1)
        fwd.cut("ses_s")
        thread.join(30)
        # ended at the cut, not after the provider's 120 s: with the provider's headers relayed
        # (the body cut short: no last chunk) or, when the cut came first, a 502 from the forwarder
        assert not thread.is_alive() and box["out"] in ("cut short", 502)
        failure = fwd.last_failure("ses_s")
        assert failure is not None and failure.status is None and "cut by the runtime" in failure.message


# ---------------------------------------------------------------- policy

@pytest.mark.parametrize("pol,confined,denied,asked", [
    (Policy(60), True, {"question", "task", "webfetch", "websearch", "codesearch"}, set()),
    (Policy(60), False, {"question", "task", "bash", "webfetch", "websearch", "codesearch"}, set()),
    (Policy(60, network=True), True, {"question", "task"}, set()),
    (Policy(60, network=True), False, {"question", "task", "bash"}, set()),
    (Policy(60, sandbox="read-only"), True,
     {"question", "task", "edit", "bash", "webfetch", "websearch", "codesearch"}, set()),
    (Policy(60, sandbox="read-only", approval="on-request", network=True), True, {"question", "task"},
     {"edit", "bash"}),
    (Policy(60, sandbox="read-only", approval="on-request", network=True), False, {"question", "task", "bash"},
     {"edit"}),
], ids=["default", "default-unconfined", "network", "network-unconfined", "read-only", "read-only-asks",
        "read-only-asks-unconfined"])
def test_policy_rules(pol, confined, denied, asked):
    rules = policy.rules(pol, confined)
    assert {r["permission"] for r in rules if r["action"] == "deny"} == denied
    assert {r["permission"] for r in rules if r["action"] == "ask"} == asked
    assert all(r["pattern"] == "*" for r in rules)


def test_without_ripgrep_grep_and_glob_are_denied():
    denied = {r["permission"] for r in policy.rules(Policy(60), True, search=False) if r["action"] == "deny"}
    assert {"grep", "glob"} <= denied and "bash" not in denied
    assert "denied" in policy.search(False) and policy.search(True) == "ripgrep"

def test_without_bubblewrap_nothing_confines_commands(tmp_path):
    (tmp_path / "bash").symlink_to("/bin/bash")
    (tmp_path / "true").symlink_to("/bin/true")  # no bwrap on this PATH
    assert confine.plan([str(tmp_path)], [], [], False, str(tmp_path)) is None
    assert "denied" in policy.commands(Policy(60), confined=False)



def test_where_bubblewrap_cannot_nest_in_the_servers_sandbox_commands_are_denied(tmp_path, monkeypatch):
    # the server would run unconfined: its write tool follows a symlink to the wrapper in its dir
    bwrap = shutil.which("bwrap")
    if bwrap is None or not confine.works(bwrap, shutil.which("true") or "/bin/true"):
        pytest.skip("bubblewrap cannot start here")
    path = os.path.dirname(bwrap) + ":/usr/bin:/bin"
    assert confine.plan([str(tmp_path)], [], [], False, path) is not None
    from caldera.backends import confine as shared  # the probes userns_here asks

    monkeypatch.setattr(shared, "nests", lambda bwrap, true, userns=(): False)
    assert confine.plan([str(tmp_path)], [], [], False, path) is None
    assert "cannot nest" in policy.commands(Policy(60), confined=False)


def _pairs(argv: list[str], flag: str) -> list[int]:
    return [i for i, a in enumerate(argv) if a == flag]


def test_the_sandbox_covers_the_runtimes_roots_hides_secrets_and_binds_roots_read_only(tmp_path):
    agents = tmp_path / "etc" / "agents" / "a1"
    (agents / "secrets").mkdir(parents=True)
    (agents / "secrets.env").write_text("CALDERA_TOKEN=x\n")
    state = tmp_path / "var" / "a1"
    (state / "runs").mkdir(parents=True)
    hidden = confine.private_paths(str(agents / "secrets"), str(state), None)
    assert {str(tmp_path / "etc"), str(agents / "secrets"), str(agents / "secrets.env"), str(state)} <= set(hidden)
    with pytest.raises(fk.BackendFailure, match="one of the runtime's roots"):  # a root that IS the state root
        confine.Confinement(bwrap="/usr/bin/bwrap", shell="/bin/bash", roots=(str(tmp_path / "var"),),
                            covered=(str(tmp_path / "var"),), hidden=tuple(hidden), network=False).argv("/srv")
    # a root above the runtime's roots: allowed, they are covered again inside it
    box = confine.Confinement(bwrap="/usr/bin/bwrap", shell="/bin/bash", roots=(str(tmp_path),),
                              covered=("/usr/share", str(tmp_path / "var")), hidden=tuple(hidden), network=False)
    server_dir = str(state / "runs" / ".opencode-x")
    before, after = box.argv(server_dir)
    for flag in ("--cap-drop", "--new-session", "--unshare-ipc", "--unshare-pid"):
        assert flag in before
    assert before[before.index("--cap-drop") + 1] == "ALL"
    tmpfs = [before[i + 1] for i in _pairs(before, "--tmpfs")]
    assert {"/tmp", "/run", "/usr/share", str(state)} <= set(tmpfs)  # a state root like /var/lib/caldera: covered
    assert server_dir not in tmpfs and str(tmp_path / "var") not in tmpfs  # inside /tmp: one tmpfs covers them
    ro = [before[i + 1] for i in _pairs(before, "--ro-bind")]
    assert ro[0] == "/" and str(tmp_path) in ro and "--bind" not in before  # roots: read-only
    # covered and hidden again after the workspace's bind: the other agents' state, the config root
    assert after[0] == after[2] == "--tmpfs" and {after[1], after[3]} == {str(tmp_path / "etc"), str(tmp_path / "var")}
    assert ["--dir", f"{server_dir}/home"] == after[after.index("--dir"):after.index("--dir") + 2]  # made again
    assert "--unshare-net" in after and after[-2:] == ["--", "/bin/bash"]
    networked = confine.Confinement(box.bwrap, box.shell, box.roots, box.covered, box.hidden, network=True)
    assert "--unshare-net" not in networked.argv(server_dir)[1]


def test_the_servers_own_sandbox_covers_the_same_roots_and_keeps_the_network(tmp_path):
    state = tmp_path / "var" / "a1"
    (state / "runs").mkdir(parents=True)
    roots = (str(tmp_path / "ws"),)
    box = confine.Confinement(bwrap="/usr/bin/bwrap", shell="/bin/bash", roots=roots, covered=("/usr/share",),
                              hidden=(str(state),), network=False, server=True)
    server_dir = str(state / "runs" / ".opencode-x")
    argv = box.server_argv(server_dir, "/opt/oc/bin/opencode")
    assert argv[-1] == "--" and "--unshare-net" not in argv and "--cap-drop" not in argv  # commands nest in it
    tmpfs = [argv[i + 1] for i in _pairs(argv, "--tmpfs")]
    assert {"/tmp", "/run", "/usr/share", str(state)} <= set(tmpfs) and "--unshare-pid" in argv
    binds = [argv[i + 1] for i in _pairs(argv, "--bind")]
    assert binds == [*roots, server_dir]  # the workspace roots and, last, its own dir (in a hidden state dir)
    read_only = [argv[i + 1] for i in _pairs(argv, "--ro-bind")]  # its wrapper, workspaces list, config: after it
    assert read_only[-6:] == [f"{server_dir}/{name}"
                              for name in ("bin", "config", "home", "opencode.json", ".owner", "server.json")]
    assert argv.index("--bind") > max(_pairs(argv, "--tmpfs"))
    assert "/opt/oc/bin/opencode" in [argv[i + 1] for i in _pairs(argv, "--ro-bind-try")]

def test_the_wrapper_binds_only_an_admitted_workspace_and_drops_the_password(tmp_path):
    box = confine.Confinement(bwrap="/usr/bin/bwrap", shell="/bin/bash", roots=(), covered=(), hidden=(), network=False)
    server_dir = tmp_path / ".opencode-x"
    (server_dir / "bin").mkdir(parents=True)
    wrapper = server_dir / "bin" / "bash"
    fake = tmp_path / "bwrap"  # prints its arguments instead of running the sandbox
    fake.write_text('#!/bin/sh\necho "pw=${OPENCODE_SERVER_PASSWORD:-none}"; for a; do echo "$a"; done\n')
    fake.chmod(0o755)
    wrapper.write_text(box.wrapper(str(server_dir)).replace("/usr/bin/bwrap", str(fake)))
    wrapper.chmod(0o700)
    admitted = confine.Admitted(server_dir)
    one, two = tmp_path / "ws one", tmp_path / "ws one" / "two"
    two.mkdir(parents=True)

    def run(cwd: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(wrapper), "-c", "true"], cwd=cwd, capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin", "OPENCODE_SERVER_PASSWORD": "pw-77"}, timeout=10)

    refused = run(two)
    assert refused.returncode == 126 and "refused" in refused.stderr and "pw-77" not in refused.stdout
    entry = admitted.admit(str(one), writable=True)
    inner = admitted.admit(str(two), writable=False)
    lines = run(two).stdout.splitlines()
    assert lines[0] == "pw=none" and lines[-2:] == ["-c", "true"]
    at = lines.index("--ro-bind", 4)
    assert lines[at:at + 3] == ["--ro-bind", str(two), str(two)]  # the innermost admitted one, as admitted
    lines = run(one).stdout.splitlines()
    assert ["--bind", str(one), str(one)] == lines[lines.index("--bind"):lines.index("--bind") + 3]
    admitted.dismiss(entry)
    admitted.dismiss(inner)
    assert run(one).returncode == 126 and (server_dir / "bin" / "workspaces").read_text() == ""


# ---------------------------------------------------------------- failure kinds

@pytest.mark.parametrize("error,upstream,kind", [
    ({"name": "APIError", "data": {"message": "x", "statusCode": 401, "isRetryable": False}}, None,
     fk.PROVIDER_AUTH_FAILED),
    ({"name": "APIError", "data": {"message": "x", "statusCode": 403}}, None, fk.PROVIDER_AUTH_FAILED),
    ({"name": "APIError", "data": {"message": "x", "statusCode": 429, "isRetryable": True}}, None,
     fk.PROVIDER_RATE_LIMITED),
    ({"name": "APIError", "data": {"message": "temporarily unavailable", "statusCode": 404}}, None, fk.BACKEND_FAILED),
    ({"name": "APIError", "data": {"message": "Service Unavailable", "statusCode": 503}}, None,
     fk.PROVIDER_UNAVAILABLE),
    ({"name": "APIError", "data": {"message": "Cannot connect to API: ECONNREFUSED", "isRetryable": True}}, None,
     fk.PROVIDER_UNAVAILABLE),
    ({"name": "APIError", "data": {"message": "weird"}}, Failure(502, "bad gateway"), fk.PROVIDER_UNAVAILABLE),
    ({"name": "UnknownError", "data": {"message": "broke"}}, Failure(401, "no"), fk.PROVIDER_AUTH_FAILED),
    ({"name": "ProviderAuthError", "data": {"message": "no key"}}, None, fk.PROVIDER_AUTH_FAILED),
    ({"name": "UnknownError", "data": {"message": "Model not found: x/y. Did you mean: z?"}}, None, fk.BACKEND_FAILED),
    ({"name": "MessageOutputLengthError", "data": {}}, None, fk.BACKEND_FAILED),
    ("not an object", None, fk.BACKEND_FAILED),
])
def test_classify_error(error, upstream, kind):
    assert classify_error(error, upstream)[0] == kind


def test_an_error_message_loses_its_stack_trace():
    kind, message = classify_error({"name": "UnknownError", "data": {
        "message": "ProviderModelNotFoundError: Model not found: nope/x.\n"
                   "    at <anonymous> (/$bunfs/root/chunk.js:1:2)"}})
    assert message == "UnknownError: ProviderModelNotFoundError: Model not found: nope/x."


@pytest.mark.parametrize("message,upstream,kind", [
    ("Rate limit reached", None, fk.PROVIDER_RATE_LIMITED),
    ("Service Unavailable: {}", None, fk.PROVIDER_UNAVAILABLE),
    ("HTTP 502", None, fk.PROVIDER_UNAVAILABLE),
    ("something odd", None, fk.PROVIDER_UNAVAILABLE),
    ("something odd", Failure(429, ""), fk.PROVIDER_RATE_LIMITED),
])
def test_retry_kind(message, upstream, kind):
    assert retry_kind(message, upstream) == kind


# ---------------------------------------------------------------- the event mapping

def _ev(kind: str, **props: Any) -> dict[str, Any]:
    return {"type": kind, "properties": props}


def _part(session: str = "ses_1", **part: Any) -> dict[str, Any]:
    return _ev("message.part.updated", sessionID=session, part=dict(part, sessionID=session))


def _mapper() -> tuple[TurnMapper, list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []
    redactor = Redactor([CANARY])
    return TurnMapper(EventSink("r1", redactor, listeners=[seen.append]), "ses_1"), seen


def test_mapping_a_turn_with_text_a_command_a_rejected_call_a_child_session_and_usage():
    mapper, seen = _mapper()
    feed = [
        _part(id="p0", type="text", text="the prompt", messageID="m_user"),  # the user's part: no time
        _ev("session.status", sessionID="ses_1", status={"type": "busy"}),
        _part(id="p1", type="tool", tool="bash", messageID="m1", state={"status": "pending", "input": {}}),
        _part(id="p1", type="tool", tool="bash", messageID="m1",
              state={"status": "running", "input": {"command": "env"}, "time": {"start": 1000}}),
        _part(id="p1", type="tool", tool="bash", messageID="m1", state={
            "status": "completed", "input": {"command": "env"}, "output": f"KEY={CANARY}\n",
            "metadata": {"exit": 0}, "time": {"start": 1000, "end": 1250}}),
        _part(id="p2", type="tool", tool="bash", messageID="m1", state={
            "status": "error", "input": {"command": "rm -rf /"},
            "error": "The user rejected permission to use this specific tool call with the following feedback: no"}),
        _part(id="s1", type="step-finish", reason="tool-calls", messageID="m1",
              tokens={"input": 10, "output": 5, "reasoning": 0, "total": 15, "cache": {"read": 2, "write": 0}}),
        _ev("session.created", sessionID="ses_child", info={"id": "ses_child", "parentID": "ses_1"}),
        _part("ses_child", id="c1", type="tool", tool="read", messageID="mc",
              state={"status": "completed", "input": {"filePath": "a.py"}, "output": "x"}),
        _part("ses_other", id="o1", type="text", text="not ours", messageID="mo", time={"start": 1, "end": 2}),
        _part(id="t1", type="text", text="All done.", messageID="m2", time={"start": 1}),
        _part(id="t1", type="text", text="All done.", messageID="m2", time={"start": 1, "end": 2}),
        _part(id="s2", type="step-finish", reason="stop", messageID="m2",
              tokens={"input": 20, "output": 3, "reasoning": 1, "total": 23, "cache": {"read": 0, "write": 0}}),
        _ev("session.idle", sessionID="ses_1"),
    ]
    actions = [mapper.handle(e) for e in feed]
    assert actions == [None] * len(feed)
    assert mapper.idle and mapper.steps == 2 and mapper.retries == 0
    kinds = [(e["type"], e["data"].get("status")) for e in seen]
    assert kinds == [("tool_call", "started"), ("tool_call", "completed"), ("command_output", "completed"),
                     ("tool_call", "declined"), ("command_output", "declined"), ("tool_call", "completed"),
                     ("assistant_message", None)]
    output = seen[2]["data"]
    assert output["output"] == "KEY=[REDACTED]\n" and output["exit_code"] == 0 and output["duration_ms"] == 250
    assert seen[5]["data"]["tool"] == "dynamic" and seen[5]["data"]["name"] == "read"  # the child's call
    assert seen[6]["data"]["text"] == "All done."
    assert mapper.usage == {"inputTokens": 30, "outputTokens": 8, "reasoningOutputTokens": 1,
                            "cachedInputTokens": 2, "totalTokens": 38}
    assert turn_outcome(mapper, None, None, "fake/fake-model") == ("completed", None, None)


def test_a_broken_off_answer_is_a_retry_and_idle_without_an_answer_is_a_failure():
    mapper, seen = _mapper()
    mapper.handle(_ev("session.status", sessionID="ses_1", status={"type": "busy"}))
    action = mapper.handle(_part(id="s1", type="step-finish", reason="unknown", messageID="m1",
                                 tokens={"input": 0, "output": 0, "total": 0}))
    assert action == ("cut", mapper.tools.get("s1") or action[1]) and mapper.retries == 1
    assert mapper.handle(_ev("session.status", sessionID="ses_1", status={"type": "retry", "attempt": 1,
                                                                          "message": "x"}))[0] == "retry"
    mapper.handle(_ev("session.idle", sessionID="ses_1"))
    status, kind, message = turn_outcome(mapper, None, None, "fake/fake-model")
    assert (status, kind) == ("failed", fk.BACKEND_FAILED) and "without an answer from fake/fake-model" in message


def test_failures_are_counted_in_a_row_and_a_whole_answer_ends_the_count():
    mapper, _ = _mapper()
    retry = _ev("session.status", sessionID="ses_1", status={"type": "retry", "attempt": 1, "message": "x"})
    cut = _part(id="s1", type="step-finish", reason="unknown", messageID="m1", tokens={"total": 0})
    assert mapper.handle(retry)[0] == "retry" and mapper.handle(cut)[0] == "cut" and mapper.retries == 2
    mapper.handle(_part(id="t1", type="text", text="ok", messageID="m2", time={"start": 1, "end": 2}))
    assert mapper.handle(_part(id="s2", type="step-finish", reason="stop", messageID="m2")) is None
    assert mapper.retries == 0 and mapper.steps == 1
    assert mapper.handle(retry)[0] == "retry" and mapper.retries == 1


def test_idle_before_the_session_did_anything_is_not_the_end_and_errors_are_kept():
    mapper, _ = _mapper()
    mapper.handle(_ev("session.idle", sessionID="ses_1"))
    assert not mapper.idle
    mapper.handle(_ev("session.error", sessionID="ses_1", error={"name": "APIError", "data": {"statusCode": 429}}))
    mapper.handle(_ev("session.error", sessionID="ses_1", error={"name": "Later"}))
    mapper.handle(_ev("session.status", sessionID="ses_1", status={"type": "idle"}))
    assert mapper.idle
    assert turn_outcome(mapper, None, None, "m")[:2] == ("failed", fk.PROVIDER_RATE_LIMITED)
    ours = (fk.PROVIDER_UNAVAILABLE, "ours")
    assert turn_outcome(mapper, ours, None, "m") == ("failed", fk.PROVIDER_UNAVAILABLE, "ours")


def test_another_model_answering_is_an_action_and_asks_are_handed_to_the_driver():
    mapper, _ = _mapper()
    assert mapper.handle(_ev("message.updated", sessionID="ses_1", info={
        "id": "m1", "role": "assistant", "providerID": "opencode", "modelID": "big-pickle"})) == (
        "model", ("opencode", "big-pickle"))
    asked = _ev("permission.asked", id="per_1", sessionID="ses_1", permission="bash", patterns=["ls"])
    assert mapper.handle(asked) == ("permission", asked["properties"])
    assert mapper.handle(_ev("permission.asked", id="per_2", sessionID="ses_else")) is None


def test_open_items_are_closed_and_the_diff_sent_once_at_the_end():
    mapper, seen = _mapper()
    mapper.handle(_part(id="w1", type="tool", tool="write", messageID="m1", state={
        "status": "completed", "input": {"filePath": "/ws/NEW.txt", "content": "a\nb\n"},
        "metadata": {"exists": False}}))
    mapper.handle(_part(id="e1", type="tool", tool="edit", messageID="m1", state={
        "status": "completed", "input": {"filePath": "/ws/R.md"},
        "metadata": {"diff": "--- R.md\n+++ R.md\n-x\n+y\n"}}))
    mapper.handle(_part(id="b1", type="tool", tool="bash", messageID="m1", state={
        "status": "running", "input": {"command": "sleep 100"}, "time": {"start": 1}}))
    mapper.handle(_part(id="t1", type="text", text="half an ans", messageID="m2", time={"start": 1}))
    mapper.close_open()
    tail = [(e["type"], e["data"].get("status")) for e in seen[-4:]]
    assert tail == [("assistant_message", None), ("tool_call", "incomplete"), ("command_output", "incomplete"),
                    ("diff", None)]
    assert seen[-4]["data"]["incomplete"] is True
    diff = seen[-1]["data"]["diff"]
    assert "--- /dev/null\n+++ /ws/NEW.txt\n@@ -0,0 +1,2 @@\n+a\n+b\n" in diff and "+y" in diff
    mapper.close_open()
    assert [e["type"] for e in seen].count("diff") == 1


# ---------------------------------------------------------------- the owner, with a stand-in binary

def _listening_binary(tmp_path: Path) -> str:
    """Says it listens (as `opencode serve` does) and waits to be stopped: the owner's logic only."""
    script = tmp_path / "fake-opencode"
    script.write_text(f"#!{sys.executable}\nimport socket, sys, time\ns = socket.socket(); s.bind(('127.0.0.1', 0))\n"
                      "s.listen()\n"
                      "print(f'opencode server listening on http://127.0.0.1:{s.getsockname()[1]}', flush=True)\n"
                      "time.sleep(600)\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def _launch(binary: str, url: str = "http://127.0.0.1:9/v1") -> server.Launch:
    return server.Launch(binary=binary, spec=_spec(url), path=os.environ.get("PATH", "/usr/bin:/bin"))


def test_the_owner_starts_one_server_for_two_turns_at_once_and_waits_to_replace_a_busy_one(tmp_path):
    owner = ServerOwner(tmp_path / "runs", idle_seconds=600)
    launch = _launch(_listening_binary(tmp_path))
    leases: list[Any] = []
    threads = [threading.Thread(target=lambda: leases.append(owner.get(launch))) for _ in range(2)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert owner.starts == 1 and leases[0].server is leases[1].server and leases[0].server.leases == 2
        other = _launch(launch.binary, "http://127.0.0.1:10/v1")  # the projection changed
        box: dict[str, Any] = {}
        waiter = threading.Thread(target=lambda: box.update(lease=owner.get(other)))
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive() and owner.starts == 1  # never two: it waits for the busy one
        first = leases[0].server
        for lease in leases:
            lease.release()
        waiter.join(60)
        assert owner.starts == 2 and box["lease"].server is not first and not first.alive()
        assert not first.dir.exists()
        box["lease"].release()
    finally:
        owner.close()
    assert not list((tmp_path / "runs").iterdir())


def test_the_owner_replaces_a_dead_server_stops_an_idle_one_and_refuses_after_close(tmp_path):
    owner = ServerOwner(tmp_path / "runs", idle_seconds=0)
    launch = _launch(_listening_binary(tmp_path))
    lease = owner.get(launch)
    first = lease.server
    os.kill(first.pid, 9)
    first.wait_exit(10)
    lease.release()
    lease.release()  # once only
    second = owner.get(launch)
    assert second.server is not first and owner.starts == 2 and not first.dir.exists()
    second.release()
    stop = threading.Event()
    for _ in range(200):
        if owner.server is None and not second.server.dir.exists():
            break
        stop.wait(0.05)
    assert owner.server is None and not second.server.alive()
    owner.close()
    with pytest.raises(fk.BackendFailure, match="stopping"):
        owner.get(launch)


def _health_binary(tmp_path: Path) -> str:
    """Says it listens and answers `GET /global/health`: healthy until the file `sick` appears beside it."""
    script = tmp_path / "fake-opencode-health"
    sick = tmp_path / "sick"
    script.write_text(
        f"#!{sys.executable}\nimport http.server, os\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        f"        body = b'{{\"healthy\":false}}' if os.path.exists({str(sick)!r}) else b'{{\"healthy\":true}}'\n"
        "        self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers()\n"
        "        self.wfile.write(body)\n"
        "    def log_message(self, *a): pass\n"
        "s = http.server.ThreadingHTTPServer(('127.0.0.1', 0), H)\n"
        "print(f'opencode server listening on http://127.0.0.1:{s.server_address[1]}', flush=True)\n"
        "s.serve_forever()\n")
    script.chmod(0o755)
    return str(script)


def test_a_worn_server_is_recycled_when_its_last_turn_ends_never_during_one_and_no_turn_is_lost(tmp_path):
    owner = ServerOwner(tmp_path / "runs", idle_seconds=600, recycle_turns=3)
    launch = _launch(_health_binary(tmp_path))
    try:
        owner.get(launch).release()  # turn 1
        second = owner.get(launch)  # turn 2, on the same (healthy) server
        third = owner.get(launch)  # turn 3, at once: the server has served its 3 turns
        first = second.server
        assert third.server is first and owner.starts == 1 and first.turns == 3
        third.release()
        assert first.alive() and first.healthy() and owner.recycled["turns"] == 0  # turn 2 still runs on it
        second.release()
        assert not first.alive() and not first.dir.exists() and owner.recycled["turns"] == 1
        fourth = owner.get(launch)  # the next turn gets a fresh server, nothing lost
        assert fourth.server is not first and fourth.server.healthy() and owner.starts == 2
        fourth.release()
    finally:
        owner.close()
    assert not list((tmp_path / "runs").iterdir())


def test_a_turn_that_lands_while_the_worn_server_stops_waits_for_its_exit_and_gets_a_fresh_one(tmp_path):
    """The recycle's stop runs in the releasing turn's thread and takes the server's time to
    exit (this stand-in takes 0.5 s after its TERM); a turn that comes meanwhile is neither
    refused nor given a second server beside the first: it waits, then starts the next one."""
    script = tmp_path / "fake-opencode-slow-stop"
    script.write_text(f"#!{sys.executable}\nimport signal, socket, sys, time\n"
                      "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(0.5), sys.exit(0)))\n"
                      "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
                      "print(f'opencode server listening on http://127.0.0.1:{s.getsockname()[1]}', flush=True)\n"
                      "time.sleep(600)\n")
    script.chmod(0o755)
    owner = ServerOwner(tmp_path / "runs", idle_seconds=600, recycle_turns=1)
    launch = _launch(str(script))
    try:
        lease = owner.get(launch)
        first = lease.server
        releaser = threading.Thread(target=lease.release)  # its one turn ends: recycled, stopping
        releaser.start()
        stop = threading.Event()
        while owner.server is not None and releaser.is_alive():
            stop.wait(0.01)
        second = owner.get(launch)  # a turn arrives during the stop
        assert first.proc is not None and first.proc.poll() is not None  # the old one had exited first
        assert second.server is not first and owner.starts == 2 and owner.recycled["turns"] == 1
        releaser.join(10)
        second.release()
    finally:
        owner.close()


def test_a_server_over_its_rss_limit_is_recycled_and_one_failing_its_health_check_is_replaced(tmp_path):
    owner = ServerOwner(tmp_path / "runs", idle_seconds=600, recycle_rss=1)  # any server is over 1 byte
    launch = _launch(_health_binary(tmp_path))
    try:
        lease = owner.get(launch)
        first = lease.server
        assert (first.rss_bytes() or 0) > 1 << 20  # the stand-in's own RSS, read from /proc
        lease.release()
        assert not first.alive() and owner.recycled["rss"] == 1
        owner.recycle_rss = 1 << 40
        second = owner.get(launch)
        second.release()
        assert second.server.alive() and owner.recycled["health"] == 0
        (tmp_path / "sick").write_text("")  # it stops answering healthy while free
        third = owner.get(launch)
        assert third.server is not second.server and not second.server.alive() and owner.recycled["health"] == 1
        assert third.started  # a server that just said it listens is not asked again
        third.release()
    finally:
        owner.close()


def test_start_returns_only_once_the_server_says_it_listens(tmp_path):
    script = tmp_path / "slow"
    script.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(0.6)\n"
                      "print('opencode server listening on http://127.0.0.1:4555', flush=True)\ntime.sleep(600)\n")
    script.chmod(0o755)
    srv = server.OpenCodeServer(_launch(str(script)), tmp_path / "runs")
    try:
        srv.start()
        assert srv.port == 4555 and srv.listening_after is not None and srv.listening_after >= 0.6
    finally:
        srv.stop()
    assert not srv.dir.exists() and not srv.alive()


def test_a_server_that_never_listens_or_exits_is_spawn_failed(tmp_path):
    script = tmp_path / "exits"
    script.write_text("#!/bin/sh\necho 'Error: bad flag --pure' >&2\nexit 3\n")
    script.chmod(0o755)
    owner = ServerOwner(tmp_path / "runs")
    with pytest.raises(fk.BackendFailure) as err:
        owner.get(_launch(str(script)))
    assert err.value.kind == fk.BACKEND_SPAWN_FAILED and "rc 3" in err.value.message and "bad flag" in err.value.message
    assert not list((tmp_path / "runs").iterdir())


def test_leftovers_of_a_dead_owner_are_stopped_and_removed_a_live_owners_kept(tmp_path):
    runs = tmp_path / "runs"
    dead, live = runs / ".opencode-dead", runs / ".opencode-live"
    for path in (dead, live):
        path.mkdir(parents=True)
    mine = server.proc.proc_stat(os.getpid())
    (dead / "server.json").write_text(json.dumps({"pid": 999999, "start_time": 1, "owner_pid": 999998,
                                                  "owner_start_time": 1}))
    (live / "server.json").write_text(json.dumps({"pid": 999999, "start_time": 1, "owner_pid": os.getpid(),
                                                  "owner_start_time": mine["start_time"]}))
    assert server.reap_leftovers(runs) == [str(dead)]
    assert live.exists() and not dead.exists()


def test_one_masked_prefix_covers_every_password_token_and_placeholder_of_the_process(tmp_path):
    redactor = Redactor()
    redactor.add(process_secret(), prefix=True)
    values = []
    for _ in range(2):  # two server starts: new values, the same prefix
        routes = ProviderRoutes({"fake": "http://127.0.0.1:9/v1"}, [CANARY])
        values += [server.OpenCodeServer(_launch("/bin/true"), tmp_path).password, routes.path_for("fake"),
                   *routes.placeholders]
    assert len(set(values)) == len(values)
    for value in values:
        head, rest = value.split(process_secret())
        assert redactor.text(f"x={value} y") == f"x={head}[REDACTED] y"  # whole: not even its random rest


def test_the_servers_environment_is_built_from_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("CLAWMANAGER_LLM_API_KEY", "runtime-secret-1")
    monkeypatch.setenv("OPENCODE_CONFIG_CONTENT", "{}")
    srv = server.OpenCodeServer(_launch("/bin/true"), tmp_path)
    env = srv.environment()
    assert "CLAWMANAGER_LLM_API_KEY" not in env and "OPENCODE_CONFIG_CONTENT" not in env
    assert env["OPENCODE_CONFIG"].startswith("/") and env["OPENCODE_SERVER_PASSWORD"] == srv.password
    assert env["OPENCODE_DISABLE_PROJECT_CONFIG"] == "1" and env["OPENCODE_DISABLE_MODELS_FETCH"] == "1"
    assert len(srv.password) >= 40 and srv.password != server.OpenCodeServer(_launch("/bin/true"), tmp_path).password


# ---------------------------------------------------------------- binary and AGENTS.md

def test_the_npm_launcher_stub_resolves_to_the_platform_binary(tmp_path):
    modules = tmp_path / "node_modules"
    stub = modules / "opencode-ai" / "bin" / "opencode.exe"
    stub.parent.mkdir(parents=True)
    stub.write_text("echo 'Error: opencode-ai's postinstall script was not run.' >&2\nexit 1\n")
    package = driver.PLATFORM_PACKAGES.get(os.uname().machine, "opencode-linux-x64")
    native = modules / package / "bin" / "opencode"
    native.parent.mkdir(parents=True)
    native.write_bytes(b"\x7fELF fake")
    native.chmod(0o755)
    assert driver.native_for(str(stub)) == str(native)
    assert driver.native_for(str(native)) == str(native)
    assert driver.find_binary({"CALDERA_OPENCODE_BIN": "/x/opencode"}) == "/x/opencode"
    assert driver.find_binary({"PATH": str(tmp_path / "empty")}) is None


def test_agents_md_is_read_capped_and_never_through_a_symlink_or_a_fifo(tmp_path):
    (tmp_path / "AGENTS.md").write_text("Be brief.\n" + "x" * 100_000)
    text = driver.read_instructions(str(tmp_path))
    assert text is not None and text.startswith(f"Instructions from: {tmp_path}/AGENTS.md\nBe brief.")
    assert len(text.encode()) < driver.INSTRUCTIONS_CAP + 200
    (tmp_path / "AGENTS.md").unlink()
    (tmp_path / "AGENTS.md").symlink_to("/etc/passwd")
    assert driver.read_instructions(str(tmp_path)) is None
    (tmp_path / "AGENTS.md").unlink()
    os.mkfifo(tmp_path / "AGENTS.md")
    assert driver.read_instructions(str(tmp_path)) is None  # returns at once: nothing writes the fifo


def test_the_profile_reports_its_capability_and_version_without_touching_home(tmp_path, monkeypatch):
    binary = tmp_path / "opencode"
    binary.write_text('#!/bin/sh\n'
                      '[ "$HOME" != "$REAL_HOME" ] && [ "$OPENCODE_DISABLE_AUTOUPDATE" = 1 ] && echo 1.18.33\n')
    binary.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "CALDERA_OPENCODE_BIN": str(binary), "REAL_HOME": os.environ.get("HOME", "/root")}
    info = driver.OpenCodeBackend().resolve_profile("opencode", env=env, probe=True)
    assert info["name"] == "opencode" and info["available"] and info["version"] == "1.18.33"
    assert info["interrupt"] and len(info["failure_kinds"]) == 11 and not info["llm_gateway"]
    with_content = dict(env, OPENCODE_CONFIG_CONTENT="{}")
    assert driver.OpenCodeBackend().resolve_profile("opencode", env=with_content)["llm_gateway"]
    assert "backend.opencode" in base.capabilities(env)
    assert [b["name"] for b in base.describe(env)["backends"]] == ["codex", "claude-code", "opencode"]


# ---------------------------------------------------------------- the state report (issue 34)

GATEWAY_URL = "http://clawmanager-gateway.demo-system.svc.cluster.local:9001/api/v1/gateway/llm"
GW = {"CLAWMANAGER_LLM_BASE_URL": GATEWAY_URL, "CLAWMANAGER_LLM_API_KEY": CANARY,
      "CLAWMANAGER_LLM_MODEL": '["auto","gpt-4.1"]', "OPENAI_MODEL": "auto",
      "CLAWMANAGER_LLM_PROVIDER": "openai-compatible", "CALDERA_WORKSPACE_ROOTS": "/srv/ws",
      "OPENCODE_SERVER_PASSWORD": CANARY + "-pw"}


def _opencode(configs):
    return [c for c in configs if c.source == "backend opencode"]


def _report(env, secrets=None, cred=None):
    from caldera.protocol.llm import report_fields

    fields = report_fields(registry.llm_configs(env, str(secrets) if secrets else None, cred))
    text = json.dumps(fields)
    assert CANARY not in text  # neither the key nor the server password reaches a report
    return fields


def test_opencode_runs_on_the_gateway_or_on_clawmanagers_config_content_are_gateway(tmp_path):
    [found] = _opencode(registry.llm_configs(GW, str(tmp_path / "none"), None))
    assert (found.status, found.base_url, found.model) == (GATEWAY, GATEWAY_URL, "auto")
    injected = dict(GW, OPENCODE_CONFIG_CONTENT=CM_CONTENT)
    [found] = _opencode(registry.llm_configs(injected, str(tmp_path / "none"), None))
    assert (found.status, found.base_url, found.provider, found.model) == (GATEWAY, GATEWAY_URL, "clawmanager", "auto")
    _report(injected)
    assert _opencode(registry.llm_configs({"CALDERA_WORKSPACE_ROOTS": "/srv/ws"}, str(tmp_path / "none"), None)) == []


def test_opencode_config_content_elsewhere_and_a_projection_are_external_without_their_secrets(tmp_path):
    elsewhere = json.dumps({"provider": {"corp": {"npm": "@ai-sdk/openai-compatible", "options": {
        "baseURL": f"https://user:{CANARY}@llm.corp.test/v1?key={CANARY}", "apiKey": "{env:CORP_KEY}"},
        "models": {"m1": {}}}}, "model": "corp/m1"})
    env = dict(GW, OPENCODE_CONFIG_CONTENT=elsewhere, CORP_KEY=CANARY, OPENAI_MODEL="", CLAWMANAGER_LLM_MODEL="")
    [found] = _opencode(registry.llm_configs(env, str(tmp_path / "none"), None))
    assert (found.status, found.base_url, found.provider, found.model) == (EXTERNAL, "https://llm.corp.test/v1",
                                                                           "corp", "m1")
    assert _report(env)["llm_config_status"] == EXTERNAL
    secrets = write_projection(tmp_path, f"https://llm.corp.test/k/{CANARY}/v1")
    [found] = _opencode(registry.llm_configs(GW, str(secrets), None))
    assert (found.status, found.base_url) == (EXTERNAL, "https://llm.corp.test")  # the key in its path: cut
    _report(GW, secrets)
    (secrets / "opencode" / "env" / KEY_ENV).unlink()  # projected, but unusable: external all the same
    [found] = _opencode(registry.llm_configs(GW, str(secrets), None))
    assert (found.status, found.base_url) == (EXTERNAL, None)


# ---------------------------------------------------------------- project plugins

def test_a_plugin_or_a_config_naming_one_is_found_in_the_workspace_or_a_parent(tmp_path):
    ws = tmp_path / "a" / "ws"
    ws.mkdir(parents=True)
    assert project.plugin_file(str(ws)) is None
    (ws / "opencode.json").write_text('{"model": "x/y"}')  # a config without plugins: nothing to refuse
    (ws / ".opencode" / "plugins").mkdir(parents=True)
    (ws / ".opencode" / "plugins" / "notes.md").write_text("not code")
    assert project.plugin_file(str(ws)) is None
    (tmp_path / "opencode.jsonc").write_text('{\n  // mine\n  "plugins" : ["./x.js"]\n}')
    assert project.plugin_file(str(ws)) == str(tmp_path / "opencode.jsonc")
    (tmp_path / "opencode.jsonc").unlink()
    (tmp_path / "link").symlink_to(ws)  # the path as given and its real path: both walked
    (tmp_path / "a" / ".opencode" / "plugin").mkdir(parents=True)
    (tmp_path / "a" / ".opencode" / "plugin" / "p.ts").write_text("export default {}")
    assert project.plugin_file(str(tmp_path / "link")) == str(tmp_path / "a" / ".opencode" / "plugin" / "p.ts")
    assert "p.ts" in project.refusal(str(tmp_path / "a" / ".opencode" / "plugin" / "p.ts"))


def test_a_fifo_as_a_config_is_refused_never_waited_on(tmp_path):
    os.mkfifo(tmp_path / "opencode.json")  # open() without O_NONBLOCK waits for a writer forever
    done: list[str | None] = []
    reader = threading.Thread(target=lambda: done.append(project.plugin_file(str(tmp_path))), daemon=True)
    reader.start()
    reader.join(10)
    assert done == [str(tmp_path / "opencode.json")]


@pytest.mark.parametrize("text,names", [
    ('{"plug\\u0069n": ["file:///x.js"]}', True),  # OpenCode decodes the escape: `plugin`
    ('{"plugin" /* c */ : ["file:///x.js"]}', True),  # a JSONC comment between the key and its colon
    ('{"plugin"\n// c\n: ["file:///x.js"],}', True),
    ('{"model": "a/b", "plugin": [], "note": "\\"plugin\\": [1]"}', False),  # empty, and only in a string
    ('{"mcp": {"plugin": {}}, /* "plugin": ["x"] */ "model": "a/b",}', False),  # nested, and in a comment
    ('{"plugin": ["x"', True),  # does not parse: counted as one
    ('["plugin", ["x"]]', False),
])
def test_a_config_is_read_as_opencode_reads_it(tmp_path, text, names):
    (tmp_path / "opencode.jsonc").write_text(text)
    assert (project.plugin_file(str(tmp_path)) is not None) is names


class _SeenByForwarder:
    """What the forwarder tells the driver of a session: its failures in a row, its last
    failure, the silence of its answer still coming; and the cuts the driver asks for."""

    def __init__(self, streak: int = 0, silence: float = 0.0, last: Failure | None = None):
        self._streak, self._silence, self._last = streak, silence, last
        self.cuts: list[str] = []

    def streak(self, tag: str) -> int:
        return self._streak

    def silence(self, tag: str) -> float:
        return self._silence

    def last_failure(self, tag: str) -> Failure | None:
        return self._last

    def cut(self, tag: str) -> None:
        self.cuts.append(tag)


def _watched(seen: _SeenByForwarder, max_retries: int = 2, stall: int = 60) -> Any:
    """An OpenCode turn's context, as far as the driver's watch of its provider reads it."""
    events: list[dict[str, Any]] = []
    context = driver.OpenCodeContext.__new__(driver.OpenCodeContext)
    context.session_id, context.max_retries, context.stall_seconds = "ses_1", max_retries, stall
    context.reason = context.failure = context.tries = None
    context.sink = EventSink("r1", Redactor(), listeners=[events.append])
    context.run = base.RunRequest.__new__(base.RunRequest)
    object.__setattr__(context.run, "workspace", "/nowhere")
    calls: list[str] = []
    srv = type("S", (), {"forwarder": seen, "call": lambda self, method, path, body, **kw: calls.append(path)})()
    driver.OpenCodeBackend()._watch_provider(context, srv)
    return context, calls


def test_the_forwarders_view_ends_a_turn_opencode_retries_in_silence_or_whose_answer_stalls():
    broke = Failure(None, "the provider's answer broke off: IncompleteRead(0 bytes read)")
    context, calls = _watched(_SeenByForwarder(streak=3, last=broke))  # OpenCode's own count ends it first
    assert context.reason is None and calls == []
    seen = _SeenByForwarder(streak=4, last=broke)
    context, calls = _watched(seen)
    assert context.reason == "failure" and context.tries == 4 and calls == ["/session/ses_1/abort"]
    kind, message = context.failure
    assert kind == fk.PROVIDER_UNAVAILABLE and "4 tries in a row" in message and "broke off" in message
    assert seen.cuts == ["ses_1"]
    context, _ = _watched(_SeenByForwarder(streak=1, silence=61.0))
    assert context.failure == (fk.PROVIDER_UNAVAILABLE, "the provider stopped sending its answer: nothing for "
                                                        "60 s (CALDERA_PROVIDER_STALL_SECONDS); 2 tries")
    assert _watched(_SeenByForwarder(silence=59.0))[0].reason is None
    assert _watched(_SeenByForwarder(silence=600.0), stall=0)[0].reason is None  # 0: no bound of caldera's
