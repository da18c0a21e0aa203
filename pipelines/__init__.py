"""diffusers-style pipelines (`DiffusionPipeline` subclasses): validate, set up, call the engine in `mmspec`,
post-process.

`llamagen.LlamaGenPipeline`: text-to-image with a LlamaGen-architecture AR model (decoding chosen by `decoding=`).
`text.SpeculativeTextPipeline`: text completion with a causal LM through `mmspec.core.text.speculative_generate`.
"""
