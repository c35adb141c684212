"""How many evaluation envs fit beside the training envs: measured from live processes."""
import os
import subprocess
import sys
import time

from robo_rl.envs.memory import USABLE_FRACTION, available_bytes, envs_that_fit, rss_bytes


def test_envs_that_fit_divides_the_available_memory_by_the_largest_live_worker():
    # a live process holding ~200 MB stands in for an env worker
    worker = subprocess.Popen([sys.executable, "-c", "b = bytearray(200 * 2**20); import time; time.sleep(60)"])
    try:
        deadline = time.time() + 60
        while rss_bytes(worker.pid) < 200 * 2**20:
            assert time.time() < deadline and worker.poll() is None, "the stand-in worker never held 200 MB"
            time.sleep(0.05)
        per_env, available = max(rss_bytes(worker.pid), rss_bytes(os.getpid())), available_bytes()
        expected = max(1, min(10_000, int(USABLE_FRACTION * available // per_env)))
        assert abs(envs_that_fit(10_000, [worker.pid, os.getpid()]) - expected) <= 1  # memory moves a little
        assert envs_that_fit(2, [worker.pid]) == 2  # two such workers fit anywhere these tests run
    finally:
        worker.kill()
        worker.wait()
    assert rss_bytes(worker.pid) == 0  # gone: no size to go by
    assert envs_that_fit(8, [worker.pid]) == envs_that_fit(8, []) == 8
