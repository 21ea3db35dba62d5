"""Building blocks for the core tests: an installed agent tree and a Runtime."""
import os
from pathlib import Path

from caldera.config import agent_from_args, load_settings

BOOT = "boot-canary-7f3a9c2e"
SECRET = "secret-env-canary-51d0b8"


MANIFEST = """name: {name}
version: 1.0.0
runtime:
  type: adapter
  command: [python3, adapter.py]
  workdir: .
"""

# A small, well-behaved adapter; it also records each call, so tests can see what ran.
ADAPTER = r"""
import json, os, sys
verb = sys.argv[1:]
with open("calls.log", "a") as fh:
    fh.write(" ".join(verb) + "\n")
if verb == ["status"]:
    print(json.dumps({"state": {"level": "ok", "label": "Ready"}, "gauges": [{"name": "Week", "used": 0.25}]}))
elif verb == ["pause"]:
    print(json.dumps({"message": "Paused."}))
elif verb[:2] == ["settings", "get"]:
    print(json.dumps({"values": {}}))
elif verb[:2] == ["log", "--list"]:
    print(json.dumps({"logs": []}))
else:
    sys.exit(2)
"""


class Args:
    def __init__(self, agent=None, manifest=None, state_dir=None, json=False):
        self.agent, self.manifest, self.state_dir, self.json = agent, manifest, state_dir, json


def install_agent(root: Path, name="demo", base_url="http://127.0.0.1:9", instance_id=7, extra_env="",
                  manifest=None) -> Path:
    config = Path(os.environ["CALDERA_CONFIG_DIR"]) / "agents" / name
    config.mkdir(parents=True)
    (config / "caldera.agent.yaml").write_text(manifest or MANIFEST.format(name=name))
    (config / "adapter.py").write_text(ADAPTER)
    (config / "agent.env").write_text(
        f"CALDERA_AGENT_ENABLED=true\nCALDERA_BASE_URL={base_url}\nCALDERA_INSTANCE_ID={instance_id}\n{extra_env}")
    secrets = config / "secrets.env"
    secrets.write_text(f"CALDERA_TOKEN={BOOT}\nOTHER_SECRET={SECRET}\n")
    secrets.chmod(0o600)
    return config


def make_parts(name="demo", **build):
    from caldera.daemon.wiring import build_parts

    paths = agent_from_args(Args(agent=name))
    settings = load_settings(paths)
    return build_parts(paths, settings, **build)


def replaced(context, **changes):
    """A copy of a handler's context with `changes` (what dataclasses.replace gave)."""
    from caldera.protocol.handlers import fields

    values = {name: getattr(context, name) for name in fields(context)}
    values.update(changes)
    return type(context)(**values)


def command_context(context_type, command_type="collect_system_info", command=None, **fields):
    """A handler's context of `context_type` (a domain's Call: AgentCall, SkillCall, RunCall,
    RevisionCall, BuiltinCall) with the given parts; every part not given is None (a handler
    that uses one fails loudly), the cancel a fresh event, no deadline. `command`: the plane's
    command object (default: id 1 of `command_type`)."""
    import threading

    from caldera.protocol.command import parse_command
    from caldera.protocol.handlers import fields as context_fields

    given = {name: None for name in context_fields(context_type)}
    given.update(cancel=threading.Event(), deadline=0.0)
    given.update(fields, command=parse_command(command or {"id": 1, "command_type": command_type}))
    return context_type(**given)
