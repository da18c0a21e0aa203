"""diffusers-style pipelines (`DiffusionPipeline` subclasses): validate, set up, call the engine in `mmspec`,
post-process.

`llamagen.LlamaGenPipeline`: text-to-image with a LlamaGen-architecture AR model (decoding chosen by `decoding=`).
`mar.MARPipeline`: class-to-image with a MAR model (continuous tokens, diffusion head), plain or speculative.
`text.SpeculativeTextPipeline`: text completion with a causal LM through `mmspec.core.text.speculative_generate`.
"""
