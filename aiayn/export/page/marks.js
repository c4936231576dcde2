// search/words.py in JavaScript: the words of an output, each the sum of its subwords' log-probabilities as the
// search's step gave them, and the spans in the translation of those under the folder's confidence.min_word_log_prob.
// Python's \w and str.isalnum come from config.json's `web.alnum` (normalizer.char_class), as text.js's do.
const METASPACE = "▁";
const SYNTAX = /[\\^$.*+?()[\]{}|/]/g;

/** words(): `pieces` are an output's vocabulary entries, `logProbs` each one's own. */
export function words(pieces, logProbs) {
  const found = [];
  pieces.forEach((piece, i) => {
    if (piece.startsWith(METASPACE) || !found.length) found.push({ parts: [piece], logProb: logProbs[i] });
    else {
      found.at(-1).parts.push(piece);
      found.at(-1).logProb += logProbs[i];
    }
  });
  return found
    .map(({ parts, logProb }) => ({ text: parts.join("").replaceAll(METASPACE, " ").trim(), logProb }))
    .filter((word) => word.text);
}

/** unsure_spans(): [start, end) spans of `text` (counted in code points, as Python counts) of the words under
 * `threshold`, each looked for whole and in any case after the last one found, without the punctuation around it. */
export function unsureSpans(text, found, threshold, alnum) {
  if (found.every((word) => word.logProb >= threshold)) return [];
  const isAlnum = new RegExp(`^${alnum}$`, "u");
  const spans = [];
  let cursor = 0;
  for (const word of found) {
    const pattern = new RegExp(`(?<!${alnum}|_)${word.text.replace(SYNTAX, "\\$&")}(?!${alnum}|_)`, "giu");
    pattern.lastIndex = cursor;
    const match = pattern.exec(text);
    if (!match) continue;
    cursor = match.index + match[0].length;
    if (word.logProb >= threshold) continue;
    let [start, end] = [match.index, cursor];
    while (start < end && !isAlnum.test(String.fromCodePoint(text.codePointAt(start)))) start += 1;
    while (end > start && !isAlnum.test(text[end - 1])) end -= 1;
    if (start < end) spans.push([start, end].map((at) => [...text.slice(0, at)].length));
  }
  return spans;
}
