"""A local Ray that does not start in time is started again. Ray waits a fixed 30 s for the raylet to register
with the GCS, which a busy machine can exceed; here the first raylet is really frozen (SIGSTOP) as soon as it
appears, so the first attempt times out, its processes are ended, and the second attempt starts a working Ray."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

pytestmark = pytest.mark.long  # waits out Ray's fixed 30 s start-up bound once

SCRIPT = textwrap.dedent(
    """
    import ray
    from agentrl_ray.infra.local_ray import start_local_ray

    start_local_ray(dict(address="local", num_cpus=1, include_dashboard=False))
    print("nodes", len(ray.nodes()), "task", ray.get(ray.remote(lambda: 7).remote()), flush=True)
    ray.shutdown()
    """
)


def test_a_local_ray_whose_raylet_is_frozen_at_start_is_started_again(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    frozen = None
    try:
        while frozen is None and proc.poll() is None:
            for child in psutil.Process(proc.pid).children(recursive=True):
                try:
                    if child.name() == "raylet":
                        child.send_signal(signal.SIGSTOP)
                        frozen = child
                        break
                except psutil.Error:
                    pass
            time.sleep(0.02)
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
        if frozen is not None and frozen.is_running():
            frozen.kill()
    assert frozen is not None, out
    assert proc.returncode == 0, out
    assert "the local Ray did not start within Ray's 30 s" in out and "trying again (2/3)" in out, out
    assert "nodes 1 task 7" in out, out
    assert not frozen.is_running() or frozen.status() == psutil.STATUS_ZOMBIE  # the frozen raylet was ended
