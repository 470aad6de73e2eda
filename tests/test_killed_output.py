#!/usr/bin/env python3
"""A run killed with SIGKILL leaves the lines it printed (issue #27 item 8): tz-train's stdout is
line-buffered and flushed after the start-up report, so a file or pipe gets each line when it is
printed, not when a 4 KiB buffer fills or the program exits (without both, this run's file was
empty). The run is slowed (every nvme operation 0.25 s late) so that it is killed
during its first step, after the start-up lines (which follow the initial shards' two dozen
writes: 2 s a write made this test take 50 s)."""
import os
import signal
import subprocess
import sys
import tempfile
import time


def main():
    src, bindir = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory(prefix="tz-killed-") as d:
        out_path = os.path.join(d, "out.txt")
        with open(out_path, "w") as out:
            p = subprocess.Popen(
                [os.path.join(bindir, "tz-train"), "--config",
                 os.path.join(src, "configs", "ds-zero-infinity-nvme.json"), "--model", "tiny",
                 "--steps", "3", "--seq", "16", "--data", "synthetic", "--set",
                 "tierzero.nvme_path=" + d, "--set", "tierzero.faults=delay=250000"],
                stdout=out, stderr=subprocess.DEVNULL, cwd=d)
            text = ""
            deadline = time.time() + 60
            while time.time() < deadline and "plan: homes" not in text and p.poll() is None:
                time.sleep(0.2)
                with open(out_path) as f:
                    text = f.read()
            alive = p.poll() is None
            p.send_signal(signal.SIGKILL)
            p.wait()
        with open(out_path) as f:
            text = f.read()
        if not alive:
            print("FAIL: the run ended before it could be killed:\n" + text)
            return 1
        for want in ("tz-train: model tiny", "plan: homes"):
            if want not in text:
                print("FAIL: the killed run's stdout lacks %r; it has:\n%s" % (want, text))
                return 1
    print("ok: the killed run's lines are in its output file")
    return 0


if __name__ == "__main__":
    sys.exit(main())
