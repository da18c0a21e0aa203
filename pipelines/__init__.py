"""diffusers-style pipelines (`DiffusionPipeline` subclasses): validate, set up, call the engine in `mmspec`,
post-process.

`ar_image.ARImagePipeline`: the shared body of the discrete text-to-image pipelines (decoding chosen by `decoding=`),
one per family: `llamagen.LlamaGenPipeline` (the embedded model and LlamaGen's release), `janus.JanusPipeline`,
`emu3.Emu3Pipeline`, `lumina_mgpt.LuminaMGPTPipeline`; `auto.AutoARImagePipeline` picks the family from a folder.
`mar.MARPipeline`: class-to-image with a MAR model (continuous tokens, diffusion head), plain or speculative.
`text.SpeculativeTextPipeline`: text completion with a causal LM through `mmspec.text.speculative_generate`.
"""
