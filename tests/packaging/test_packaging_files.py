"""The unit, the cron file, the man page generator and debian/ agree with SPEC and docs."""
import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import caldera

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "packaging" / "caldera@.service"
CRON = ROOT / "packaging" / "caldera.cron"
DOC = ROOT / "docs" / "packaging.md"


def parse_unit(text: str) -> dict:
    """{section: {key: [values…]}} as systemd reads a unit (keys may repeat)."""
    sections, current = {}, None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"line {number} is outside a section: {raw!r}"
        key, sep, value = line.partition("=")
        assert sep, f"line {number} is not KEY=VALUE: {raw!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


@pytest.fixture(scope="module")
def unit():
    return parse_unit(UNIT.read_text())


def one(unit, key, section="Service"):
    values = unit[section].get(key)
    assert values and len(values) == 1, f"{key}= appears {len(values or [])} times"
    return values[0]


def test_the_unit_runs_the_agent_named_by_the_instance(unit):
    assert one(unit, "ExecStart") == "/usr/bin/caldera run --agent %i"
    assert one(unit, "User") == "caldera"
    assert one(unit, "StateDirectory") == "caldera/%i"
    # 0711, not SPEC section 2's 0700: status.json reachable by name (docs/packaging.md).
    assert one(unit, "StateDirectoryMode") == "0711"
    assert one(unit, "UMask") == "0077"  # every other file in it stays private
    # The daemon reads agent.env and secrets.env itself, so a reload sees removed lines too.
    assert "EnvironmentFile" not in unit["Service"]
    assert one(unit, "WantedBy", "Install") == "multi-user.target"


def test_reload_is_sighup_to_the_main_process(unit):
    reload = one(unit, "ExecReload")
    assert reload.startswith("/bin/sh -c ") and "kill -HUP" in reload and "MAINPID" in reload


def test_the_unit_stops_restarts_and_notifies_as_the_daemon_expects(unit):
    from caldera.daemon import run as daemon
    assert one(unit, "KillMode") == "mixed"
    assert one(unit, "Restart") == "on-failure"
    assert one(unit, "RestartSec") == "5"
    assert one(unit, "Type") == "notify"
    assert one(unit, "NotifyAccess") == "main"
    watchdog = float(one(unit, "WatchdogSec").removesuffix("s"))
    # Pings come every watchdog/2 while each loop ticked within LIVENESS: a shorter
    # watchdog than the liveness window would kill a daemon whose loops are fine.
    assert watchdog / 2 >= daemon.LIVENESS
    stop = float(one(unit, "TimeoutStopSec").removesuffix("s"))
    assert stop > daemon.DRAIN_GRACE + daemon.STOP_BUDGET
    from caldera.errors import EXIT_USAGE

    assert one(unit, "RestartPreventExitStatus") == str(EXIT_USAGE)


