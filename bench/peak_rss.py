"""Run a command; every 0.2 s sample the RSS of its process, and of it with its children; print the peaks.

    python bench/peak_rss.py imgshards pack /tmp/tree2m /tmp/pack2m -q

What docs/scale.md's "Packing's own memory" measures (bytes a file of the tree).
"""

from __future__ import annotations

import subprocess
import sys
import time

import psutil


def main() -> None:
    started = time.perf_counter()
    child = subprocess.Popen(sys.argv[1:])
    process = psutil.Process(child.pid)
    main_peak = tree_peak = 0
    while child.poll() is None:
        try:
            rss = process.memory_info().rss
            kids = sum(c.memory_info().rss for c in process.children(recursive=True))
        except psutil.Error:  # it or a child ended between the calls
            pass
        else:
            main_peak, tree_peak = max(main_peak, rss), max(tree_peak, rss + kids)
        time.sleep(0.2)
    print(
        f"exit {child.returncode} in {time.perf_counter() - started:.0f} s; peak RSS: main process "
        f"{main_peak / 2**20:.0f} MiB, with its workers {tree_peak / 2**20:.0f} MiB"
    )


if __name__ == "__main__":
    main()
