"""The container recipes (packaging/container/, shipped in /usr/share/caldera/container/) say
what docs/container.md says: Debian 13, the .deb through apt, `caldera init` at build,
`caldera run` as the command, and a stop signal and timeout covering the agent's stop."""
import configparser
import re
from pathlib import Path

import yaml

from caldera.daemon import run as daemon_run
from caldera.host import proc

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "packaging" / "container"
S6 = RECIPES / "s6-overlay" / "s6-rc.d"
DOC = ROOT / "docs" / "container.md"
EXAMPLE_STOP_TIMEOUT = 10  # the example agent's runtime.stop_timeout_seconds (inbox-watcher)


def needed_stop_seconds(stop_timeout: float) -> float:
    """The longest graceful stop of `caldera run` once the agent's stop is bounded: the agent
    (its timeout, then the KILL wait), a running command's grace, its cancel (the lanes'
    10 s close), the stop budget and the exit (docs/runtime.md, "Signals")."""
    return stop_timeout + proc.STOP_KILL_WAIT + daemon_run.DRAIN_GRACE + 10.0 + daemon_run.STOP_BUDGET + 1.5


def test_the_documented_margin_is_what_the_code_needs():
    margin = needed_stop_seconds(0)
    assert margin <= 55, margin  # "the agent's stop_timeout_seconds + 55 s" (docs, recipes)
    assert "stop_timeout_seconds + 55 s" in DOC.read_text()
    example = yaml.safe_load((ROOT / "examples" / "inbox-watcher" / "caldera.agent.yaml").read_text())
    assert example["runtime"]["stop_timeout_seconds"] == EXAMPLE_STOP_TIMEOUT


def test_the_image_definition():
    text = (RECIPES / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert re.match(r"FROM debian:trixie(-slim)?$", lines[0])
    assert re.search(r"apt-get install -y --no-install-recommends /tmp/caldera_\*_all\.deb", text)
    assert re.search(r"^RUN caldera init /usr/share/caldera/examples/inbox-watcher$", text, re.M)
    assert "STOPSIGNAL SIGTERM" in lines and lines[-1] == 'CMD ["caldera", "run"]'
    assert "ENTRYPOINT" not in text and "USER " not in text
    compose = yaml.safe_load((RECIPES / "compose.yaml").read_text())["services"]["agent"]
    assert compose["read_only"] is True and compose["tmpfs"] == ["/tmp"] and compose["stop_signal"] == "SIGTERM"
    assert float(compose["stop_grace_period"].rstrip("s")) >= needed_stop_seconds(EXAMPLE_STOP_TIMEOUT)
    assert set(compose["environment"]) == {
        "CLAWMANAGER_AGENT_ENABLED", "CLAWMANAGER_AGENT_BASE_URL", "CLAWMANAGER_AGENT_BOOTSTRAP_TOKEN",
        "CLAWMANAGER_AGENT_INSTANCE_ID", "CLAWMANAGER_AGENT_PERSISTENT_DIR", "CLAWMANAGER_AGENT_PROTOCOL_VERSION",
        "CLAWMANAGER_AGENT_DISK_LIMIT_BYTES", "CLAWMANAGER_RUNTIME_TYPE"}  # the platform's variables only
    assert compose["environment"]["CLAWMANAGER_AGENT_BASE_URL"].startswith("http://clawmanager-gateway.")


def test_the_s6_overlay_service():
    service = S6 / "caldera"
    assert (service / "type").read_text().strip() == "longrun"
    assert (service / "down-signal").read_text().strip() == "SIGTERM"
    assert int((service / "timeout-kill").read_text()) >= needed_stop_seconds(EXAMPLE_STOP_TIMEOUT) * 1000
    run = (service / "run").read_text()
    assert run.startswith("#!/command/with-contenv sh\n")  # ClawManager's variables reach caldera
    assert run.rstrip().splitlines()[-1] == "exec caldera run"
    assert (service / "run").stat().st_mode & 0o111
    assert (service / "dependencies.d" / "base").exists() and (S6 / "user" / "contents.d" / "caldera").exists()


def test_the_supervisord_program():
    parser = configparser.ConfigParser(inline_comment_prefixes=(";",))
    parser.read(RECIPES / "supervisord" / "caldera.conf")
    program = parser["program:caldera"]
    assert program["command"] == "caldera run"
    assert program["stopsignal"] == "TERM"
    assert int(program["stopwaitsecs"]) >= needed_stop_seconds(EXAMPLE_STOP_TIMEOUT)
    assert program["stopasgroup"] == "false"  # the agent is stopped by caldera, not by a group signal
    assert program["autorestart"] == "unexpected" and program["exitcodes"] == "0"
    assert program["stdout_logfile"] == "/dev/stdout" and program["stdout_logfile_maxbytes"] == "0"


def test_the_package_ships_the_recipes_and_the_page():
    install = (ROOT / "debian" / "caldera.install").read_text().splitlines()
    assert "packaging/container usr/share/caldera/" in install
    assert "docs/container.md" in (ROOT / "debian" / "caldera.docs").read_text().splitlines()
