"""`mmspec serve` as a user runs it: a process that loads, chooses what "auto" stands for, says where it serves,
answers, and stops on Ctrl-C (the slow tier: a Ray instance of its own)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from mmspec.cli import check_port_free
from mmspec.serving import client
from tests.models.llamagen_tiny import tiny_pipeline

pytestmark = pytest.mark.slow
pytest.importorskip("ray")
PORT = 8767


def test_the_command_serves_until_interrupted(tmp_path):
    folder = tmp_path / "tiny_image"
    tiny_pipeline().save_pretrained(folder)
    command = [sys.executable, "-m", "mmspec.cli", "serve", "--model", str(folder), "--port", str(PORT),
               "--max-batch-size", "4", "--device", "cpu"]
    # a session of its own: a process that outlives the test is killed with its Ray instance, not left on the port
    service = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               start_new_session=True)
    try:
        ready = service.stdout.readline()  # printed once the replicas are up and "auto" is chosen
        assert ready.startswith("serving tiny_image (image) on http://127.0.0.1:8767/v1"), ready
        status, raw = client.post(f"http://127.0.0.1:{PORT}/v1/images/generations", {"prompt": "a red circle",
                                                                                       "seed": 3})
        answer = json.loads(raw)
        assert status == 200 and answer["seed"] == 3 and answer["stats"]["decoding"]["name"] in ("ar", "sjd")
        status, raw = client.get(f"http://127.0.0.1:{PORT}/v1/models")
        assert json.loads(raw)["data"][0]["auto_chose"][0]["decoding"] == answer["stats"]["decoding"]
    finally:
        service.send_signal(signal.SIGINT)
        started = time.monotonic()
        try:
            code = service.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(service.pid, signal.SIGKILL)
            raise
    assert code == 0 and time.monotonic() - started < 60
    check_port_free("127.0.0.1", PORT)  # Ctrl-C left nothing serving there
