"""Inside a ClawManager instance (issue 22, docs/container.md): only the platform's variables,
the plain-http gateway URL it injects, its proxies (a live one; a dead one with the plane in
NO_PROXY; never ~/.netrc), and `caldera run` as PID 1 of a PID namespace: orphans reaped,
the runtime's own waits untouched, SIGTERM and SIGINT graceful. Issue 34: the variables a
current server injects (CLAWMANAGER_AGENT_RUNTIME_TYPE beside the placement marker
CLAWMANAGER_RUNTIME_TYPE), an older server's (the marker alone), the agent id and skill dirs
they give, and the LLM-governance fields of the state report."""
import json
import os
import pty
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from core_helpers import BOOT, install_agent
from daemon_helpers import INSTANCE, WAIT, wait_for
from proxy_helpers import ForwardProxy, dead_port

GATEWAY_HOST = "clawmanager-gateway.demo-system.svc.cluster.local"
GATEWAY = f"http://{GATEWAY_HOST}:9001"  # ClawManager's default (clawmanager-notes 1.5); resolves nowhere here
FAKE = Path(__file__).resolve().parent.parent / "agents" / "process_agents" / "fake_agent.py"
# What a current server injects to name the runtime: its name, and where the instance is placed
# (a marker, never a runtime name). An older server injects only the marker.
CURRENT_SERVER = {"CLAWMANAGER_AGENT_RUNTIME_TYPE": "hermes", "CLAWMANAGER_RUNTIME_TYPE": "desktop"}
PROCESS_MANIFEST = """\
name: demo
version: "1.0.0"
runtime:
  type: process
  command: [{python}, {agent}, {mode}]
  workdir: .
  stop_timeout_seconds: 5
status: status.json
state: agent
"""


def _instance(tmp_path, base_url, manifest=None, **extra):
    """The agent installed with empty agent.env and secrets.env, and the environment ClawManager
    gives a container: its variables, a persistent dir, nothing of caldera's (the config dir
    only points the test at its temporary /etc/caldera)."""
    config = install_agent(tmp_path, manifest=manifest)
    (config / "agent.env").write_text("")
    (config / "secrets.env").write_text("")
    persistent = tmp_path / "config" / ".hermes"
    persistent.mkdir(parents=True)
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CALDERA_", "CLAWMANAGER_", "OPENAI_")) and k.lower() not in
           ("http_proxy", "https_proxy", "no_proxy", "all_proxy", "journal_stream")}
    env.update(CALDERA_CONFIG_DIR=os.environ["CALDERA_CONFIG_DIR"], HOME=str(home),
               CLAWMANAGER_AGENT_ENABLED="true", CLAWMANAGER_AGENT_BASE_URL=base_url,
               CLAWMANAGER_AGENT_BOOTSTRAP_TOKEN=BOOT, CLAWMANAGER_AGENT_INSTANCE_ID=str(INSTANCE),
               CLAWMANAGER_AGENT_PERSISTENT_DIR=str(persistent), CLAWMANAGER_AGENT_PROTOCOL_VERSION="v1",
               **CURRENT_SERVER)
    env.update(extra)
    return env, persistent / "caldera-agent"


def _report_once(env, deadline=20):
    return subprocess.run([sys.executable, "-m", "caldera.cli", "report", "--once", "--deadline", str(deadline)],
                          env=env, capture_output=True, text=True, timeout=deadline + 60)


def test_the_injected_gateway_through_a_live_proxy_without_netrc(caldera_env, plane, tmp_path):
    """The stock instance: the gateway's cluster name over plain http, egress through
    HTTP_PROXY. The proxy (live, on loopback) takes the request for the cluster name and
    hands it to the plane; a ~/.netrc naming that host is never read (its Basic credentials
    would replace the bearer token)."""
    with ForwardProxy(plane.url) as proxy:
        env, state = _instance(tmp_path, GATEWAY, HTTP_PROXY=proxy.url, HTTPS_PROXY=proxy.url)
        netrc = Path(env["HOME"]) / ".netrc"
        netrc.write_text(f"machine {GATEWAY_HOST} login netrc-user password netrc-pass\ndefault login d password d\n")
        netrc.chmod(0o600)
        done = _report_once(env)
    assert done.returncode == 0, done.stderr
    assert (state / "session.json").exists() and not (tmp_path / "var" / "demo").exists()
    report = plane.store.reports(INSTANCE, last=True)["body"]
    assert report["agent_id"] == f"hermes-{INSTANCE}-main"
    assert ("POST", f"{GATEWAY}/api/v1/agent/register") in proxy.seen
    assert all(h.get("Authorization", "").startswith("Bearer ") for h in proxy.headers), proxy.headers
    named = [line for line in done.stderr.splitlines() if "plain http" in line]
    assert named == [f"WARNING caldera: the control plane at {GATEWAY_HOST} is reached over plain http: "
                     "nothing on the way is encrypted"], done.stderr  # once, the host only
    assert BOOT not in done.stdout + done.stderr


