"""Serving and scaling out with Ray: `mmspec serve`, an HTTP service in the shape of OpenAI's Images and Completions
APIs on Ray Serve (`service`), and offline generation from a prompt file across Ray Data workers (`offline`). What
both share: requests checked before model work (`requests`, no torch or Ray), the served models (`models`), and
compatible requests run as one pipeline call with each row on its own generator (`calls`). Ray is the `[serve]`
extra; only `service` and the Ray paths of `offline` import it."""
