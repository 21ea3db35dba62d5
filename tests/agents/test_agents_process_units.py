"""Process mode, the pure parts: the restart policy, the manifest keys, the status file
reader against hostile files, the agent's environment, /proc parsing."""
import json
import os

import pytest
from process_helpers import manifest_doc

from caldera.agents.manifest import check_document, load_manifest
from caldera.agents.process import environment
from caldera.agents.process.policy import ERROR, RESTART, STOP, RestartPolicy
from caldera.agents.process.spec import build_spec
from caldera.agents.process.statusfile import MAX_BYTES, read_status_file
from caldera.errors import ConfigError
from caldera.host import proc
from caldera.redact import Redactor

BASE = {"name": "p", "runtime": {"type": "process", "command": ["./agent"]}}


def _doc(**over):
    return manifest_doc(BASE, **over)


# ---------------------------------------------------------------- restart policy

def test_backoff_ladder_then_error_after_five_failures_in_ten_minutes():
    policy = RestartPolicy("on-failure")
    now, delays = 0.0, []
    for _ in range(4):
        action, delay = policy.on_exit(now, uptime=1.0, failed=True)
        assert action == RESTART
        delays.append(delay)
        now += delay + 1
    assert delays == [1, 2, 5, 10]
    assert policy.on_exit(now, uptime=1.0, failed=True) == (ERROR, None)


def test_failures_older_than_ten_minutes_do_not_count_and_the_ladder_tops_at_60():
    policy = RestartPolicy("always")
    now, delays = 0.0, []
    for _ in range(8):
        action, delay = policy.on_exit(now, uptime=1.0, failed=True)
        assert action == RESTART
        delays.append(delay)
        now += 200.0  # never 5 inside 600 s
    assert delays == [1, 2, 5, 10, 30, 60, 60, 60]


def test_sixty_seconds_up_resets_the_ladder():
    policy = RestartPolicy("on-failure")
    policy.on_exit(0, 1, True)
    policy.on_exit(10, 1, True)
    assert policy.on_exit(100, uptime=61.0, failed=True) == (RESTART, 1.0)


def test_policies_on_a_clean_exit_and_never():
    assert RestartPolicy("on-failure").on_exit(0, 1, failed=False) == (STOP, None)
    assert RestartPolicy("always").on_exit(0, 1, failed=False) == (RESTART, 1.0)
    assert RestartPolicy("never").on_exit(0, 1, failed=False) == (STOP, None)
    assert RestartPolicy("never").on_exit(0, 1, failed=True) == (ERROR, None)


def test_a_command_resets_the_failures():
    policy = RestartPolicy("on-failure")
    for t in range(4):
        policy.on_exit(t, 1, True)
    policy.reset()
    assert policy.on_exit(5, 1, True) == (RESTART, 1.0)


# ---------------------------------------------------------------- manifest keys

@pytest.mark.parametrize("over, needle", [
    ({"runtime_stop_signal": "SIGTERM"}, "runtime.stop_signal"),
    ({"runtime_stop_timeout_seconds": 0}, "runtime.stop_timeout_seconds"),
    ({"runtime_stop_timeout_seconds": 301}, "runtime.stop_timeout_seconds"),
    ({"runtime_restart": "sometimes"}, "runtime.restart"),
    ({"runtime_run_now_signal": 10}, "runtime.run_now_signal"),
    ({"status": "../x.json"}, "status: '..'"),
    ({"status": {"path": "x"}}, "status: a path"),
    ({"secrets": ["CALDERA_TOKEN"]}, "secrets: CALDERA_TOKEN is the runtime's own token"),
    ({"secrets": ["A", "A"]}, "listed twice"),
    ({"secrets": "A"}, "secrets: a list"),
    ({"bindings": ["vault"]}, "bindings: 'vault'"),
    ({"env": {"PATH": "/x"}}, "env.PATH"),
    ({"env": {"N": 5}}, "env.N: a plain string"),
    ({"env": {"CLAWMANAGER_LLM_API_KEY": "x"}}, "env.CLAWMANAGER_LLM_API_KEY"),
    ({"mcp": {"fs": {"command": "npx fs"}}}, "mcp.fs.command"),
    ({"mcp": {"fs": {"url": "ftp://x"}}}, "mcp.fs.url"),
    ({"mcp": {"fs": {"url": "https://x", "command": ["a"]}}}, "mcp.fs: exactly one"),
    ({"account": "Root User"}, "account"),
    ({"runtime_shell": True}, "runtime.shell"),
])
def test_bad_process_keys_are_named(over, needle):
    with pytest.raises(ConfigError) as info:
        check_document(_doc(**over), "m")
    assert needle in str(info.value)


