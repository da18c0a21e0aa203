"""LlamaGen's caption cleaning: what its T5 encoder was trained on.

LlamaGen (`language/t5.py`, itself from PixArt / DeepFloyd IF) cleans every caption twice before T5, in training and
in sampling: URL-decoding, lower-casing, URLs, HTML markup, @handles, CJK ranges, dash and quote variants, IP
addresses, article ids, hashtags, long numbers, file names, runs of punctuation, shop boilerplate ("free shipping"),
product codes and sizes are removed or normalised, and `ftfy` repairs broken Unicode. A prompt that reaches the
encoder uncleaned ("Two RED triangles") is a different condition from the one the model learned ("two red
triangles"). The rules below are the same substitutions in the same order; HTML is reduced to its text with the
standard library's parser (LlamaGen uses BeautifulSoup's `html.parser` backend, which reads the same markup).
"""

from __future__ import annotations

import html
import re
import urllib.parse
from html.parser import HTMLParser

_CJK_RANGES = ("\u31c0-\u31ef", "\u31f0-\u31ff", "\u3200-\u32ff", "\u3300-\u33ff", "\u3400-\u4dbf", "\u4dc0-\u4dff",
               "\u4e00-\u9fff")
_DASHES = ("\u002d\u058a\u05be\u1400\u1806\u2010-\u2015\u2e17\u2e1a\u2e3a\u2e3b\u2e40\u301c\u3030\u30a0\ufe31\ufe32"
           "\ufe58\ufe63\uff0d")
_URL_ENDINGS = r"[a-zA-Z0-9.\-]+[.](?:com|co|ru|net|org|edu|gov|it)[\w/-]*\b\/?(?!@)"
_BAD_PUNCTUATION = r"[#®•©™&@·º½¾¿¡§~\)\(\]\[\}\{\|\\\/\*]{1,}"

# (pattern, replacement) before the HTML is stripped, then after it; applied in order
_BEFORE_MARKUP = (
    (r"<person>", "person"),
    (r"\b((?:https?:(?:\/{1,3}|[a-zA-Z0-9%])|" + _URL_ENDINGS + r"))", ""),
    (r"\b((?:www:(?:\/{1,3}|[a-zA-Z0-9%])|" + _URL_ENDINGS + r"))", ""),
)
_AFTER_MARKUP = (
    (r"@[\w\d]+\b", ""),
    *((f"[{span}]+", "") for span in _CJK_RANGES),
    (f"[{_DASHES}]+", "-"),
    (r"[`´«»“”¨]", '"'),
    (r"[‘’]", "'"),
    (r"&quot;?", ""),
    (r"&amp", ""),
    (r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}", " "),  # IP addresses
    (r"\d:\d\d\s+$", ""),  # article ids
    (r"\\n", " "),
    (r"#\d{1,3}\b", ""),
    (r"#\d{5,}\b", ""),
    (r"\b\d{6,}\b", ""),
    (r"[\S]+\.(?:png|jpg|jpeg|bmp|webp|eps|pdf|apk|mp4)", ""),  # file names
    (r"[\"\']{2,}", r'"'),
    (r"[\.]{2,}", r" "),
    (_BAD_PUNCTUATION, r" "),
    (r"\s+\.\s+", r" "),
)
_AFTER_FIX = (
    (r"\b[a-zA-Z]{1,3}\d{3,15}\b", ""),  # product codes: jc6640, jc6640vc, 6640vc231
    (r"\b[a-zA-Z]+\d+[a-zA-Z]+\b", ""),
    (r"\b\d+[a-zA-Z]+\d+\b", ""),
    (r"(worldwide\s+)?(free\s+)?shipping", ""),
    (r"(free\s)?download(\sfree)?", ""),
    (r"\bclick\b\s(?:for|on)\s\w+", ""),
    (r"\b(?:png|jpg|jpeg|bmp|webp|eps|pdf|apk|mp4)(\simage[s]?)?", ""),
    (r"\bpage\s+\d+\b", ""),
    (r"\b\d*[a-zA-Z]+\d+[a-zA-Z]+\d+[a-zA-Z\d]*\b", r" "),
    (r"\b\d+\.?\d*[xх×]\d+\.?\d*\b", ""),  # sizes: 1920x1080
    (r"\b\s+\:\s+", r": "),
    (r"(\D[,\./])\b", r"\1 "),
    (r"\s+", " "),
)
_ENDS = (
    (r"^[\"\']([\w\W]+)[\"\']$", r"\1"),
    (r"^[\'\_,\-\:;]", r""),
    (r"[\'\_,\-\:\-\+]$", r""),
    (r"^\.\S+$", ""),
)
_WORD_JOINERS = re.compile(r"(?:\-|\_)")


def _compiled(rules):
    return tuple((re.compile(pattern), replacement) for pattern, replacement in rules)


_BEFORE_MARKUP, _AFTER_MARKUP, _AFTER_FIX, _ENDS = map(_compiled, (_BEFORE_MARKUP, _AFTER_MARKUP, _AFTER_FIX, _ENDS))


class _TextOnly(HTMLParser):
    """The text of a piece of HTML: tags dropped, character references resolved, and the contents of script, style
    and template elements left out (as BeautifulSoup's `.text` leaves them out)."""

    HIDDEN = ("script", "style", "template")

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.hidden = 0

    def handle_starttag(self, tag: str, attrs) -> None:
        self.hidden += tag in self.HIDDEN

    def handle_endtag(self, tag: str) -> None:
        self.hidden -= tag in self.HIDDEN and self.hidden > 0

    def handle_data(self, data: str) -> None:
        if not self.hidden:
            self.parts.append(data)


def _markup_text(text: str) -> str:
    parser = _TextOnly()
    parser.feed(text)
    parser.close()
    return "".join(parser.parts)


def _substitute(text: str, rules) -> str:
    for pattern, replacement in rules:
        text = pattern.sub(replacement, text)
    return text


def _clean_once(caption: str) -> str:
    import ftfy  # a dependency of mmspec; imported here so that importing the models does not load it

    caption = urllib.parse.unquote_plus(str(caption)).strip().lower()
    caption = _markup_text(_substitute(caption, _BEFORE_MARKUP))
    caption = _substitute(caption, _AFTER_MARKUP)
    if len(_WORD_JOINERS.findall(caption)) > 3:  # this-is-my-cute-cat
        caption = _WORD_JOINERS.sub(" ", caption)
    caption = html.unescape(html.unescape(ftfy.fix_text(caption))).strip()
    caption = _substitute(caption, _AFTER_FIX)
    return _substitute(caption, _ENDS).strip()


def clean_caption(caption: str) -> str:
    """A prompt as LlamaGen's T5 encoder saw its captions: cleaned twice, in lower case
    (`T5Embedder.text_preprocessing`)."""
    return _clean_once(_clean_once(caption))
