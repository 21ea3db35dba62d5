"""The container recipes (packaging/container/, shipped in /usr/share/caldera/container/) say
what docs/container.md says: Debian 13, the .deb through apt, `caldera init` at build,
`caldera run` as the command, and a stop signal and timeout covering the agent's stop."""
import configparser
import math
import re
from pathlib import Path

import yaml

from caldera import config
from caldera.daemon import run as daemon_run

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "packaging" / "container"
S6 = RECIPES / "s6-overlay" / "s6-rc.d"
DOC = ROOT / "docs" / "container.md"
EXAMPLE_STOP_TIMEOUT = 10  # the example agent's runtime.stop_timeout_seconds (inbox-watcher)
RECIPE_STOP = 125  # the recipes' stop timeout for it (s): checked against the code below


def needed_stop_seconds(stop_timeout: float) -> float:
    """The longest graceful stop of `caldera run`, from the code's own constants: the agent's
    stop as the daemon bounds it (agent_stop_limit: twice its timeout, KILL wait and reap
    wait, and the log's flush), then REST_OF_STOP (the command's grace, its cancel, the stop
    budget, EXIT_GUARD and the margin): what the daemon asks systemd for (daemon/run.py)."""
    return daemon_run.agent_stop_limit(stop_timeout) + daemon_run.REST_OF_STOP


def test_the_documented_bound_is_the_codes():
    """docs/container.md states the bound as `A × stop_timeout_seconds + B s`: A and B are the
    code's (B rounded up), and the example agent's figure is what the recipes use."""
    text = DOC.read_text()
    m = re.search(r"\*\*(\d+) × `stop_timeout_seconds` \+ (\d+) s\*\*", text)
    assert m, "the bound is not stated in docs/container.md"
    slope = needed_stop_seconds(1) - needed_stop_seconds(0)
    assert (int(m.group(1)), int(m.group(2))) == (slope, math.ceil(needed_stop_seconds(0)))
    assert "+ 55 s" not in text
    example = yaml.safe_load((ROOT / "examples" / "inbox-watcher" / "caldera.agent.yaml").read_text())
    assert example["runtime"]["stop_timeout_seconds"] == EXAMPLE_STOP_TIMEOUT
    # the stop budget of each recipe, as the page's table gives it
    recipe = math.ceil(needed_stop_seconds(EXAMPLE_STOP_TIMEOUT))
    for setting in (f"docker stop -t {RECIPE_STOP}", f"stop_grace_period: {RECIPE_STOP}s",
                    f"`timeout-kill` {RECIPE_STOP * 1000}", f"stopwaitsecs={RECIPE_STOP}"):
        assert setting in text, setting
    assert RECIPE_STOP >= recipe
    assert "30 s" in text and "terminationGracePeriodSeconds" in text  # what ClawManager's pods give


def test_the_image_definition():
    text = (RECIPES / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert re.match(r"FROM debian:trixie(-slim)?$", lines[0])
    assert re.search(r"apt-get install -y --no-install-recommends /tmp/caldera_\*_all\.deb", text)
    # the agent's files for the image's user (finding: a non-root user could not read secrets.env)
    assert "ARG CALDERA_USER=root" in lines
    assert re.search(r'^RUN caldera init /usr/share/caldera/examples/inbox-watcher --owner "\$CALDERA_USER"$',
                     text, re.M)
    assert "USER $CALDERA_USER" in lines
    assert "STOPSIGNAL SIGTERM" in lines and lines[-1] == 'CMD ["caldera", "run"]'
    assert "ENTRYPOINT" not in text
    assert f"docker stop -t {RECIPE_STOP}" in text
    compose = yaml.safe_load((RECIPES / "compose.yaml").read_text())["services"]["agent"]
    assert compose["read_only"] is True and compose["tmpfs"] == ["/tmp"] and compose["stop_signal"] == "SIGTERM"
    assert compose["stop_grace_period"] == f"{RECIPE_STOP}s"
    assert set(compose["environment"]) == {
        "CLAWMANAGER_AGENT_ENABLED", "CLAWMANAGER_AGENT_BASE_URL", "CLAWMANAGER_AGENT_BOOTSTRAP_TOKEN",
        "CLAWMANAGER_AGENT_INSTANCE_ID", "CLAWMANAGER_AGENT_PERSISTENT_DIR", "CLAWMANAGER_AGENT_PROTOCOL_VERSION",
        "CLAWMANAGER_AGENT_DISK_LIMIT_BYTES", "CLAWMANAGER_AGENT_RUNTIME_TYPE",
        "CLAWMANAGER_RUNTIME_TYPE"}  # the platform's variables only
    # The runtime's name is the one caldera reads (CLAWMANAGER_RUNTIME_TYPE is a placement marker,
    # never read: with only it, the recipe's agent was caldera-12-main, not the hermes its dir says).
    env = {k: str(v) for k, v in compose["environment"].items()}
    assert config.runtime_type_of(env) == ("hermes", "CLAWMANAGER_AGENT_RUNTIME_TYPE")
    assert env["CLAWMANAGER_AGENT_PERSISTENT_DIR"] == "/config/.hermes"
    assert env["CLAWMANAGER_RUNTIME_TYPE"] in config.RUNTIME_MARKERS
    assert compose["environment"]["CLAWMANAGER_AGENT_BASE_URL"].startswith("http://clawmanager-gateway.")


def test_the_s6_overlay_service():
    service = S6 / "caldera"
    assert (service / "type").read_text().strip() == "longrun"
    assert (service / "down-signal").read_text().strip() == "SIGTERM"
    assert int((service / "timeout-kill").read_text()) == RECIPE_STOP * 1000
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
    assert int(program["stopwaitsecs"]) == RECIPE_STOP
    assert program["stopasgroup"] == "false"  # the agent is stopped by caldera, not by a group signal
    assert program["autorestart"] == "unexpected" and program["exitcodes"] == "0"
    assert program["stdout_logfile"] == "/dev/stdout" and program["stdout_logfile_maxbytes"] == "0"


def test_the_package_ships_the_recipes_and_the_page():
    install = (ROOT / "debian" / "caldera.install").read_text().splitlines()
    assert "packaging/container usr/share/caldera/" in install
    assert "docs/container.md" in (ROOT / "debian" / "caldera.docs").read_text().splitlines()
