"""Manifest loading: the checks, the forbidden keys, workdir resolution, the parse cache,
and the plain checks agreeing with schemas/manifest.schema.json."""
import json
import os
import subprocess
import sys

import pytest
import yaml
from adapter_helpers import setting
from process_helpers import manifest_doc

from caldera.agents.manifest import FORBIDDEN_IN_ADAPTER_MODE, check_document, load_manifest, schema_check
from caldera.errors import ConfigError

BASE = {"name": "a", "runtime": {"type": "adapter", "command": ["./adapter"], "workdir": "."}}


def _doc(**over):
    return manifest_doc(BASE, **over)


def _write(tmp_path, doc, name="caldera.agent.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("key", FORBIDDEN_IN_ADAPTER_MODE)
def test_forbidden_keys_are_named(tmp_path, key):
    with pytest.raises(ConfigError, match=f"'{key}' is not allowed with runtime.type: adapter"):
        load_manifest(_write(tmp_path, _doc(**{key: {"path": "x"}})))


def test_process_mode_may_name_them():
    check_document(_doc(runtime_type="process", status={"file": "status.json"}), "m")


def test_command_string_is_refused():
    with pytest.raises(ConfigError, match="never a shell string"):
        check_document(_doc(runtime_command="python3 adapter.py"), "m")


@pytest.mark.parametrize("value", [0, 121, 2.5, "10", True])
def test_timeout_range(value):
    with pytest.raises(ConfigError, match="runtime.timeout_seconds"):
        check_document(_doc(runtime_timeout_seconds=value), "m")


def test_relative_workdir_and_command_resolve_from_the_manifest_dir(tmp_path):
    (tmp_path / "bundle" / "sub").mkdir(parents=True)
    path = _write(tmp_path / "bundle", _doc(runtime_workdir="sub", runtime_command=["./run", "x"]))
    manifest = load_manifest(path)
    assert manifest.workdir == (tmp_path / "bundle" / "sub").resolve()
    assert manifest.command == (str(manifest.workdir / "./run"), "x")
    bare = load_manifest(_write(tmp_path, _doc(runtime_command=["python3", "a.py"])))
    assert bare.command == ("python3", "a.py")  # a bare name is looked up on the adapter's PATH


def test_bad_yaml_names_the_line(tmp_path):
    path = tmp_path / "caldera.agent.yaml"
    path.write_text("name: a\nruntime: [\n")
    with pytest.raises(ConfigError, match=r"not valid YAML \(line"):
        load_manifest(path)


def test_defaults_are_checked_against_their_item():
    settings = {"schema": [{"key": "m", "type": "percent", "min": 0.1, "max": 0.9}], "defaults": {"m": 0.95}}
    with pytest.raises(ConfigError, match="settings.defaults.m: 0.95 is above the maximum 0.9"):
        check_document(_doc(settings=settings), "m")


def test_controls_subset():
    with pytest.raises(ConfigError, match="'restart' is not one of pause, resume, run_now"):
        check_document(_doc(controls=["pause", "restart"]), "m")


def test_cache_skips_yaml_and_follows_changes(tmp_path):
    path = _write(tmp_path, _doc(version="1"))
    cache = tmp_path / "state" / "cache"
    assert load_manifest(path, cache_dir=cache).version == "1"
    assert (cache / "manifest.json").exists()
    # A warm cache never imports yaml (checked in a fresh interpreter).
    code = ("import sys; from caldera.agents.manifest import load_manifest;"
            f"m = load_manifest({str(path)!r}, cache_dir={str(cache)!r});"
            "print(m.version, 'yaml' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["1", "False"]
    # Same size, new content: mtime (and inode) invalidate the entry.
    path.write_text(yaml.safe_dump(_doc(version="2")))
    os.utime(path, ns=(1, 1))
    assert load_manifest(path, cache_dir=cache).version == "2"


def test_tampered_cache_is_still_checked(tmp_path):
    path = _write(tmp_path, _doc())
    cache = tmp_path / "cache"
    load_manifest(path, cache_dir=cache)
    entry = json.loads((cache / "manifest.json").read_text())
    entry["doc"]["secrets"] = ["x"]
    (cache / "manifest.json").write_text(json.dumps(entry))
    with pytest.raises(ConfigError, match="'secrets' is not allowed"):
        load_manifest(path, cache_dir=cache)


def test_unwritable_cache_dir_costs_nothing_but_speed(tmp_path):
    path = _write(tmp_path, _doc())
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert load_manifest(path, cache_dir=blocker / "cache").name == "a"


# The plain checks and the schema give the same verdict. `plain_only` cases are ones a
# JSON schema can't say (min above max, defaults checked against their item, duplicates).
CORPUS = [
    (_doc(), True, False),
    (_doc(version="1.0", description="d", account=True, controls=["pause"]), True, False),
    (_doc(settings={"schema": [{"key": "m", "type": "percent", "min": 0.1, "max": 1, "step": 0.05,
                                "label": "M"}], "defaults": {"m": 0.5}}), True, False),
    (_doc(health={"command": ["./h"], "interval_seconds": 30, "timeout_seconds": 5}), True, False),
    (_doc(runtime_type="process", logs={"dir": "x"}), True, False),
    (_doc(name="-bad"), False, False),
    (_doc(name=5), False, False),
    (_doc(version=1.0), False, False),
    (_doc(extra=1), False, False),
    (_doc(runtime_type="docker"), False, False),
    (_doc(runtime_command=[]), False, False),
    (_doc(runtime_command="a b"), False, False),
    (_doc(runtime_command=[""]), False, False),
    (_doc(runtime_shell=True), False, False),
    (_doc(runtime_timeout_seconds=0), False, False),
    (_doc(runtime_timeout_seconds=121), False, False),
    (_doc(mcp={}), False, False),
    (_doc(secrets=[]), False, False),
    (_doc(controls=["stop"]), False, False),
    (_doc(controls="pause"), False, False),
    (_doc(controls=["pause", "pause"]), False, False),
    (_doc(account="yes"), False, False),
    (_doc(health={"interval_seconds": 30}), False, False),
    (_doc(health={"command": ["./h"], "interval_seconds": 5}), False, False),
    (_doc(settings={"schema": [{"key": "1x", "type": "number"}]}), False, False),
    (_doc(settings={"schema": [{"key": "x", "type": "float"}]}), False, False),
    (_doc(settings={"schema": [{"key": "x", "type": "percent", "max": 1.5}]}), False, False),
    (_doc(settings={"schema": [{"key": "x", "type": "boolean", "min": 0}]}), False, False),
    (_doc(settings={"schema": [{"key": "x", "type": "enum"}]}), False, False),
    (_doc(settings={"schema": [{"key": "x", "type": "string", "options": ["a"]}]}), False, False),
    (_doc(settings={"schema": [{"key": "x", "type": "number", "max_length": 3}]}), False, False),
    (_doc(settings={"schema": [{"key": "x", "type": "integer", "min": 0.5}]}), False, False),
    (_doc(settings={"schema": [{"key": "x", "type": "number", "step": 0}]}), False, False),
    (_doc(settings={"schema": [{"key": "x", "type": "number", "unit": "s"}]}), False, False),
    (_doc(settings={"schema": [], "other": 1}), False, False),
    (_doc(settings={"schema": [{"key": "x", "type": "number", "min": 2, "max": 1}]}), False, True),
    (_doc(settings={"schema": [{"key": "x", "type": "number"}], "defaults": {"x": "a"}}), False, True),
    (_doc(settings={"schema": [{"key": "x", "type": "number"}], "defaults": {"y": 1}}), False, True),
    (_doc(settings={"schema": [{"key": "x", "type": "number"}, {"key": "x", "type": "number"}]}), False, True),
    # process mode (SPEC 7b)
    (_doc(runtime_type="process", runtime_stop_signal="INT", runtime_stop_timeout_seconds=300,
          runtime_restart="always", runtime_run_now_signal="USR2", status="s.json", logs={"dir": "l"},
          state="/srv/a", instructions={"file": "p.md"}, secrets=["API_KEY"], bindings=["llm_gateway"],
          env={"MODE": "x"}, mcp={"fs": {"command": ["npx", "fs"]}, "web": {"url": "https://w.example/mcp"}},
          account="agent"), True, False),
    (_doc(runtime_type="process", account=True), True, False),
    (_doc(runtime_restart="always"), False, False),  # adapter mode has no restart
    (_doc(env={"A": "b"}), False, False),
    (_doc(account="agent"), False, False),
    (_doc(runtime_type="process", runtime_stop_signal="SIGTERM"), False, False),
    (_doc(runtime_type="process", runtime_stop_timeout_seconds=0), False, False),
    (_doc(runtime_type="process", runtime_restart="sometimes"), False, False),
    (_doc(runtime_type="process", status="../x"), False, False),
    (_doc(runtime_type="process", status={"path": "x"}), False, False),
    (_doc(runtime_type="process", secrets=["CALDERA_TOKEN"]), False, False),
    (_doc(runtime_type="process", secrets=["PATH"]), False, False),
    (_doc(runtime_type="process", secrets=["A", "A"]), False, False),
    (_doc(runtime_type="process", bindings=["vault"]), False, False),
    (_doc(runtime_type="process", env={"N": 5}), False, False),
    (_doc(runtime_type="process", env={"HOME": "/x"}), False, False),
    (_doc(runtime_type="process", mcp={"fs": {"command": "npx fs"}}), False, False),
    (_doc(runtime_type="process", mcp={"fs": {"url": "ftp://x"}}), False, False),
    (_doc(runtime_type="process", mcp={"fs": {"url": "https://x", "command": ["a"]}}), False, False),
    (_doc(runtime_type="process", account="Root User"), False, False),
    (_doc(runtime_type="process", env={"CLAWMANAGER_X": "y"}), False, True),  # plain only: a prefix rule
]


@pytest.mark.parametrize("doc,valid,plain_only", CORPUS)
def test_plain_checks_agree_with_the_schema(doc, valid, plain_only):
    def verdict(fn):
        try:
            fn(doc, "m")
        except ConfigError:
            return False
        return True

    assert verdict(check_document) is valid
    assert verdict(schema_check) is (valid or plain_only)


def test_the_example_manifest_is_valid():
    from adapter_helpers import EXAMPLE

    manifest = load_manifest(EXAMPLE / "caldera.agent.yaml", validate_schema=True)
    assert manifest.workdir == EXAMPLE.resolve()
    assert setting(manifest, "max_7d")["max"] == 1.0


def test_the_manifest_takes_each_field_by_name():
    """A plain class with __slots__ (the quick verbs' import budget), its fields typed keyword
    parameters: mypy checks `build`'s call, and every slot is a parameter."""
    import inspect

    from caldera.agents.manifest import Manifest

    params = inspect.signature(Manifest.__init__).parameters
    assert [name for name in params if name != "self"] == list(Manifest.__slots__)
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for name, p in params.items() if name != "self")
