"""Parity of mmspec's caption cleaning (`mmspec.models.llamagen.captions.clean_caption`) with LlamaGen's own
`T5Embedder.text_preprocessing`, on prompts that exercise each of its rules. Writes the results as JSON.

    python docs/parity/check_captions.py --upstream path/to/LlamaGen --deps path/to/deps \
        --json eval/results/parity_captions.json

--deps: a folder with beautifulsoup4, soupsieve and ftfy (`pip install --target`), which LlamaGen's cleaning imports.
"""
from common import arguments, upstream_commit, write

args = arguments(work=False)
from language.t5 import T5Embedder

from mmspec.models.llamagen.captions import clean_caption

upstream = T5Embedder.__new__(T5Embedder)  # only the cleaning: no model, no download
upstream.use_text_preprocessing = True
CASES = [
    "Two RED triangles", "two small red triangles above a blue circle on a striped background",
    "A portrait photo of a kangaroo wearing an orange hoodie and blue sunglasses standing on the grassin front of the "
    "Sydney Opera House holding a sign on the chest that says Welcome Friends!",
    "A blue Porsche 356 parked in front of a yellow brick wall.", "Visit https://example.com/cat.png now!! <b>bold</b> "
    "&amp; cats", "“Quoted” ‘single’ — dash – en-dash", "this-is-my-cute-cat_photo_big",
    "IMG_20190101.jpg 1920x1080 free shipping", "@user said #123 hi #1234567 and 1234567",
    "ＦＵＬＬＷＩＤＴＨ text ﬁ ligature", "çafé naïve mojibake: Ã©", "a cat,sitting.on/a mat", "  '  quoted caption ' ",
    "<p>para</p><script>x=1</script> &lt;tag&gt;", "page 12 of jc6640vc", "中文 mixed with english", "a\\nb",
    "...ellipsis... and ***stars***", "-leading and trailing-", "3:45  ", "x+y=z+",
    "<style>p{}</style>text<template>t</template> after", "a <i>nested <b>tag</b></i> end", "unclosed <b>bold",
    "100% cotton, 2 pcs", "Ünïcödé ÀÉÎ", "tab\there", "%20url%2Fencoded+plus",
]
differ = [{"prompt": c, "upstream": upstream.text_preprocessing(c), "ours": clean_caption(c)} for c in CASES
          if upstream.text_preprocessing(c) != clean_caption(c)]
results = {"upstream": "FoundationVision/LlamaGen", "commit": upstream_commit(args), "prompts": len(CASES),
           "equal": len(CASES) - len(differ), "differ": differ}
write(results, args)
