"""Joining Ray (the service, `mmspec serve` and offline runs on Ray alike): a new local instance waits for its HTTP
proxy as long as a busy machine needs, unless told otherwise; a cluster given by address keeps its own settings."""

import pytest
import ray

from mmspec.serving import models

VARIABLE, SECONDS = models.PROXY_READY_TIMEOUT


@pytest.fixture
def fake_ray(monkeypatch):
    """ray.init recorded with the proxy timeout it would start its processes with; no instance is started."""
    started = []
    monkeypatch.setenv(VARIABLE, "")  # recorded, so that what connect sets is undone after the test
    monkeypatch.delenv(VARIABLE)
    monkeypatch.setattr(ray, "is_initialized", lambda: bool(started))
    monkeypatch.setattr(ray, "init", lambda **kwargs: started.append((kwargs, models.os.environ.get(VARIABLE))))
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    return started


def test_a_local_instance_gets_a_patient_proxy_timeout(fake_ray):
    assert models.connect() == 0.0
    assert fake_ray == [({"address": None, "log_to_driver": False}, SECONDS)] and float(SECONDS) >= 30
    models.connect()  # joined already: nothing more
    assert len(fake_ray) == 1


def test_the_environment_and_a_cluster_keep_their_own_timeout(fake_ray, monkeypatch):
    models.connect("ray://head:10001")
    assert fake_ray[-1][1] is None  # a cluster's processes were started with its own environment
    fake_ray.clear()
    monkeypatch.setenv(VARIABLE, "7")
    models.connect()
    assert fake_ray[-1][1] == "7"
