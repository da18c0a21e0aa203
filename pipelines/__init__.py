"""diffusers-style pipelines (`DiffusionPipeline` subclasses): validate, set up, call the engine in `mmspec`, post-process.

The discrete image AR pipeline arrives with the embedded image model; text generation is served by
`mmspec.core.text.speculative_generate` and the `mmspec text` command.
"""
