"""`python -m mmspec.apps.demo` as users launch it (a separate process, warm-up included, on a saved pipeline folder):
it serves, and 10 consecutive generations leave the server's memory flat."""

import os
import subprocess
import sys
import time

import httpx
import pytest
from gradio_client import Client

from tests.apps.conftest import free_port
from tests.apps.test_demo_api import generate_image

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return int(next(line for line in status if line.startswith("VmRSS")).split()[1]) / 1024


@pytest.fixture(scope="module")
def served_demo(tmp_path_factory, small_image_model):
    """`python -m mmspec.apps.demo --only image --image-model <small_image_model>` on a free loopback port; yields
    (url, pid)."""
    port = free_port()
    log = tmp_path_factory.mktemp("demo") / "server.log"
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as out:
        server = subprocess.Popen([sys.executable, "-m", "mmspec.apps.demo", "--only", "image", "--image-model",
                                   small_image_model, "--port", str(port)],
                                  cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 180
    while True:
        if server.poll() is not None:
            pytest.fail(f"the demo exited with {server.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.time() > deadline:
            server.kill()
            pytest.fail(f"the demo did not serve within 180 s:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    yield url, server.pid
    server.terminate()
    server.wait(timeout=30)
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


def test_memory_stays_flat_over_10_generations(served_demo, capsys):
    url, pid = served_demo
    client = Client(url, verbose=False, download_files=False)  # gradio_client >= 2.7 opens a TLS context per file
    for seed in range(2):  # warm-up: allocator pools, Gradio's caches
        generate_image(client, seed=seed).result()
    before = rss_mib(pid)
    readings = []
    for seed in range(10):
        generate_image(client, seed=seed, acceptance="lantern" if seed % 2 else "exact").result()
        readings.append(rss_mib(pid))
    client.close()
    growth = readings[-1] - before
    with capsys.disabled():
        print(f"\ndemo server RSS over 10 generations: {before:.0f} -> {readings[-1]:.0f} MiB "
              f"(min {min(readings):.0f}, max {max(readings):.0f}), growth {growth:+.1f} MiB")
    assert growth < 16 and max(readings) - before < 32, readings
