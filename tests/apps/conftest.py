import os
import socket

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ["NO_PROXY"] = ",".join(filter(None, [os.environ.get("NO_PROXY"), "127.0.0.1", "localhost"]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="package")
def zoo_pipes(small_image_model):
    """The demo's pipelines, loaded on its compute thread (as `mmspec demo` does): the embedded text and world models,
    and the embedded image model's components around its 2-layer draft (`small_image_model`: every image generation
    of the demo tests costs a third)."""
    from mmspec.apps.demo import load_default_pipes
    from mmspec.apps.tabs.base import COMPUTE

    pipes = COMPUTE.submit(load_default_pipes, image_model=small_image_model).result()
    pipes["image"].set_progress_bar_config(disable=True)
    return pipes


@pytest.fixture(scope="package")
def demo_url(zoo_pipes):
    """The demo launched in this process on a loopback port; closed after the tests of `tests/apps`, since its idle
    server threads would slow every later test by a third on 2 cores."""
    from mmspec.apps.demo import build_demo

    demo = build_demo(zoo_pipes)
    _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=free_port(), quiet=True,
                            show_error=True)
    yield url
    demo.close()
