"""agent_run / agent_interrupt handlers with a small fake runtime (no daemon), the
policy caps, the workspace roots and the run-events poster."""
import os
import threading

import pytest
from backends_helpers import CANARY, fake_ctx, fake_runtime, mock_binary, write_projection

from caldera.backends import commands, service
from caldera.errors import CommandError
from caldera.protocol.client import NotFound, Retryable


def _completed():
    return {"method": "turn/completed", "params": {"turn": {"id": "$TURN", "status": "completed"}}}


def _setup(tmp_path, script=None, **env):
    write_projection(tmp_path / "config")
    root = tmp_path / "roots"
    (root / "proj").mkdir(parents=True)
    base_env = {"PATH": os.environ["PATH"], "CALDERA_WORKSPACE_ROOTS": f"{tmp_path}/elsewhere:{root}",
                "CALDERA_CODEX_BIN": mock_binary(tmp_path, script or {"on_turn": [
                    {"method": "item/completed", "params": {"item": {"type": "agentMessage", "id": "m",
                                                                     "text": f"hi {CANARY}"}}}, _completed()]}),
                "CALDERA_CODEX_REQUEST_MAX_RETRIES": "0", "CALDERA_CODEX_STREAM_MAX_RETRIES": "0"}
    base_env.update(env)
    return root / "proj", base_env


class FakeClient:
    def __init__(self, error=None):
        self.calls, self.error = [], error

    def post_run_events(self, run_id, body):
        self.calls.append((run_id, body))
        if self.error:
            raise self.error


def test_agent_run_succeeds_and_result_has_the_contract_shape(tmp_path):
    ws, env = _setup(tmp_path)
    client = FakeClient()
    runtime = fake_runtime(tmp_path, env, client)
    result = commands.agent_run(fake_ctx(runtime), {"run_id": "r1", "prompt": "hi", "workspace": str(ws)})
    assert set(result) >= {"run_id", "status", "failure_kind", "events_total", "events", "log"}
    assert result["status"] == "completed" and result["failure_kind"] is None
    assert result["events"][-1]["type"] == "terminal_status" and len(result["events"]) == result["events_total"]
    assert result["log"] == str(tmp_path / "state" / "logs" / "run-r1.log")
    posted = [e for _, body in client.calls for e in body["events"]]
    assert [e["seq"] for e in posted] == list(range(1, result["events_total"] + 1))
    assert CANARY not in repr(result) and CANARY not in repr(client.calls)
    assert CANARY not in (tmp_path / "state" / "logs" / "run-r1.log").read_text()


def test_plane_without_events_route_stops_posting_and_run_still_succeeds(tmp_path):
    ws, env = _setup(tmp_path)
    client = FakeClient(NotFound(404, "not found"))
    runtime = fake_runtime(tmp_path, env, client)
    for run_id in ("r1", "r2"):  # asked once, then left alone for the runtime's life
        result = commands.agent_run(fake_ctx(runtime), {"run_id": run_id, "prompt": "hi", "workspace": str(ws)})
        assert result["status"] == "completed" and len(client.calls) == 1


def test_poster_keeps_events_when_the_plane_is_away(tmp_path):
    from caldera.backends.poster import EventPoster

    client = FakeClient(Retryable(503, "down"))
    poster = EventPoster(client, "caldera-7-main", "r1", lambda text: None)
    for seq in range(1, 4):
        poster({"seq": seq})
    poster.close(timeout=0.5)  # the turn's end does not wait for an away plane: the poster goes on trying
    assert poster.pending == [{"seq": 1}, {"seq": 2}, {"seq": 3}] and client.calls


@pytest.mark.parametrize("payload_extra,env_extra,needle", [
    ({"execution_policy": {"timeout_seconds": 7200}}, {}, "exceeds this agent's limit"),
    ({"execution_policy": {"sandbox": "workspace-write"}}, {"CALDERA_RUN_MAX_SANDBOX": "read-only"}, "wider"),
    ({"execution_policy": {"network": True}}, {}, "network=true is not allowed"),
    ({"execution_policy": {"approval": "on-request"}}, {}, "on-request is not allowed"),
    ({"workspace": "/etc"}, {}, "not under the configured workspace roots"),
    ({}, {"CALDERA_WORKSPACE_ROOTS": ""}, "no workspace roots"),
    ({"model": "gpt\x00-5"}, {}, "model 'gpt\\x00-5': a model name of printable characters is required"),
    ({"model": "gpt-5\x7f"}, {}, "no control character"),
    ({"model": "gpt-5\nx"}, {}, "no control character"),
    ({"model": ["gpt-5"]}, {}, "a model name (a string) is required, not list"),
])
def test_wider_requests_are_refused_not_narrowed(tmp_path, payload_extra, env_extra, needle):
    ws, env = _setup(tmp_path, **env_extra)
    payload = dict({"run_id": "r1", "prompt": "hi", "workspace": str(ws)}, **payload_extra)
    with pytest.raises(CommandError) as exc:
        commands.agent_run(fake_ctx(fake_runtime(tmp_path, env)), payload)
    assert str(exc.value).startswith("refused: ") and needle in str(exc.value)
    result = exc.value.result
    assert result["status"] == "blocked" and result["events"][-1]["data"]["status"] == "blocked"
    assert result["events_total"] == 1  # nothing was spawned


