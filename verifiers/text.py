"""Sentences, word tokens and the language of a text, as the instruction checks count them.

    sentences("Mr. and Mrs. Jones came home. He said \"Stop.\" Then he left!")
        -> ['Mr. and Mrs. Jones came home.', 'He said "Stop."', 'Then he left!']

Sentences come from NLTK's Punkt model for English: the same tables (`punkt_tab/english`, which
IFEval's reference loads) ship in `verifiers/data/punkt_tab/english` (NLTK data, Apache 2.0), so
nothing is downloaded. They are read as plain text tables, never unpickled.
"""
from __future__ import annotations

import functools
import itertools
import re
from pathlib import Path

_PUNKT_DIR = Path(__file__).resolve().parent / "data" / "punkt_tab" / "english"
_WORD = re.compile(r"\w")
COUNTED = 1000  # sentences a count checks at least (`count_limit`): 0.03 s of Punkt


def encodable(text: str) -> bool:
    """Whether `text` is valid UTF-8 (no lone surrogate): Parquet stores UTF-8, so one such string would fail
    a whole shard's write."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@functools.cache
def _punkt():
    from nltk.tabdata import PunktDecoder
    from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer

    decode, params = PunktDecoder(), PunktParameters()
    with open(_PUNKT_DIR / "collocations.tab", encoding="utf-8") as f:
        params.collocations = set(decode.tab2tups(f))
    with open(_PUNKT_DIR / "sent_starters.txt", encoding="utf-8") as f:
        params.sent_starters = decode.txt2set(f)
    with open(_PUNKT_DIR / "abbrev_types.txt", encoding="utf-8") as f:
        params.abbrev_types = decode.txt2set(f)
    with open(_PUNKT_DIR / "ortho_context.tab", encoding="utf-8") as f:
        params.ortho_context = decode.tab2intdict(f)
    return PunktSentenceTokenizer(params)


def load() -> None:
    """Read now what the checks load on first use (Punkt's tables, NLTK's word tokenizer, langdetect's language
    profiles): about 3 s of imports on an idle machine, which a verifier's timeout must not count. Counted in the
    first response's bound, they made that response a verifier_error on a busy machine and not on a quiet one."""
    from nltk.tokenize import NLTKWordTokenizer  # noqa: F401 - the import is the cost

    _punkt()
    language("Loading the language profiles.")


def sentences(text: str) -> list[str]:
    """Punkt's English sentences: abbreviations (Mr., e.g.) and closing quotes stay inside."""
    return _punkt().tokenize(text)


def sentence_spans(text: str, limit: int | None = None, with_word: bool = False) -> list[tuple[int, int]]:
    """[start, end) of each of Punkt's English sentences in `text` (the same sentences as `sentences`), only
    those holding a word character when `with_word`, the first `limit` of them when given (Punkt finds them
    one by one, at ~30 us each: 2 MB of "A. " holds 700,000)."""
    spans = _punkt().span_tokenize(text)
    if with_word:
        spans = ((s, e) for s, e in spans if _WORD.search(text, s, e))
    return list(itertools.islice(spans, limit))


def count_limit(lo: int | None, hi: int | None) -> int:
    """How many sentences to find for a count checked against [lo, hi]: one past the bound decides the
    score; at least COUNTED so that the count the feedback reports is exact below that."""
    return max(COUNTED, (hi if hi is not None else lo or 0) + 1)


def word_tokens(text: str) -> list[str]:
    """NLTK's `word_tokenize`: Punkt sentences, then Treebank tokens ("don't" -> "do", "n't")."""
    from nltk.tokenize import NLTKWordTokenizer

    tokenizer = NLTKWordTokenizer()
    return [token for sentence in sentences(text) for token in tokenizer.tokenize(sentence)]


def language(text: str) -> str | None:
    """ISO 639-1 code of the text's language (langdetect, seeded), None when it cannot tell."""
    import langdetect

    langdetect.DetectorFactory.seed = 0  # langdetect samples; a fixed seed makes it repeatable
    try:
        return langdetect.detect(text)
    except langdetect.LangDetectException:
        return None
