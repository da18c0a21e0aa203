"""LlamaGen (Sun et al., arXiv 2406.06525): VQ tokenizer, GPT transformer, adapter and official checkpoint loading."""
