"""The leftovers check the fault and vLLM tests rely on (tests/_procs.py) counts what this test's processes left
in /dev/shm, and nothing another job on the machine made."""

from __future__ import annotations

import os
import subprocess
import sys

from _procs import new_leftovers, run_leftovers


def test_a_segment_a_child_held_and_left_is_reported_one_no_process_of_ours_held_is_not():
    ours, other = f"/dev/shm/labkit-leak-{os.getpid()}", f"/dev/shm/labkit-other-{os.getpid()}"
    try:
        before = run_leftovers()
        hold = f"import time; f = open({ours!r}, 'w'); time.sleep(1.0)"  # held across several samples, never removed
        subprocess.run([sys.executable, "-c", hold], check=True, timeout=60)
        open(other, "w").close()  # made and closed at once by no process of this test's tree that the watch saw
        assert new_leftovers(before, wait_s=1.0) == {"dev_shm": {os.path.basename(ours)}}
    finally:
        for path in (ours, other):
            if os.path.exists(path):
                os.unlink(path)