def test_a_dead_proxy_with_the_gateway_in_no_proxy_reaches_the_plane(caldera_env, plane, tmp_path):
    dead = f"http://127.0.0.1:{dead_port()}"
    env, _ = _instance(tmp_path, plane.url, HTTP_PROXY=dead, HTTPS_PROXY=dead,
                       NO_PROXY=f"{GATEWAY_HOST},clawmanager-gateway,127.0.0.1,localhost")
    done = _report_once(env)
    assert done.returncode == 0, done.stderr
    assert plane.store.reports(INSTANCE, last=True)["body"]["agent_id"] == f"hermes-{INSTANCE}-main"
    # A loopback plane is never proxied (host/proxies.chosen_proxy, the forwarder's rule too):
    # without NO_PROXY the same dead proxy is not used for it either.
    plane_before = len(plane.requests)
    del env["NO_PROXY"]
    assert _report_once(env, deadline=5).returncode == 0
    assert len(plane.requests) > plane_before
    # The control, with the gateway's own name: without NO_PROXY the dead proxy is used; with
    # it in NO_PROXY, the name is looked up directly (and resolves nowhere here).
    env["CLAWMANAGER_AGENT_BASE_URL"] = GATEWAY
    refused = _report_once(env, deadline=5)
    assert refused.returncode == 1 and "ProxyError" in refused.stderr, refused.stderr
    env["NO_PROXY"] = GATEWAY_HOST
    direct = _report_once(env, deadline=5)
    assert direct.returncode == 1 and "gaierror" in direct.stderr and "ProxyError" not in direct.stderr, direct.stderr


# ------------------------------------------------------------------ issue 34: names, ids, skill dirs

def test_an_older_server_that_injects_only_the_marker_never_names_the_agent_after_it(caldera_env, plane, tmp_path):
    """0.1.0 took CLAWMANAGER_RUNTIME_TYPE=desktop for the runtime: `desktop-7-main`."""
    env, _ = _instance(tmp_path, plane.url)
    del env["CLAWMANAGER_AGENT_RUNTIME_TYPE"]
    done = _report_once(env)
    assert done.returncode == 0, done.stderr
    report = plane.store.reports(INSTANCE, last=True)["body"]
    assert report["agent_id"] == f"caldera-{INSTANCE}-main" and report["runtime"]["runtime_type"] == "caldera"
    [agent] = [a for a in plane.store.agents() if a["instance_id"] == INSTANCE]
    assert agent["agent_id"] == f"caldera-{INSTANCE}-main" and agent["host_info"]["runtime_type"] == "caldera"


def test_a_session_issued_to_another_agent_id_is_not_reused_the_agent_registers_once(caldera_env, plane, tmp_path):
    """Upgraded from 0.1.0, whose session.json was issued to `desktop-7-main` (here set with
    CLAWMANAGER_AGENT_ID, as an image may): the new id registers afresh, once."""
    env, state = _instance(tmp_path, plane.url, CLAWMANAGER_AGENT_ID=f"desktop-{INSTANCE}-main")
    assert _report_once(env).returncode == 0
    assert plane.count("POST", "/register$", 200) == 1
    del env["CLAWMANAGER_AGENT_ID"]
    done = _report_once(env)
    assert done.returncode == 0, done.stderr
    assert "registered" in done.stderr and plane.count("POST", "/register$", 200) == 2
    assert json.loads((state / "session.json").read_text())["agent_id"] == f"hermes-{INSTANCE}-main"
    assert _report_once(env).returncode == 0
    assert plane.count("POST", "/register$", 200) == 2  # once for the new id, then its session is reused
    assert plane.store.reports(INSTANCE, last=True)["body"]["agent_id"] == f"hermes-{INSTANCE}-main"
    assert BOOT not in done.stderr


def _run(env, log_path):
    """`caldera run` as the container's command (not PID 1 here: that is tested below)."""
    with open(log_path, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "caldera.cli", "run"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc):
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(WAIT + 20) == 0