def _doc_table(title: str) -> dict:
    """The `| option | value | … |` rows under a '### title' heading of docs/packaging.md."""
    text = DOC.read_text()
    start = text.index(f"### {title}\n")
    end = text.find("\n#", start + 4)
    rows = {}
    for line in text[start:end if end > 0 else None].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`"):
            rows[cells[0].strip("`").split("=")[0]] = cells[1].strip("`")
    return rows


def test_every_hardening_option_is_documented_with_its_value(unit):
    used = _doc_table("Hardening used")
    assert used, "no 'Hardening used' table in docs/packaging.md"
    for option, value in used.items():
        assert option in unit["Service"], f"docs list {option}= but the unit has none"
        documented = "" if value == "(empty)" else value
        assert unit["Service"][option] == [documented], f"{option}= differs between unit and docs"


def _left_out_options() -> list:
    """(name, value or None) for each `Option` / `Option=value` in the left-out table's first column."""
    text = DOC.read_text()
    start = text.index("### Hardening left out, and why\n")
    end = text.find("\n#", start + 4)
    found = []
    for line in text[start:end].splitlines():
        cells = line.strip().strip("|").split("|")
        for token in re.findall(r"`([A-Za-z]+)(?:=([^`]*))?`", cells[0]):
            found.append((token[0], token[1] or None))
    return found


def test_options_left_out_are_really_left_out(unit):
    left_out = _left_out_options()
    names = {name for name, _ in left_out}
    assert {"ProtectKernelTunables", "RestrictNamespaces", "MemoryDenyWriteExecute"} <= names
    for name, value in left_out:
        if value is None:
            assert name not in unit["Service"], f"{name}= is in the unit but documented as left out"
        else:  # e.g. ProtectSystem=strict left out: the unit may hold another value
            assert unit["Service"].get(name, []) != [value], f"{name}={value} is in the unit"


def test_cron_file_is_a_guarded_commented_example():
    lines = CRON.read_text().splitlines()
    assert CRON.read_text().endswith("\n")  # cron ignores a last line without newline
    active = [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
    # Only the environment is active: cron's own PATH lacks /usr/sbin and /sbin.
    assert active == ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"], f"the cron file must ship commented: {active}"
    examples = [line.lstrip("#").strip() for line in lines if re.match(r"^#\s*[*0-9]", line)]
    assert examples, "no example line"
    for line in examples:
        fields = line.split(None, 6)
        assert fields[5] == "caldera", "cron runs the report as user caldera"
        assert fields[6].startswith("test -x /usr/bin/caldera && "), "guard against removal"
        assert "report --once" in fields[6]
        # Output and exit status reach syslog/the journal, not cron's mail.
        assert fields[6].endswith("| logger -t caldera-report") and "exit status $?" in fields[6]
        assert "%" not in fields[6]  # cron would turn it into a newline


# sha256 of /etc/cron.d/caldera as every release so far shipped it (0.1.0: commit f583354).
RELEASED_CRON = "24af21083b6a370b0d75b85af327b8e534d010440259d7ff258f1257fce7281a"


def test_the_cron_conffile_is_the_one_every_release_shipped():
    """The package's only conffile: admins uncomment its line (README, docs/packaging.md). dpkg
    asks about a conffile that both the admin and the new package changed, and an upgrade
    without a terminal (`apt-get install … < /dev/null`, unattended-upgrades) then fails. A
    change to packaging/caldera.cron needs a reason worth that, and its own handling
    (docs/packaging.md, "Conffiles"); then add the new digest here with the release."""
    got = hashlib.sha256(CRON.read_bytes()).hexdigest()
    assert got == RELEASED_CRON, "packaging/caldera.cron differs from the released one: an edited copy prompts"


def test_changelog_version_is_the_package_version():
    first = (ROOT / "debian" / "changelog").read_text().splitlines()[0]
    m = re.match(r"^caldera \(([^)]+)\) ", first)
    assert m and m.group(1) == caldera.__version__


def test_every_python_directory_is_a_package_setuptools_finds():
    """`packages = find:` skips a directory without __init__.py: it would be missing
    from the .deb while everything works from the checkout."""
    # caldera/examples: package data (the example agents), not caldera's code: in a checkout a
    # link to examples/, in a built tree (the .deb's test run) a copy
    dirs = {p.parent for p in (ROOT / "caldera").rglob("*.py")
            if "__pycache__" not in p.parts and p.relative_to(ROOT).parts[1] != "examples"}
    missing = sorted(str(d.relative_to(ROOT)) for d in dirs if not (d / "__init__.py").is_file())
    assert missing == [], f"no __init__.py in: {missing}"


def test_manpage_covers_every_command_and_is_clean_roff(tmp_path):
    from caldera import cli
    out = subprocess.run([sys.executable, str(ROOT / "packaging" / "manpage.py")], cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "SOURCE_DATE_EPOCH": "1700000000", "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.startswith(".\\\"") and '\n.TH CALDERA 1 "2023-11-14"' in out
    for name in cli.COMMANDS:
        assert f"\n.SS caldera {name.replace('-', chr(92) + '-')}\n" in out, f"caldera {name} missing"
    for var in ("CALDERA_TOKEN", "CALDERA_BASE_URL"):
        assert var.replace("_", "_") in out
    page = tmp_path / "caldera.1"
    page.write_text(out)
    groff = shutil.which("groff")
    if not groff:
        pytest.skip("groff is not installed")
    check = subprocess.run([groff, "-man", "-Tutf8", "-ww", "-z", str(page)], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0 and check.stderr == "", check.stderr


def _script(name: str) -> str:
    return (ROOT / "debian" / f"caldera.{name}").read_text()


def test_maintainer_scripts_reload_systemd_and_go_through_deb_systemd_invoke():
    postinst, prerm, postrm = _script("postinst"), _script("prerm"), _script("postrm")
    # dh_installsystemd --no-enable --no-start adds no daemon-reload for a template unit.
    assert "systemctl --system daemon-reload" in postinst
    assert postinst.index("daemon-reload") < postinst.index("deb-systemd-invoke try-restart 'caldera@*.service'")
    assert "deb-systemd-invoke stop 'caldera@*.service'" in prerm
    preinst = _script("preinst")
    for script in (preinst, postinst, prerm, postrm):  # only daemon-reload goes to systemctl directly
        calls = re.findall(r"^\s*systemctl .*$", script, flags=re.M)
        assert all("daemon-reload" in c for c in calls), calls
    for action in ("purge)", "remove)"):
        block = postrm[postrm.index(f"\t{action}"):]
        block = block[:block.index(";;")]
        assert "daemon-reload" in block, f"postrm {action} does not reload systemd"


def test_one_version_is_checked_when_the_package_builds():
    rules = (ROOT / "debian" / "rules").read_text()
    assert "dpkg-parsechangelog -S Version" in rules and "caldera/__init__.py" in rules


def test_an_upgrade_stops_the_agents_before_the_unpack_and_starts_them_after():
    """preinst upgrade records and stops the running instances (docs/packaging.md, "Upgrades");
    postinst configure and the abort paths start what was recorded; prerm remove records too."""
    preinst, postinst, prerm, postrm = (_script(n) for n in ("preinst", "postinst", "prerm", "postrm"))
    upgrade = preinst[preinst.index("\tupgrade)"):preinst.index(";;")]
    assert "systemctl list-units" in upgrade and "deb-systemd-invoke stop $units" in upgrade
    assert upgrade.index("record $units") < upgrade.index("deb-systemd-invoke stop")  # recorded first
    configure = postinst[postinst.index("\tconfigure)"):]
    assert configure.index("try-restart") < configure.index("start_recorded")  # each agent restarts once
    assert "abort-remove" in postinst
    remove = prerm[prerm.index("\tremove|deconfigure)"):]
    assert remove.index("record $units") < remove.index("deb-systemd-invoke stop")


def test_the_record_of_stopped_agents_is_roots_own_and_written_atomically():
    """Issue 35's review: the record lived in /var/lib/caldera, the caldera user's directory;
    a link planted there made root overwrite /etc files (`.new`) and copy /etc/shadow
    world-readable (the record itself). It lives where only root writes, and root writes it
    through a new file (mktemp, O_EXCL) and a rename."""
    scripts = {n: _script(n) for n in ("preinst", "postinst", "prerm", "postrm")}
    for name, text in scripts.items():
        assert "/var/lib/caldera-dpkg" in text, name
        for line in text.splitlines():
            code = line.split("#", 1)[0]
            # nothing is written, moved or made under the caldera user's tree (purge's rm -rf is
            # the one exception: rm follows no link)
            assert not re.search(r"(>|\bmv\b|\bcp\b|\bmktemp\b|\btouch\b|\btee\b|\bln\b).*/var/lib/caldera/", code), \
                f"{name}: {line.strip()}"
    for name in ("preinst", "prerm"):
        record = scripts[name][scripts[name].index("record() {"):]
        record = record[:record.index("\n}")]
        assert 'mkdir -p -m 0700 "$RECORD_DIR"' in record and 'tmp=$(mktemp "$RECORD.XXXXXX")' in record
        assert record.rstrip().endswith('mv -f "$tmp" "$RECORD"')
        assert "RECORD_DIR=/var/lib/caldera-dpkg\nRECORD=$RECORD_DIR/stopped" in scripts[name]
    assert "rm -rf /var/lib/caldera /etc/caldera /var/lib/caldera-dpkg" in scripts["postrm"]


def test_every_recorded_agent_starts_again_enabled_or_not():
    """deb-systemd-invoke start skips a unit that is not enabled (exit 0): an agent started by
    hand (systemctl start, no enable) was stopped by the preinst and never started again.
    reload-or-restart starts a stopped unit whatever its enable state, through the wrapper."""
    postinst, postrm = _script("postinst"), _script("postrm")
    for text in (postinst[postinst.index("start_recorded() {"):], postrm[postrm.index("\tabort-upgrade)"):]):
        block = text[:text.index("\n}") if text.startswith("start_recorded") else text.index(";;")]
        assert "deb-systemd-invoke reload-or-restart $units" in block
    for name in ("preinst", "postinst", "prerm", "postrm"):
        code = [line for line in _script(name).splitlines() if not line.lstrip().startswith("#")]
        assert not [line for line in code if "deb-systemd-invoke start" in line], name


def test_the_package_depends_on_the_system_ca_store():
    """The control-plane client verifies https against the system store (OpenSSL's): nothing
    else brings ca-certificates since python3-requests is no dependency (a slim image with
    --no-install-recommends would have no CA at all)."""
    control = (ROOT / "debian" / "control").read_text()
    binary = control.split("\nPackage: caldera\n", 1)[1]
    depends = binary.split("\nDepends:", 1)[1].split("\nSuggests:", 1)[0]
    names = [entry.strip().split(" ")[0] for entry in depends.split(",") if entry.strip()]
    assert "ca-certificates" in names
    assert "`ca-certificates`" in DOC.read_text()
