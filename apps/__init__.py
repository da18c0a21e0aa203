"""The Gradio demo: `mmspec.apps.demo.build_demo(pipes)` builds it, `mmspec demo` launches it on the embedded models."""