def test_what_the_outbox_holds_under_the_old_agent_id_goes_out_once_under_the_new(caldera_env, plane, tmp_path):
    """Upgraded from 0.1.0 (`desktop-7-main`, here set with CLAWMANAGER_AGENT_ID) with a finish
    held in the outbox by a 503: restarted as `hermes-7-main`, the finish queued under the old id
    is delivered once, under the session's id (the plane refuses any other with 403 "agent id
    does not match session"), after exactly one register; the command does not stay `running`."""
    env, state = _instance(tmp_path, plane.url, CLAWMANAGER_AGENT_ID=f"desktop-{INSTANCE}-main")
    log = tmp_path / "run.log"
    proc = _run(env, log)
    try:
        wait_for(lambda: plane.count("POST", "/state/report$", 200), what="the old agent reporting")
        plane.inject("POST", r"/commands/\d+/finish$", 503, count=10_000, retry_after=1)
        cid = plane.store.enqueue(INSTANCE, "collect_system_info", {})
        wait_for(lambda: plane.count("POST", rf"/commands/{cid}/finish$", 503), what="the finish refused")
        _stop(proc)  # the final flush meets the 503 too: the finish stays queued under the old id
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert [n for n in os.listdir(state / "outbox") if n.endswith("-finish.json")]
    assert plane.store.command(INSTANCE, cid)["status"] == "running"
    plane.clear_faults()
    plane.requests.clear()
    del env["CLAWMANAGER_AGENT_ID"]
    proc = _run(env, log)
    try:
        done = wait_for(lambda: (c := plane.store.command(INSTANCE, cid))["status"] == "succeeded" and c,
                        timeout=30, what="the queued finish delivered under the new id")
        assert done["result"]
        wait_for(lambda: plane.count("POST", "/state/report$", 200), what="reports under the new id")
        _stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert plane.count("POST", "/register$") == 1  # the new id's, once
    assert plane.count("POST", rf"/commands/{cid}/finish$") == 1  # delivered once, no 403 before it
    assert not [r for r in plane.requests if r[2] == 403]
    assert not [n for n in os.listdir(state / "outbox") if n.endswith(".json")]
    assert BOOT not in log.read_text()


def test_a_bad_agent_id_stops_the_start_with_a_sentence(caldera_env, plane, tmp_path):
    env, state = _instance(tmp_path, plane.url, CLAWMANAGER_AGENT_ID="hermes 7 main")
    done = _report_once(env)
    assert done.returncode == 2 and plane.count("POST", "/register$") == 0
    assert done.stderr.strip().endswith(
        "CLAWMANAGER_AGENT_ID='hermes 7 main': use letters, digits, '.', '_', ':', '@' or '-', starting with a "
        "letter or digit (' ' inside it: no spaces)"), done.stderr
    assert "Traceback" not in done.stderr


def test_caldera_status_names_the_runtimes_skill_dirs(caldera_env, plane, tmp_path):
    env, state = _instance(tmp_path, plane.url)
    run = [sys.executable, "-m", "caldera.cli", "status"]
    doc = json.loads(subprocess.run([*run, "--json"], env=env, capture_output=True, text=True, timeout=60,
                                    check=True).stdout)
    assert doc["skills"]["from"] == "hermes default" and doc["skills"]["managed"] == str(state / "skills")
    assert [d["path"] for d in doc["skills"]["discovered"]] == ["/config/hermes/skills", "/config/.hermes/skills"]
    human = subprocess.run(run, env=env, capture_output=True, text=True, timeout=60, check=True).stdout
    assert f"skills: {state / 'skills'} (managed); /config/hermes/skills" in human and "(hermes default)" in human
    env["CLAWMANAGER_AGENT_SKILL_DIRS"] = str(tmp_path / "mine")
    doc = json.loads(subprocess.run([*run, "--json"], env=env, capture_output=True, text=True, timeout=60,
                                    check=True).stdout)
    assert doc["skills"]["discovered"] == [{"path": str(tmp_path / "mine"), "exists": False}]
    assert doc["skills"]["from"] == "CLAWMANAGER_AGENT_SKILL_DIRS"


# ------------------------------------------------------------------ issue 34: the LLM governance fields

LLM_KEY = "sk-GATEWAYCANARY-0123456789abcdef"  # the gateway's key, as the platform injects it
OWN_KEY = "sk-OWNCANARY-0123456789abcdef"  # a provider key of caldera's own projection
GATEWAY_LLM = "http://clawmanager-gateway.demo-system.svc.cluster.local:9001/api/v1/gateway/llm"
INJECTED_LLM = {"CLAWMANAGER_LLM_BASE_URL": GATEWAY_LLM, "CLAWMANAGER_LLM_API_KEY": LLM_KEY,
                "CLAWMANAGER_LLM_MODEL": '["auto","gpt-4.1"]', "CLAWMANAGER_LLM_PROVIDER": "openai-compatible",
                "CLAWMANAGER_INSTANCE_TOKEN": LLM_KEY, "OPENAI_BASE_URL": GATEWAY_LLM, "OPENAI_API_BASE": GATEWAY_LLM,
                "OPENAI_API_KEY": LLM_KEY, "OPENAI_MODEL": "auto",
                # CM-aug's (clawmanager-notes 1.5): JSON of a shape the notes do not give, and the egress id
                "CLAWMANAGER_LLM_REASONING": '{"gpt-4.1":"medium"}',
                "CLAWMANAGER_LLM_REASONING_CONTROL": '{"enabled":true}',
                "CLAWMANAGER_EGRESS_INSTANCE_ID": str(INSTANCE)}