def test_symlink_out_of_the_roots_is_refused(tmp_path):
    ws, env = _setup(tmp_path)
    (ws / "escape").symlink_to("/tmp")
    with pytest.raises(CommandError, match="not under"):
        commands.agent_run(fake_ctx(fake_runtime(tmp_path, env)),
                           {"run_id": "r1", "prompt": "hi", "workspace": str(ws / "escape")})


def test_allowed_caps_let_a_wider_policy_through(tmp_path):
    ws, env = _setup(tmp_path, CALDERA_RUN_ALLOW_NETWORK="true", CALDERA_RUN_ALLOW_APPROVAL="1")
    policy = service.policy_from_request({"network": True, "approval": "on-request", "sandbox": "read-only"}, env)
    assert policy.as_dict() == {"timeout_seconds": 600, "sandbox": "read-only", "approval": "on-request",
                                "network": True, "confinement": "backend"}
    with pytest.raises(service.Refused, match="not a boolean"):
        service.policy_from_request({}, dict(env, CALDERA_RUN_ALLOW_NETWORK="maybe"))


def test_failed_run_raises_command_error_with_result(tmp_path):
    ws, env = _setup(tmp_path, script={"on_turn": [{"raw": "garbage"}]})
    with pytest.raises(CommandError) as exc:
        commands.agent_run(fake_ctx(fake_runtime(tmp_path, env)),
                           {"run_id": "r1", "prompt": "hi", "workspace": str(ws)})
    assert "backend-json-parse-error" in str(exc.value)
    assert exc.value.result["failure_kind"] == "backend-json-parse-error"


def test_agent_interrupt_reaches_the_running_run(tmp_path):
    ws, env = _setup(tmp_path, script={"on_turn": []})
    runtime = fake_runtime(tmp_path, env)
    box = {}

    def run():
        try:
            commands.agent_run(fake_ctx(runtime), {"run_id": "r1", "prompt": "hi", "workspace": str(ws)})
        except CommandError as exc:
            box["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    wait = threading.Event()
    while runtime.runs.get("r1") is None:
        wait.wait(0.01)
    wait.wait(0.3)
    answer = commands.agent_interrupt(fake_ctx(runtime), {"run_id": "r1"})
    thread.join(15)
    assert answer == {"run_id": "r1", "interrupt": "requested", "run": "running"}
    assert box["error"].result["status"] == "cancelled" and box["error"].result["failure_kind"] == "cancelled"
    with pytest.raises(CommandError, match="no run r1 is running or waiting here"):
        commands.agent_interrupt(fake_ctx(runtime), {"run_id": "r1"})


def test_an_interrupt_before_the_turn_started_ends_the_run_at_its_start(tmp_path):
    # The plane shows a run `running` from its start; an interrupt fetched before the turn is
    # prepared (or while the run waits behind another) must not be lost as "no such run".
    ws, env = _setup(tmp_path, script={"on_turn": []})  # without the interrupt it would wait
    runtime = fake_runtime(tmp_path, env)
    runtime.runs.queue("r3")  # what the executor does when it journals the agent_run
    answer = commands.agent_interrupt(fake_ctx(runtime), {"run_id": "r3"})
    assert answer == {"run_id": "r3", "interrupt": "requested", "run": "queued"}
    with pytest.raises(CommandError) as exc:
        commands.agent_run(fake_ctx(runtime), {"run_id": "r3", "prompt": "hi", "workspace": str(ws)})
    assert exc.value.result["status"] == "cancelled" and exc.value.result["failure_kind"] == "cancelled"
    runtime.runs.forget("r3")  # the executor, once the run's finish is recorded
    with pytest.raises(CommandError, match="no run r3 is running or waiting here"):
        commands.agent_interrupt(fake_ctx(runtime), {"run_id": "r3"})


def test_same_run_id_twice_at_once_is_refused(tmp_path):
    ws, env = _setup(tmp_path)
    runtime = fake_runtime(tmp_path, env)
    runtime.runs.add(service.RunHandle("r1", None))
    with pytest.raises(CommandError, match="already running"):
        commands.agent_run(fake_ctx(runtime), {"run_id": "r1", "prompt": "hi", "workspace": str(ws)})


def test_a_run_is_given_what_the_daemon_keeps_between_runs(tmp_path):
    """RunCall.servers (dispatch builds it from the daemon's parts) reaches the backend's
    Environment: OpenCode's turns find the agent's server there."""
    runtime = fake_runtime(tmp_path, {})
    assert commands.environment_for(fake_ctx(runtime)).servers is runtime.servers
