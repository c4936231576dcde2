"""How sure the model is of a translation: the threshold on its mean log-probability per token, set on val.

The model is least sure where the text is least like its training data: on names, numbers, dates, other
languages and technical prose, a Multi30k model writes fluent-looking nonsense ("John and Mary visit Berlin." →
"Ein John und ein Pizzeria-Wagen.") with a mean log-probability per token far below that of a caption. The
threshold flags the least sure ``FLAGGED_SHARE`` of the validation outputs. Through `aiayn translate` at beam 4
(the folders' |Y|^α), 3 % of val flags 47 (en-de) and 48 (de-en) of the 50 out-of-domain lines of
``tests/serve/out_of_domain.tsv``; with the search's earlier finishing rule 2 % would have flagged 44 and 45, 5 % 48
and 49: 3 % is where flagging more captions stops buying out-of-domain lines.

Words (``search/words.py``): the word threshold marks a word in ``WORD_MARKED_SHARE`` of the validation outputs (the
least sure word of each output against it). At beam 4, 5 % of val marks a word in 39 (en-de) and 32 (de-en) of the
50 out-of-domain lines, and in 17 and 20 of the first 500 captions of test_2016_flickr (3.4 % and 4.0 %).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from aiayn.core.folder import CONFIDENCE_SECTION, ModelFolder
from aiayn.search.output import mean_log_prob
from aiayn.search.translator import SearchSettings, Translator
from aiayn.search.words import least_word_log_prob, words

FLAGGED_SHARE = 0.03  # of the validation outputs, called unsure
WORD_MARKED_SHARE = 0.05  # of the validation outputs, with a word marked unsure (``search/words.py``)


def calibrate_confidence(
    folder: ModelFolder,
    translator: Translator,
    src_ids: Sequence[Sequence[int]],
    settings: SearchSettings,
    calibrated_on: str,
    on_batch: Callable[[int], object] | None = None,
) -> dict[str, Any]:
    """Translate the validation sources ``src_ids`` (one sentence each, ending in </s>) with ``settings`` and
    write the folder's ``confidence`` section: the threshold under which ``FLAGGED_SHARE`` of them fall."""
    if not src_ids:
        raise ValueError("calibrating the confidence threshold needs validation sentences; none were given")
    outputs = translator.outputs(src_ids, settings, on_batch)
    means = np.array([mean_log_prob([output]) for output in outputs])
    pieces = folder.tokenizer.vocabulary()
    least = np.array([least_word_log_prob(words([pieces[i] for i in o.tokens], o.token_log_probs)) for o in outputs])
    threshold, word_threshold = quantile_below(means, FLAGGED_SHARE), quantile_below(least, WORD_MARKED_SHARE)
    section = {
        "min_mean_log_prob": threshold,
        "min_word_log_prob": word_threshold,
        "calibrated_on": calibrated_on,
        "sentences": len(means),
        "flagged_share_on_val": round(float((means < threshold).mean()), 4),
        "word_marked_share_on_val": round(float((least < word_threshold).mean()), 4),
        "beam_size": settings.beam_size,
        "length_penalty": settings.length_penalty,
        "length_normalization": settings.length_normalization,
    }
    folder.write_section(CONFIDENCE_SECTION, section)
    return section


def quantile_below(values: np.ndarray, share: float) -> float:
    """The threshold under which ``share`` of ``values`` fall, rounded down: it never flags more."""
    return math.floor(float(np.quantile(values, share)) * 1e4) / 1e4
