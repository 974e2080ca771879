"""Run every benchmark (benchmarks/bench_*.py) one after another and print its report.

Benchmarks report *ratios* measured side by side in one run, never absolute times
compared with a threshold: the machines that run them are shared and noisy.

Usage: python benchmarks/run_all.py [NAME ...]   (e.g. `attention` for bench_attention.py)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv):
    wanted = set(argv)
    scripts = sorted(HERE.glob("bench_*.py"))
    if wanted:
        scripts = [s for s in scripts if s.stem.removeprefix("bench_") in wanted]
    failed = []
    for script in scripts:
        print(f"\n=== {script.stem} " + "=" * max(0, 60 - len(script.stem)), flush=True)
        if subprocess.run([sys.executable, str(script)], cwd=HERE.parent).returncode:
            failed.append(script.name)
    if failed:
        print(f"\nbenchmarks that failed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