BOUND = PROCESS_MANIFEST + "bindings: [llm_gateway]\n"


def _project_codex(config, key=OWN_KEY):
    """secrets/codex/ of the agent: a provider of its own, its URL carrying credentials."""
    codex = config / "secrets" / "codex"
    (codex / "env").mkdir(parents=True)
    (codex / "config.toml").write_text(
        'model = "gpt-5.5"\nmodel_provider = "corp"\n[model_providers.corp]\n'
        f'base_url = "https://svc:{key}@llm.corp.test/v1?token={key}#{key}"\nenv_key = "CORP_KEY"\n')
    (codex / "env" / "CORP_KEY").write_text(key)


@pytest.mark.parametrize("manifest, roots, projected, status, url, sources", [
    (None, False, False, None, None, []),  # the gateway is injected, but caldera hands it to nobody
    (BOUND, False, False, "gateway", GATEWAY_LLM, ["process agent"]),
    # runs may start: every backend gets the gateway (Claude Code on its Messages route, issue 45)
    (None, True, False, "gateway", GATEWAY_LLM, ["backend claude-code", "backend codex", "backend opencode"]),
    # the image's CLAWMANAGER_PROJECT_PATH is the workspace root when agent.env names none
    (None, "project", False, "gateway", GATEWAY_LLM, ["backend claude-code", "backend codex", "backend opencode"]),
    (None, True, True, "external", "https://llm.corp.test/v1",
     ["backend codex", "backend claude-code", "backend opencode"]),
    (BOUND, True, True, "external", "https://llm.corp.test/v1",
     ["backend codex", "backend claude-code", "backend opencode", "process agent"]),  # never hidden
], ids=["none", "process-bound", "gateway", "project-path", "codex-own", "both"])
def test_the_report_says_what_llm_configuration_caldera_hands_out(caldera_env, plane, tmp_path, manifest, roots,
                                                                   projected, status, url, sources):
    if manifest is not None:
        manifest = manifest.format(python=json.dumps(sys.executable), agent=json.dumps(str(FAKE)), mode="run")
    project = {"CLAWMANAGER_PROJECT_PATH": str(tmp_path / "workspace")} if roots == "project" else {}
    env, _ = _instance(tmp_path, plane.url, manifest=manifest, **INJECTED_LLM, **project)
    config = Path(env["CALDERA_CONFIG_DIR"]) / "agents" / "demo"
    if roots is True:
        (config / "agent.env").write_text(f"CALDERA_WORKSPACE_ROOTS={tmp_path}\n")
    if projected:
        _project_codex(config)
    done = _report_once(env)
    assert done.returncode == 0, done.stderr
    runtime = plane.store.reports(INSTANCE, last=True)["body"]["runtime"]
    [agent] = [a for a in plane.store.agents() if a["instance_id"] == INSTANCE]
    if status is None:
        assert not [k for k in runtime if k.startswith("llm_")] and agent["llm"]["status"] == "unknown"
    else:
        assert runtime["llm_config_status"] == status == agent["llm"]["status"]  # as ClawManager classifies it
        assert runtime["llm_provider_base_url"] == url
        assert runtime["llm_config_fingerprint"].startswith("sha256:")
        assert [c["source"] for c in runtime["llm_configs"]] == sources
    everything = json.dumps([r["body"] for r in plane.store.reports(INSTANCE)]) + done.stdout + done.stderr
    assert LLM_KEY not in everything and OWN_KEY not in everything and BOOT not in everything


def test_the_fingerprint_follows_the_configuration_and_only_it(caldera_env, plane, tmp_path):
    env, state = _instance(tmp_path, plane.url, **INJECTED_LLM)
    config = Path(env["CALDERA_CONFIG_DIR"]) / "agents" / "demo"
    (config / "agent.env").write_text(f"CALDERA_WORKSPACE_ROOTS={tmp_path}\n")

    def fingerprint(**changes):
        assert _report_once(dict(env, **changes)).returncode == 0
        return plane.store.reports(INSTANCE, last=True)["body"]["runtime"]["llm_config_fingerprint"]

    first = fingerprint()
    assert fingerprint() == first  # a restart: the same
    assert fingerprint(CLAWMANAGER_LLM_API_KEY="sk-another-0123456789", OPENAI_API_KEY="x") == first  # not the key
    assert fingerprint(OPENAI_MODEL="gpt-4.1") != first
    assert fingerprint(CLAWMANAGER_LLM_BASE_URL="http://gw2.test/api/v1/gateway/llm") != first
    assert fingerprint(CLAWMANAGER_LLM_PROVIDER="other") != first