def test_process_keys_are_refused_in_adapter_mode():
    doc = _doc(env={"A": "b"})
    doc["runtime"]["type"] = "adapter"
    with pytest.raises(ConfigError, match="'env' is not allowed with runtime.type: adapter"):
        check_document(doc, "m")
    doc = _doc(runtime_restart="always")
    doc["runtime"]["type"] = "adapter"
    with pytest.raises(ConfigError, match="runtime.restart: unknown key for runtime.type: adapter"):
        check_document(doc, "m")


def test_spec_defaults_and_paths(tmp_path):
    import yaml

    (tmp_path / "caldera.agent.yaml").write_text(yaml.safe_dump(_doc(status={"file": "s.json"}, state="data",
                                                                     logs="logs", instructions="prompt.md")))
    manifest = load_manifest(tmp_path / "caldera.agent.yaml")
    spec = build_spec(manifest, tmp_path / "st")
    assert spec.stop_signal == 15 and spec.stop_timeout == 10.0 and spec.restart == "on-failure"
    assert spec.run_now_signal == 10
    assert spec.state_dir == tmp_path / "st" / "data"
    assert spec.status_file == tmp_path / "st" / "data" / "s.json"  # relative to state when state is named
    assert spec.logs_dir == tmp_path / "st" / "data" / "logs" and spec.instructions == tmp_path / "prompt.md"


# ---------------------------------------------------------------- the status file

GOOD = {"state": {"level": "ok", "label": "Idle"}, "gauges": [{"name": "g", "used": 0.5, "x": 1}],
        "agent": {"version": "3.1"}, "extra": "dropped", "detail": "d" * 5000}


def _status(tmp_path, data, name="status.json"):
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    return path


def test_a_good_file_is_filtered_by_the_one_filter(tmp_path):
    read = read_status_file(_status(tmp_path, GOOD), stale_after=15)
    assert read.problem is None
    assert "extra" not in read.body and read.body["gauges"] == [{"name": "g", "used": 0.5}]
    assert len(read.body["detail"]) == 1000


def test_missing_is_a_health_entry(tmp_path):
    read = read_status_file(tmp_path / "nope.json", stale_after=15)
    assert read.body is None and "not written yet" in read.problem["reason"]


def test_stale_is_a_warn_entry_with_the_body_kept(tmp_path):
    path = _status(tmp_path, GOOD)
    os.utime(path, (1000, 1000))
    read = read_status_file(path, stale_after=15, now=2000)
    assert read.body["state"]["label"] == "Idle"
    assert read.problem["level"] == "warn" and "stale" in read.problem["reason"]


def test_oversized_is_not_parsed(tmp_path):
    path = _status(tmp_path, b"{" + b" " * MAX_BYTES + b"}")
    read = read_status_file(path, stale_after=15)
    assert read.body is None and "over 256 KiB" in read.problem["reason"]


def test_a_symlink_is_not_followed(tmp_path):
    target = _status(tmp_path, GOOD, "real.json")
    link = tmp_path / "status.json"
    link.symlink_to(target)
    read = read_status_file(link, stale_after=15)
    assert read.body is None and "symlink" in read.problem["reason"]


@pytest.mark.parametrize("data, needle", [
    (b"{not json", "not JSON"),
    (b"\xff\xfe", "not UTF-8"),
    (b"[1, 2]", "must be a JSON object"),
    (json.dumps({"state": {"level": "great"}}).encode(), "breaks the contract"),
    (json.dumps({"gauges": [{"used": 7}]}).encode(), "breaks the contract"),
    (b"[" * 100000 + b"]" * 100000, "status file"),
])
def test_unparseable_files_are_health_entries(tmp_path, data, needle):
    read = read_status_file(_status(tmp_path, data), stale_after=15)
    assert read.body is None and needle in read.problem["reason"]


