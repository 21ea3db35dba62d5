"""Claude Code: a caldera turn's overhead over the CLI alone, printed as a ratio in one run.

The same one-line prompt against the same local fake Anthropic provider, interleaved:
(a) `service.execute` with backend_profile claude-code (projection, forwarder, sandbox
settings, stream-json, workspace diff, cleanup), (b) the bare `claude -p PROMPT
--output-format stream-json --verbose` with the key in its environment. Median of N each.

Usage: CALDERA_CLAUDE_CODE_BIN=... python bench/bench_claude_code.py [--turns N]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "backends")]

from backends_fake_anthropic import FakeAnthropic  # noqa: E402

from caldera.backends import base, service  # noqa: E402
from caldera.redact import Redactor  # noqa: E402

KEY = "sk-ant-bench-0123456789abcdef"


def caldera_turn(binary: str, url: str, tmp: Path, n: int) -> float:
    env_dir = tmp / "secrets" / "claude-code" / "env"
    env_dir.mkdir(parents=True, exist_ok=True)
    (env_dir / "ANTHROPIC_API_KEY").write_text(KEY)
    (env_dir / "ANTHROPIC_BASE_URL").write_text(url)
    ws = tmp / "ws"
    ws.mkdir(exist_ok=True)
    environment = base.Environment(redactor=Redactor(), logs_dir=str(tmp / "logs"), runs_dir=str(tmp / "runs"),
                                   secrets_dir=str(tmp / "secrets"),
                                   env={"PATH": os.environ["PATH"], "CALDERA_CLAUDE_CODE_BIN": binary,
                                        "CALDERA_CLAUDE_CODE_MAX_RETRIES": "0"})
    started = time.monotonic()
    result = service.execute({"run_id": f"bench-{n}", "prompt": "Say hello", "workspace": str(ws),
                              "backend_profile": "claude-code"}, environment, roots=None)
    took = time.monotonic() - started
    assert result["status"] == "completed", result
    return took


def bare_turn(binary: str, url: str, tmp: Path) -> float:
    home = tmp / "bare-home"
    home.mkdir(exist_ok=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "TMPDIR": str(tmp), "ANTHROPIC_BASE_URL": url,
           "ANTHROPIC_API_KEY": KEY, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "CLAUDE_CODE_MAX_RETRIES": "0"}
    started = time.monotonic()
    subprocess.run([binary, "-p", "Say hello", "--output-format", "stream-json", "--verbose"], env=env,
                   cwd=str(tmp), capture_output=True, check=True, timeout=120)
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=5)
    args = parser.parse_args()
    binary = os.environ.get("CALDERA_CLAUDE_CODE_BIN")
    if not binary:
        print("bench_claude_code: set CALDERA_CLAUDE_CODE_BIN (.ci/install-claude-code.sh)", file=sys.stderr)
        return 2
    ours, bare = [], []
    with FakeAnthropic([{"text": "Hello from the fake model."}]) as provider, \
            tempfile.TemporaryDirectory() as tmp:
        for n in range(args.turns):
            bare.append(bare_turn(binary, provider.url, Path(tmp)))
            ours.append(caldera_turn(binary, provider.url, Path(tmp), n))
    a, b = statistics.median(ours), statistics.median(bare)
    print(f"claude-code turn, median of {args.turns} (interleaved): caldera {a:.3f} s vs bare claude -p {b:.3f} s "
          f"= {a / b:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
