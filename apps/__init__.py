"""The Gradio demo (`build_demo(pipes) -> gr.Blocks`, `main()`): it calls pipelines only."""