def _plane_bytes(tmp_path):
    """Everything the plane keeps on disk (its database and any journal beside it)."""
    return b"".join(p.read_bytes() for p in tmp_path.glob("plane.db*"))


OWN_OPENAI_KEY = "sk-OPERATORSOWN-0123456789abcdef"


@pytest.mark.parametrize("how", ["own key in agent.env under the gateway's names", "an injected vendor URL"])
def test_gateway_is_said_only_of_the_platforms_gateway(caldera_env, plane, tmp_path, how):
    """ClawManager trusts the status sent: names alone never make a consumer compliant."""
    if how.startswith("own key"):  # no gateway injected; the operator's own OpenAI key, under the same names
        env, _ = _instance(tmp_path, plane.url)
        config = Path(env["CALDERA_CONFIG_DIR"]) / "agents" / "demo"
        (config / "agent.env").write_text(f"CALDERA_WORKSPACE_ROOTS={tmp_path}\n"
                                          "OPENAI_BASE_URL=https://api.openai.com/v1\n")
        (config / "secrets.env").write_text(f"OPENAI_API_KEY={OWN_OPENAI_KEY}\n")
        url = "https://api.openai.com/v1"
    else:  # injected in the process environment, but no gateway of the platform's
        url = "https://api.anthropic.com"
        env, _ = _instance(tmp_path, plane.url, **dict(INJECTED_LLM, CLAWMANAGER_LLM_BASE_URL=url))
        config = Path(env["CALDERA_CONFIG_DIR"]) / "agents" / "demo"
        (config / "agent.env").write_text(f"CALDERA_WORKSPACE_ROOTS={tmp_path}\n")
    done = _report_once(env)
    assert done.returncode == 0, done.stderr
    runtime = plane.store.reports(INSTANCE, last=True)["body"]["runtime"]
    assert (runtime["llm_config_status"], runtime["llm_provider_base_url"]) == ("external", url)
    [agent] = [a for a in plane.store.agents() if a["instance_id"] == INSTANCE]
    assert agent["llm"]["status"] == "external"  # counted non-compliant
    assert OWN_OPENAI_KEY.encode() not in _plane_bytes(tmp_path) and LLM_KEY.encode() not in _plane_bytes(tmp_path)


def test_keys_in_a_urls_path_reach_neither_the_report_nor_the_planes_database(caldera_env, plane, tmp_path):
    """A projection's key percent-encoded in its URL's path; the gateway's own key in its URL's
    path (cut from the URL before the fingerprint: a new key leaves the fingerprint as it was)."""
    own, encoded = "tenant+q7Zx/PRIVATEKEY99", "tenant%2Bq7Zx%2FPRIVATEKEY99"
    gateway_url = f"{GATEWAY_LLM}/{LLM_KEY}"

    def report(gateway_key, projected):
        env, _ = _instance(tmp_path, plane.url, **dict(INJECTED_LLM, CLAWMANAGER_LLM_BASE_URL=gateway_url.replace(
            LLM_KEY, gateway_key), CLAWMANAGER_LLM_API_KEY=gateway_key, OPENAI_API_KEY=gateway_key))
        config = Path(env["CALDERA_CONFIG_DIR"]) / "agents" / "demo"
        (config / "agent.env").write_text(f"CALDERA_WORKSPACE_ROOTS={tmp_path}\n")
        if projected:
            codex = config / "secrets" / "codex"
            (codex / "env").mkdir(parents=True)
            (codex / "config.toml").write_text(f'model_provider = "corp"\n[model_providers.corp]\nbase_url = '
                                               f'"https://llm.corp.test/v1/{encoded}"\nenv_key = "CORP_KEY"\n')
            (codex / "env" / "CORP_KEY").write_text(own)
        done = _report_once(env)
        assert done.returncode == 0, done.stderr
        shutil.rmtree(config)
        shutil.rmtree(tmp_path / "config")
        shutil.rmtree(tmp_path / "home")
        return plane.store.reports(INSTANCE, last=True)["body"]["runtime"]

    first = report(LLM_KEY, projected=False)
    assert (first["llm_config_status"], first["llm_provider_base_url"]) == ("gateway", GATEWAY.lower())
    assert first["code_agent_confinement"] == "backend"  # no CALDERA_RUN_SANDBOX: each backend's own sandbox
    assert report("sk-ANOTHERKEY-9876543210", projected=False)["llm_config_fingerprint"] == \
        first["llm_config_fingerprint"]
    projected = report(LLM_KEY, projected=True)
    assert (projected["llm_config_status"], projected["llm_provider_base_url"]) == ("external", "https://llm.corp.test")
    stored = _plane_bytes(tmp_path)
    for secret in (LLM_KEY, own, encoded, "PRIVATEKEY99"):
        assert secret.encode() not in stored, secret