def test_a_fifo_or_directory_never_blocks(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    assert "not a regular file" in read_status_file(tmp_path / "fifo", stale_after=15).problem["reason"]
    (tmp_path / "dir").mkdir()
    assert "not a regular file" in read_status_file(tmp_path / "dir", stale_after=15).problem["reason"]


# ---------------------------------------------------------------- the environment

class _Spec:
    def __init__(self, **kw):
        self.env, self.secrets, self.bindings = kw.get("env", {}), kw.get("secrets", ()), kw.get("bindings", ())


def test_environment_is_exactly_the_contract(tmp_path, monkeypatch):
    monkeypatch.setenv("TZ", "Europe/Berlin")
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "FILE_KEY").write_text("from-file\n")
    runtime_env = {"HOME": "/elsewhere", "CALDERA_TOKEN": "agt_boot_x", "SOMETHING": "leak",
                   "CLAWMANAGER_LLM_BASE_URL": "http://gw", "CLAWMANAGER_LLM_API_KEY": "sk-gatewaykey123456",
                   "CLAWMANAGER_LLM_MODEL": '["auto","m1"]', "OPENAI_MODEL": "auto",
                   "CLAWMANAGER_LLM_PROVIDER": "openai-compatible"}
    secrets_env = {"API_KEY": "s3cret-value", "OTHER": "not-named", "CALDERA_TOKEN": "agt_boot_x"}
    built = environment.build_env(_Spec(env={"MODE": "fast"}, secrets=("API_KEY", "FILE_KEY", "MISSING"),
                                        bindings=("llm_gateway",)),
                                  agent_name="p", files={"CALDERA_AGENT_STATE_DIR": tmp_path / "st",
                                                         "CALDERA_SETTINGS_FILE": tmp_path / "st" / "settings.json"},
                                  runtime_env=runtime_env, secrets_env=secrets_env, secrets_dir=tmp_path / "secrets",
                                  environ={"TZ": "Europe/Berlin", "SOMETHING": "leak"})
    env = built.env
    assert set(env) == {"PATH", "HOME", "LANG", "TZ", "CALDERA_AGENT", "CALDERA_AGENT_STATE_DIR",
                        "CALDERA_SETTINGS_FILE", "MODE", "API_KEY", "FILE_KEY",
                        "CLAWMANAGER_LLM_BASE_URL", "CLAWMANAGER_LLM_API_KEY", "CLAWMANAGER_LLM_MODEL",
                        "CLAWMANAGER_LLM_PROVIDER", "OPENAI_BASE_URL", "OPENAI_API_BASE", "OPENAI_API_KEY",
                        "OPENAI_MODEL"}
    assert env["PATH"] == "/usr/local/bin:/usr/bin:/bin" and env["HOME"] != "/elsewhere"
    assert env["FILE_KEY"] == "from-file" and env["OPENAI_API_KEY"] == "sk-gatewaykey123456"
    # as the platform injects them: the default model as OPENAI_MODEL, the catalogue only as itself
    assert env["OPENAI_MODEL"] == "auto" and env["CLAWMANAGER_LLM_MODEL"] == '["auto","m1"]'
    assert env["OPENAI_BASE_URL"] == env["OPENAI_API_BASE"] == env["CLAWMANAGER_LLM_BASE_URL"] == "http://gw"
    assert "sk-gatewaykey123456" in built.secret_values and "s3cret-value" in built.secret_values
    assert any("MISSING" in p for p in built.problems)


def test_no_binding_no_gateway_and_the_token_never(tmp_path):
    built = environment.build_env(_Spec(secrets=("CALDERA_TOKEN",)), agent_name="p", files={},
                                  runtime_env={"CLAWMANAGER_LLM_API_KEY": "k" * 20, "OPENAI_API_KEY": "k" * 20},
                                  secrets_env={"CALDERA_TOKEN": "agt_boot_abc"}, secrets_dir=tmp_path, environ={})
    assert "CALDERA_TOKEN" not in built.env
    assert not any(k.startswith(("CLAWMANAGER_", "OPENAI_")) for k in built.env)


