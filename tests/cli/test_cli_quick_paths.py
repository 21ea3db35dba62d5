"""The quick paths of issue 16 (caldera/cli/fastpath.py) give the same answers as the
slower code they replace; what each entry point imports is in test_cli_import_budgets.py."""
import gc
import re

from caldera import cli, redact
from caldera.agents import manifest
from caldera.cli import fastpath

NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
KEY_RE = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"
WORDS = ["a", "A1", "_x", "1abc", "task-agent", "my.agent_2", "-lead", ".dot", "", "x" * 64, "x" * 65,
         "sp ace", "tab\t", "ümlaut", "key_", "k-ey", "9", "Z_9", "a/b", "a\n"]


def test_help_and_no_arguments_print_argparses_help(capsys):
    assert cli.main(["--help"]) == 0
    assert capsys.readouterr().out == cli._top_parser().format_help()
    assert cli.main([]) == 2
    assert capsys.readouterr().out == cli._top_parser().format_help()
    assert cli.main(["no-such-command"]) == 2
    assert "invalid choice: 'no-such-command'" in capsys.readouterr().err


RUN_ARGVS = [[], ["--agent", "bench"], ["--agent=bench"], ["--agent", "a", "--agent", "b"], ["--json"],
             ["--manifest", "/x/m.yaml", "--state-dir", "/tmp/s"], ["--manifest=/m", "--state-dir=", "--json"],
             ["--agent", ""], ["--agent=-x"], ["--agent", "a=b"]]
# argparse's business: help, abbreviations, values that look like options, errors.
RUN_ARGVS_FOR_ARGPARSE = [["--help"], ["-h"], ["--ag", "x"], ["--agent", "-x"], ["--agent"], ["--json=1"],
                          ["extra"], ["--agent", "x", "extra"], ["--state-dir", "--agent", "x"], ["--"]]


def test_run_flags_without_argparse_are_what_argparse_parses():
    parser, _ = cli.build_parser("run")
    for argv in RUN_ARGVS:
        assert vars(fastpath.agent_args("run", argv)) == vars(parser.parse_args(argv)), argv
    for argv in RUN_ARGVS_FOR_ARGPARSE:
        assert fastpath.agent_args("run", argv) is None, argv


def test_the_formatter_without_shutil_is_argparses(monkeypatch):
    import argparse

    for columns in ("50", "100"):
        monkeypatch.setenv("COLUMNS", columns)
        ours = argparse.ArgumentParser(prog="caldera run", formatter_class=fastpath.formatter_class())
        theirs = argparse.ArgumentParser(prog="caldera run")
        for parser in (ours, theirs):
            cli.add_agent_flags(parser)
        assert ours.format_help() == theirs.format_help(), columns


def test_the_daemon_parses_its_flags_without_argparse(tmp_path):
    """`caldera run --agent NAME` (the systemd unit's line) never imports argparse; here the
    agent is not installed, so the command ends with its configuration error (exit 2)."""
    import os
    import subprocess
    import sys

    code = ("import sys\nfrom caldera import cli\nrc = cli.main(['run', '--agent', 'nobody'])\n"
            "print(rc, 'argparse' in sys.modules)\n")
    env = dict(os.environ, CALDERA_CONFIG_DIR=str(tmp_path / "etc"), CALDERA_STATE_DIR=str(tmp_path / "var"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.stdout.split() == ["2", "False"], done.stderr


def test_name_and_key_rules_match_the_schema_patterns():
    for word in WORDS:
        # re's `$` also matches before a final newline; the set rule refuses that too.
        assert manifest.is_name(word) == bool(re.fullmatch(NAME_RE[1:-1], word)), word
        assert manifest.is_key(word) == bool(re.fullmatch(KEY_RE[1:-1], word)), word


def test_secret_keys_set_matches_the_pattern():
    pattern = re.compile(redact._SECRET_KEY)
    words = set(redact._SECRET_KEYS) | {"api__key", "tokens", "xtoken", "set_cookie", "Api-Key", "PASSWORD",
                                        "proxy_authorization", "privatekey", "ID-TOKEN", "name", ""}
    for word in words:
        assert redact.secret_key(word) == bool(pattern.match(word)), word


def test_redaction_still_masks_every_shape():
    r = redact.Redactor(["s3cr3t-value-123"])
    text = r("Authorization: Bearer abcdefghijkl and sk-ABCDEFGHIJKLMNOP s3cr3t-value-123")
    assert "abcdefghijkl" not in text and "sk-ABCD" not in text and "s3cr3t" not in text
    assert r({"api_key": "x1", "note": "fine"}) == {"api_key": redact.MASK, "note": "fine"}


def test_a_quick_verb_leaves_the_collector_as_it_found_it(tmp_path):
    assert gc.isenabled()
    cli.main(["pause", "--manifest", str(tmp_path / "missing.yaml"), "--state-dir", str(tmp_path / "s")])
    assert gc.isenabled()


def test_as_a_program_a_quick_verb_still_prints_and_exits_with_its_code(tmp_path):
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "task-agent"
    bundle = tmp_path / "task-agent"
    shutil.copytree(example, bundle, ignore=shutil.ignore_patterns("data", "__pycache__", ".caldera-state"))
    base = [sys.executable, "-m", "caldera.cli"]
    flags = ["--manifest", str(bundle / "caldera.agent.yaml"), "--state-dir", str(tmp_path / "state")]
    done = subprocess.run([*base, "pause", "--json", *flags], capture_output=True, text=True)
    assert done.returncode == 0 and '"ok": true' in done.stdout, done
    bad = subprocess.run([*base, "settings", "set", "nosuchkey=1", *flags], capture_output=True, text=True)
    assert bad.returncode in (1, 2) and bad.stderr.strip(), bad