@pytest.mark.parametrize("injected, said, model", [
    ({"CLAWMANAGER_LLM_MODEL": "gpt-4.1"},  # not a list: named once, then ignored
     "CLAWMANAGER_LLM_MODEL is not JSON (the platform sends a JSON list of model ids): the AI gateway's model "
     "catalogue is ignored (a run's model is the one it asks for, else OPENAI_MODEL)", "auto"),
    ({"OPENAI_MODEL": "gpt-5"},  # a default model the catalogue does not list: named once
     "OPENAI_MODEL='gpt-5' is not in the AI gateway's catalogue (CLAWMANAGER_LLM_MODEL: auto, gpt-4.1): a run "
     "that names no model asks for it, and the gateway may refuse it", "gpt-5"),
], ids=["catalogue-not-a-list", "default-model-not-listed"])
def test_what_is_wrong_with_the_gateway_as_injected_is_named_once(caldera_env, plane, tmp_path, injected, said,
                                                                  model):
    env, _ = _instance(tmp_path, plane.url, **dict(INJECTED_LLM, **injected))
    config = Path(env["CALDERA_CONFIG_DIR"]) / "agents" / "demo"
    (config / "agent.env").write_text(f"CALDERA_WORKSPACE_ROOTS={tmp_path}\n")
    done = _report_once(env)
    assert done.returncode == 0, done.stderr
    named = [line for line in done.stderr.splitlines() if "gateway" in line and "WARNING" in line
             and "plain http" not in line]
    assert named == [f"WARNING caldera: {said}"], done.stderr
    described = plane.store.reports(INSTANCE, last=True)["body"]["runtime"]["llm_configs"]
    # OPENAI_MODEL for each backend on the gateway (all three), never the raw value of the catalogue
    assert [d["model"] for d in described] == [model, model, model]


def test_a_project_path_holding_the_persistent_dir_is_named_once_and_not_a_workspace_root(caldera_env, plane,
                                                                                           tmp_path):
    env, _ = _instance(tmp_path, plane.url, CLAWMANAGER_PROJECT_PATH=str(tmp_path / "config"))
    done = _report_once(env)
    assert done.returncode == 0, done.stderr
    named = [line for line in done.stderr.splitlines() if "CLAWMANAGER_PROJECT_PATH" in line]
    assert named == [f"WARNING caldera: CLAWMANAGER_PROJECT_PATH={tmp_path / 'config'} is not used as the workspace "
                     f"root (it holds {tmp_path / 'config' / '.hermes'}, the runtime's own state): control-plane runs "
                     "are refused until CALDERA_WORKSPACE_ROOTS names the directories they may work in"], done.stderr
    assert not plane.store.reports(INSTANCE, last=True)["body"]["runtime"].get("llm_configs")  # no run can start


# ------------------------------------------------------------------ PID 1

def _pid_namespace() -> list[str] | None:
    """An `unshare` prefix that runs a command as PID 1 of a new PID namespace (as root, or
    in a user namespace of its own), or None where neither is allowed."""
    if shutil.which("unshare") is None:
        return None
    for prefix in (["unshare", "--pid", "--fork", "--mount-proc"],
                   ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"]):
        if subprocess.run([*prefix, "true"], capture_output=True).returncode == 0:
            return prefix
    return None


def _table() -> dict[int, tuple[int, str]]:
    table = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2:].split()
        table[int(entry)] = (int(fields[1]), fields[0].decode())
    return table