def test_gateway_from_openai_names_when_clawmanager_names_are_absent():
    assert environment.gateway_values({"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": "u"}) == {
        "CLAWMANAGER_LLM_API_KEY": "k", "OPENAI_API_KEY": "k", "CLAWMANAGER_LLM_BASE_URL": "u",
        "OPENAI_BASE_URL": "u", "OPENAI_API_BASE": "u"}


def test_the_catalogue_never_becomes_the_agents_model():
    """Without OPENAI_MODEL the agent gets none: CLAWMANAGER_LLM_MODEL is a list, never a model
    (0.1.0 handed it out as OPENAI_MODEL); a catalogue that is not JSON still reaches the agent
    as the platform set it (it is the agent's to read)."""
    got = environment.gateway_values({"CLAWMANAGER_LLM_BASE_URL": "u", "CLAWMANAGER_LLM_API_KEY": "k",
                                      "CLAWMANAGER_LLM_MODEL": '["auto","gpt-4.1"]'})
    assert "OPENAI_MODEL" not in got and got["CLAWMANAGER_LLM_MODEL"] == '["auto","gpt-4.1"]'
    got = environment.gateway_values({"CLAWMANAGER_LLM_BASE_URL": "u", "CLAWMANAGER_LLM_API_KEY": "k",
                                      "CLAWMANAGER_LLM_MODEL": "gpt-4.1", "OPENAI_MODEL": "auto"})
    assert got["OPENAI_MODEL"] == "auto" and got["CLAWMANAGER_LLM_MODEL"] == "gpt-4.1"


GW = {"CLAWMANAGER_LLM_BASE_URL": "http://gw.test/api/v1/gateway/llm", "CLAWMANAGER_LLM_API_KEY": "sk-gw-123456",
      "CLAWMANAGER_LLM_MODEL": '["auto","gpt-4.1"]', "OPENAI_MODEL": "auto",
      "CLAWMANAGER_LLM_PROVIDER": "openai-compatible"}


@pytest.mark.parametrize("spec, runtime_env, want", [
    (_Spec(bindings=("llm_gateway",)), GW,
     [("process agent", "gateway", "http://gw.test/api/v1/gateway/llm", "openai-compatible", "auto")]),
    (_Spec(bindings=("llm_gateway",)), {}, []),  # bound, but no gateway to hand out
    (_Spec(), GW, []),  # a gateway in the runtime's environment, not handed to the agent
    # a provider key of its own, with the vendor's URL or the manifest's
    (_Spec(secrets=("ANTHROPIC_API_KEY",)), GW,
     [("process agent (ANTHROPIC_API_KEY)", "external", "https://api.anthropic.com", "anthropic", None)]),
    (_Spec(secrets=("OPENAI_API_KEY",), env={"OPENAI_BASE_URL": "https://llm.corp.test/v1/", "OPENAI_MODEL": "m"}),
     {}, [("process agent (OPENAI_API_KEY)", "external", "https://llm.corp.test/v1", "openai", "m")]),
    # the binding overwrites OPENAI_API_KEY with the gateway's key: only the gateway counts
    (_Spec(secrets=("OPENAI_API_KEY",), bindings=("llm_gateway",)), GW,
     [("process agent", "gateway", "http://gw.test/api/v1/gateway/llm", "openai-compatible", "auto")]),
    # a secret pointed at the gateway itself is the gateway
    (_Spec(secrets=("OPENAI_API_KEY",), env={"OPENAI_BASE_URL": "http://gw.test/api/v1/gateway/llm"}), GW,
     [("process agent", "gateway", "http://gw.test/api/v1/gateway/llm", "openai-compatible", "auto")]),
    # bound to the gateway, and handed providers of its own beside it: never hidden behind the gateway
    (_Spec(secrets=("DEEPSEEK_API_KEY", "OPENROUTER_API_KEY"), bindings=("llm_gateway",),
           env={"OPENROUTER_BASE_URL": "https://openrouter.corp.test/api/v1"}), GW,
     [("process agent", "gateway", "http://gw.test/api/v1/gateway/llm", "openai-compatible", "auto"),
      ("process agent (DEEPSEEK_API_KEY)", "external", "https://api.deepseek.com", "deepseek", None),
      ("process agent (OPENROUTER_API_KEY)", "external", "https://openrouter.corp.test/api/v1", "openrouter", None)]),
    (_Spec(secrets=("ANTHROPIC_AUTH_TOKEN",)), {},
     [("process agent (ANTHROPIC_AUTH_TOKEN)", "external", "https://api.anthropic.com", "anthropic", None)]),
    # any other provider-looking key beside a base URL of the same prefix
    (_Spec(secrets=("CORP_LLM_API_KEY", "ACME_AUTH_TOKEN"),
           env={"CORP_LLM_BASE_URL": "https://llm.corp.test/v1", "CORP_LLM_MODEL": "big",
                "ACME_API_BASE": "https://acme.test"}), {},
     [("process agent (CORP_LLM_API_KEY)", "external", "https://llm.corp.test/v1", "corp_llm", "big"),
      ("process agent (ACME_AUTH_TOKEN)", "external", "https://acme.test", "acme", None)]),
    # not seen: a key without a base URL beside it, a secret of another shape
    (_Spec(secrets=("SERP_API_KEY", "GITHUB_TOKEN", "_API_KEY"), env={"GITHUB_BASE_URL": "https://gh.test"}), {}, []),
])
def test_what_the_process_agent_is_handed_for_the_report(spec, runtime_env, want):
    got = environment.llm_configs(spec, runtime_env)
    assert [(c.source, c.status, c.base_url, c.provider, c.model) for c in got] == want


