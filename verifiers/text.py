"""Sentences, word tokens and the language of a text, as the instruction checks count them.

    sentences("Mr. and Mrs. Jones came home. He said \"Stop.\" Then he left!")
        -> ['Mr. and Mrs. Jones came home.', 'He said "Stop."', 'Then he left!']

Sentences come from NLTK's Punkt model for English: the same tables (`punkt_tab/english`, which
IFEval's reference loads) ship in `verifiers/data/punkt_tab/english` (NLTK data, Apache 2.0), so
nothing is downloaded. They are read as plain text tables, never unpickled.
"""
from __future__ import annotations

import functools
from pathlib import Path

_PUNKT_DIR = Path(__file__).resolve().parent / "data" / "punkt_tab" / "english"


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


def sentences(text: str) -> list[str]:
    """Punkt's English sentences: abbreviations (Mr., e.g.) and closing quotes stay inside."""
    return _punkt().tokenize(text)


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """[start, end) of each of Punkt's English sentences in `text` (the same sentences as `sentences`)."""
    return list(_punkt().span_tokenize(text))


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