def _ns_pid(pid: int) -> int | None:
    """A host pid's pid in its own (innermost) PID namespace."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            return next((int(line.split()[-1]) for line in fh if line.startswith("NSpid:")), None)
    except OSError:
        return None


def _descendants(root: int) -> dict[int, str]:
    """pid -> state of every process under `root` (host pids)."""
    table, found, frontier = _table(), {}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, state) in table.items():
            if ppid == parent and pid not in found:
                found[pid] = state
                frontier.append(pid)
    return found


class Pid1:
    """`caldera run` as PID 1 of a new PID namespace: a container started with `env`. Its
    output goes to `log_path`; `init` is its host pid (signals to it are the container's).
    With `terminal`, the container's command is the session leader of a new pseudo-terminal
    in its foreground group (`docker run -it`); `ctrl_c` types on it."""

    def __init__(self, prefix, env, log_path, terminal=False):
        self.log_path = log_path
        self.master = None
        self.reader = None
        if terminal:
            self.master, slave = pty.openpty()
            self.proc = subprocess.Popen(["setsid", "--ctty", *prefix, sys.executable, "-m", "caldera.cli", "run"],
                                         env=env, stdin=slave, stdout=slave, stderr=slave)
            os.close(slave)
            self.reader = threading.Thread(target=self._drain, daemon=True)
            self.reader.start()
        else:
            with open(log_path, "ab") as out:
                self.proc = subprocess.Popen([*prefix, sys.executable, "-m", "caldera.cli", "run"], env=env,
                                             stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.init = wait_for(lambda: next(iter(p for p, (pp, _) in _table().items() if pp == self.proc.pid), None),
                             what="PID 1 of the namespace")

    def _drain(self):
        with open(self.log_path, "ab") as out:
            while True:
                try:
                    chunk = os.read(self.master, 4096)
                except OSError:  # EIO: the terminal's last user is gone
                    return
                if not chunk:
                    return
                out.write(chunk.replace(b"\r\n", b"\n"))
                out.flush()

    def ctrl_c(self):
        os.write(self.master, b"\x03")

    def kill9(self):
        """A hard kill of the container: PID 1 dies, and with it every process of the namespace."""
        os.kill(self.init, signal.SIGKILL)
        self.proc.wait(10)

    def close(self):
        if self.proc.poll() is None:
            self.kill9()
        if self.master is not None:
            self.reader.join(10)
            os.close(self.master)
            self.master = None

    def log(self) -> str:
        return self.log_path.read_text()


def _pid_namespace_or_skip() -> list[str]:
    prefix = _pid_namespace()
    if prefix is None:
        pytest.skip("no PID namespace here (unshare refused, as root and in a user namespace)")
    return prefix


def _report_with_pid(plane):
    return wait_for(lambda: (r := plane.store.reports(INSTANCE, last=True)) and
                    isinstance(r["body"]["runtime"].get("openclaw_pid"), int) and r["body"],
                    timeout=30, what="a report with the agent's pid")


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_pid_1_reaps_orphans_keeps_its_own_waits_and_stops_gracefully(caldera_env, plane, tmp_path, stop):
    prefix = _pid_namespace_or_skip()
    manifest = PROCESS_MANIFEST.format(python=json.dumps(sys.executable), agent=json.dumps(str(FAKE)), mode="orphans")
    env, state = _instance(tmp_path, plane.url, manifest=manifest)
    container = Pid1(prefix, env, tmp_path / "pid1.log")
    init = container.init
    try:
        report = _report_with_pid(plane)
        assert report["agent_id"] == f"hermes-{INSTANCE}-main"
        orphans_file = state / "agent" / "orphans.json"
        orphans = json.loads(wait_for(lambda: orphans_file.exists() and orphans_file.read_text(), timeout=30,
                                      what="the agent's grandchildren"))
        for orphan in orphans:  # each was handed to PID 1 when its parent exited
            record = Path(orphan["record"])
            assert wait_for(lambda r=record: r.exists() and r.read_text(), what="an orphan's parent") == "1"
        # ... and none is left as a zombie: each ends 0.3 s after its record, and leaves the
        # process table only once PID 1 has waited for it (a zombie stays in it)
        grandchildren = {orphan["pid"] for orphan in orphans}  # their pids in the namespace
        wait_for(lambda: not grandchildren & {_ns_pid(p) for p in _descendants(init)}, timeout=30,
                 what="the grandchildren ended and reaped")
        wait_for(lambda: not [p for p, s in _descendants(init).items() if s == "Z"], what="no zombie in the namespace")
        cid = plane.store.enqueue(INSTANCE, "collect_system_info", {})
        done = wait_for(lambda: (c := plane.store.command(INSTANCE, cid))["status"] in ("succeeded", "failed") and c,
                        timeout=30, what="a command round trip")
        assert done["status"] == "succeeded"
        os.kill(init, stop)
        assert container.proc.wait(WAIT + 20) == 0  # bounded: the agent's stop and the final report
    finally:
        container.close()
    log = container.log()
    assert "caldera run is PID 1: this process reaps orphans" in log, log
    assert "stopping the agent" in log and "INFO caldera.daemon: stopped" in log, log
    # The runtime's own wait got its agent's exit status (a PID 1 reaping with waitpid(-1)
    # in the runtime's process would have taken it: "status 0" would then be a guess or an error).
    agent_log = (state / "logs" / "agent.log").read_text()
    assert "the runtime stopped (exited with status 0)" in agent_log, agent_log
    assert not [line for line in log.splitlines() if line.startswith("<")]  # plain lines, no journald prefix
    last = plane.store.reports(INSTANCE, last=True)["body"]
    # the final report says what the stop left: the agent stopped, no pid
    assert last["runtime"]["openclaw_status"] == "stopped" and last["runtime"]["openclaw_pid"] is None, last
    assert last["runtime"]["runtime_status"] == "stopping"
    assert BOOT not in log


def test_a_hard_killed_container_restarted_loses_nothing(caldera_env, plane, tmp_path):
    """kill -9 of PID 1 (the container's hard kill: the agent dies with it) while the plane
    answers every finish 503; restarted with the same persistent dir: the session is reused
    (no second register), the queued finish reaches the plane exactly once, reports resume."""
    prefix = _pid_namespace_or_skip()
    manifest = PROCESS_MANIFEST.format(python=json.dumps(sys.executable), agent=json.dumps(str(FAKE)), mode="run")
    env, state = _instance(tmp_path, plane.url, manifest=manifest)
    container = Pid1(prefix, env, tmp_path / "pid1.log")
    try:
        _report_with_pid(plane)
        plane.inject("POST", r"/commands/\d+/finish$", 503, count=10_000, retry_after=1)
        cid = plane.store.enqueue(INSTANCE, "collect_system_info", {})
        outbox = state / "outbox"
        wait_for(lambda: [n for n in os.listdir(outbox) if n[0].isdigit() and n.endswith("-finish.json")],
                 timeout=20, what="the finish queued in the outbox")
        wait_for(lambda: plane.count("POST", rf"/commands/{cid}/finish$", 503), what="the plane refusing it")
        container.kill9()
    finally:
        container.close()
    plane.clear_faults()
    plane.requests.clear()
    container = Pid1(prefix, env, tmp_path / "pid1.log")
    try:
        done = wait_for(lambda: (c := plane.store.command(INSTANCE, cid))["status"] == "succeeded" and c,
                        timeout=30, what="the queued finish delivered after the restart")
        assert done["result"]  # the result recorded before the kill, not a re-run's
        wait_for(lambda: plane.count("POST", "/state/report$", 200), what="reports resumed")
        wait_for(lambda: not [n for n in os.listdir(outbox) if n.endswith("-finish.json")],
                 what="the finish gone from the outbox")
        # A graceful stop: the sender's last pass and the final flush are behind us, so anything
        # that would be sent twice has been by the exit.
        os.kill(container.init, signal.SIGTERM)
        assert container.proc.wait(WAIT + 20) == 0
    finally:
        container.close()
    assert plane.count("POST", rf"/commands/{cid}/finish$", 200) == 1
    assert plane.count("POST", rf"/commands/{cid}/start$") == 0  # never executed again
    assert plane.count("POST", "/register$") == 0  # the session in the persistent dir was reused
    assert BOOT not in container.log()


@pytest.mark.skipif(shutil.which("setsid") is None, reason="no setsid(1)")
def test_ctrl_c_at_a_terminal_counts_once(caldera_env, plane, tmp_path):
    """`docker run -it`: Ctrl-C sends SIGINT to the terminal's foreground group, PID 1 and the
    runtime alike, so the runtime has its own; PID 1 must not pass its copy on. Two Ctrl-Cs
    are then two signals (a drain, then a cancel: still a graceful stop with its final report);
    with PID 1 forwarding, they were four, and the third made the runtime exit at once. The
    agent ignores SIGTERM, so its stop (stop_timeout_seconds, then KILL) leaves time for both."""
    prefix = _pid_namespace_or_skip()
    manifest = PROCESS_MANIFEST.format(python=json.dumps(sys.executable), agent=json.dumps(str(FAKE)),
                                       mode="stubborn")
    env, state = _instance(tmp_path, plane.url, manifest=manifest)
    container = Pid1(prefix, env, tmp_path / "pid1.log", terminal=True)
    try:
        _report_with_pid(plane)
        container.ctrl_c()
        wait_for(lambda: "stopping the agent" in container.log(), what="the stop begun")
        container.ctrl_c()
        assert container.proc.wait(WAIT + 20) == 0
    finally:
        container.close()
    log = container.log()
    assert "stopping: draining" in log and "INFO caldera.daemon: stopped" in log, log
    last = plane.store.reports(INSTANCE, last=True)["body"]
    assert last["runtime"]["openclaw_status"] == "stopped" and last["runtime"]["runtime_status"] == "stopping", last
    assert BOOT not in log