# ---------------------------------------------------------------- /proc

def test_proc_stat_parses_names_with_spaces_and_parens(tmp_path):
    (tmp_path / "42").mkdir()
    fields = ["S", "1", "42", "42"] + ["0"] * 15 + ["777"] + ["0"] * 10
    (tmp_path / "42" / "stat").write_text("42 (a (b) c) " + " ".join(fields))
    assert proc.proc_stat(42, str(tmp_path)) == {"state": "S", "pgrp": 42, "start_time": 777}
    assert proc.same_process(42, 777, str(tmp_path)) and not proc.same_process(42, 778, str(tmp_path))
    assert proc.proc_stat(43, str(tmp_path)) is None


def test_redactor_learns_the_secret_values():
    redactor = Redactor()
    redactor.add("s3cret-value")
    assert "s3cret-value" not in redactor("got s3cret-value")


# ---------------------------------------------------------------- agent.log

def test_rotation_keeps_three_backups_of_the_bound_size(tmp_path):
    from caldera.agents.process.logpump import RotatingFile

    log = RotatingFile(tmp_path / "agent.log", max_bytes=100, backups=3)
    for i in range(10):
        log.write(bytes([65 + i]) * 60)
    log.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["agent.log", "agent.log.1", "agent.log.2", "agent.log.3"]
    assert all(p.stat().st_size <= 100 for p in tmp_path.iterdir())
    assert (tmp_path / "agent.log").read_bytes() == b"J" * 60  # the newest
    assert (tmp_path / "agent.log.3").read_bytes() == b"G" * 60  # older ones dropped


def test_a_full_queue_drops_and_says_so_never_blocks(tmp_path):
    import threading

    from caldera.agents.process import logpump

    gate = threading.Event()
    original = logpump.RotatingFile.write

    def held_write(self, data):
        gate.wait(60)  # a disk that does not answer
        original(self, data)

    pump = logpump.LogPump(tmp_path / "agent.log", queue_chunks=2)
    logpump.RotatingFile.write = held_write
    try:
        read, write = os.pipe()
        with os.fdopen(read, "rb", buffering=0) as reader_end:
            reader = pump.attach(reader_end)
            with os.fdopen(write, "wb", buffering=0) as out:
                for _ in range(300):  # 300 KB: more reads than the queue holds
                    out.write(b"x" * 1000)  # never blocks for long: the reader drains the pipe
            reader.join(60)
            assert not reader.is_alive()
        assert pump.dropped_total > 0
        gate.set()
        pump.close()
    finally:
        logpump.RotatingFile.write = original
    text = (tmp_path / "agent.log").read_text()
    assert "bytes of agent output dropped" in text
