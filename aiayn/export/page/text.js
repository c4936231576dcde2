// The text pipeline of `aiayn translate`, rule for rule: lines and sentences (aiayn/text/sentences.py), the length cap,
// clauses (aiayn/text/clauses.py), and a text's pieces in and translations out (LoadedModel.prepare and
// .assemble in aiayn/serve/service.py). The rules Python knows come from config.json's `web` section.
// Python counts characters by code point; so does this module (Array.from, for...of), never by UTF-16 unit.

const METASPACE = "\u2581";

function codePoints(text) {
  return Array.from(text);
}

function escapeRegex(text) {
  return text.replace(/[\\^$.*+?()[\]{}|]/g, "\\$&");
}

// Python's str methods over the character classes Python wrote (normalizer.char_class).
class PyStr {
  constructor(web) {
    this.space = new RegExp(`^${web.whitespace}$`, "u");
    this.runs = new RegExp(`${web.whitespace}+`, "gu");
    this.ends = new RegExp(`^${web.whitespace}+|${web.whitespace}+$`, "gu");
    this.start = new RegExp(`^${web.whitespace}+`, "u");
    this.end = new RegExp(`${web.whitespace}+$`, "u");
    this.alnum = new RegExp(web.alnum, "u");
    this.opens = new RegExp(`^${web.opens_sentence}`, "u");
  }

  isSpace(ch) {
    return this.space.test(ch);
  }

  strip(text) {
    return text.replace(this.ends, "");
  }

  lstrip(text) {
    return text.replace(this.start, "");
  }

  rstrip(text) {
    return text.replace(this.end, "");
  }

  split(text) {
    return this.strip(text).split(this.runs).filter((word) => word);
  }
}

/** tokenizer.json through tokenizers.js, as aiayn/core/tokenizer.py's SubwordTokenizer reads it; `sourcePrefix`:
 * the config's source_prefix (a multi-target checkpoint's >>por<<), the ids every source starts with. */
export class Codec {
  constructor(tokenizer, special, sourcePrefix = []) {
    this.tokenizer = tokenizer;
    this.eos = special.eos;
    this.unk = special.unk;
    this.sourcePrefix = sourcePrefix;
  }

  encode(text) {
    return this.tokenizer.encode(text, { add_special_tokens: false }).ids;
  }

  encodeSource(text) {
    return [...this.sourcePrefix, ...this.encode(text), this.eos];
  }

  countTokens(text) {
    return this.sourcePrefix.length + this.encode(text).length + 1;
  }

  decode(ids) {
    // HF tokenizers never tidies spaces around punctuation; tokenizers.js would by default.
    if (!ids.length) return "";
    return this.tokenizer.decode(ids, { skip_special_tokens: true, clean_up_tokenization_spaces: false });
  }

  isWord(word) {
    return this.tokenizer.token_to_id(METASPACE + word) !== undefined;
  }
}

/** text/clauses.py's ClauseSplitter: long sentences halved at clause boundaries, and put back together. */
class Clauses {
  constructor(web, codec, py) {
    this.codec = codec;
    this.py = py;
    this.maxTokens = web.split_over_tokens;
    this.minPiece = web.min_piece_tokens;
    this.maxDepth = web.max_depth;
    this.sentenceEnd = web.sentence_end;
    this.table = new Map(web.conjunctions);
    const words = web.conjunctions.map(([word]) => escapeRegex(word)).join("|") || "(?!)";
    this.boundary = new RegExp(`(?<mark>;)\\s+|(?<comma>,)\\s+(?<conj>${words})\\s+`, "giu");
  }

  split(sentence, tokens) {
    return this.presplit(clause(sentence), tokens);
  }

  presplit(piece, tokens) {
    if (this.maxTokens === null || tokens <= this.maxTokens || piece.depth >= this.maxDepth) return [piece];
    const halves = this.halve(piece);
    if (halves === null) return [piece];
    return halves.flatMap((half) => this.presplit(half, this.codec.countTokens(query(half))));
  }

  halve(piece) {
    const text = piece.text;
    const total = this.codec.countTokens(text);
    let best = null;
    for (const m of text.matchAll(this.boundary)) {
      const before = this.codec.countTokens(text.slice(0, m.index));
      if (before < this.minPiece || total - before < this.minPiece) continue;
      const option = [m.groups.mark ? 0 : 1, Math.abs(before - total / 2), m];
      if (best === null || option[0] < best[0] || (option[0] === best[0] && option[1] < best[1])) best = option;
    }
    if (best === null) return null;
    const m = best[2];
    const conj = m.groups.conj ?? "";
    const depth = piece.depth + 1;
    const left = clause(text.slice(0, m.index), piece.lead, piece.sourceLead, m.groups.mark ?? ",", piece.first, depth);
    const lead = this.table.get(conj.toLowerCase()) ?? "";
    const right = clause(text.slice(m.index + m[0].length), lead, conj, piece.tail, false, depth);
    return [left, right];
  }

  render(piece, translation) {
    let text = translation;
    const ends = this.sentenceEnd.some((mark) => this.py.rstrip(piece.text).endsWith(mark));
    if (piece.depth && !ends && text.endsWith(".")) text = this.py.rstrip(text.slice(0, -1));
    if (!piece.first && text) {
      const space = text.indexOf(" ");
      const [word, rest] = space < 0 ? [text, ""] : [text.slice(0, space), text.slice(space + 1)];
      const tail = codePoints(word).slice(1).join("");
      if (word !== word.toLowerCase() && tail === tail.toLowerCase() && this.codec.isWord(word.toLowerCase())) {
        text = this.py.rstrip(`${word.toLowerCase()} ${rest}`);
      }
    }
    return [piece.lead, text + piece.tail].filter((part) => part).join(" ");
  }
}

function clause(text, lead = "", sourceLead = "", tail = "", first = true, depth = 0) {
  return { text, lead, sourceLead, tail, first, depth };
}

function query(piece) {
  if (piece.first) return piece.text;
  const [head = "", ...rest] = codePoints(piece.text);
  return head.toUpperCase() + rest.join("");
}

/** Lines in, the pieces the search gets; their translations back into lines. */
export class TextPipeline {
  constructor(web, language, codec, segment) {
    this.py = new PyStr(web);
    this.codec = codec;
    this.segment = segment;
    this.language = language;
    this.clauses = new Clauses(web, codec, this.py);
    this.opening = new Set(codePoints(web.opening));
    this.lineBreak = new RegExp(web.line_break, "u");
    this.otherBreaks = new RegExp(web.other_breaks, "gu");
    this.sentenceLimit = web.max_sentence_tokens;
    this.maxSrcLen = web.max_src_len;
  }

  /** text.split_lines: a text's lines (a final line break adds no empty line), other breaks as spaces. */
  splitLines(text) {
    const lines = text.replace(this.otherBreaks, " ").split(this.lineBreak);
    if (lines.at(-1) === "") lines.pop();
    return lines;
  }

  startsSentence(text) {
    const rest = codePoints(text);
    let i = 0;
    while (i < rest.length && this.opening.has(rest[i])) i += 1;
    return i < rest.length && this.py.opens.test(rest[i]);
  }

  isSpaced(before, after) {
    return this.py.isSpace(codePoints(before).at(-1) ?? "") || this.py.isSpace(codePoints(after)[0] ?? "");
  }

  splitSentences(line) {
    const pieces = [];
    for (const segment of this.segment(this.language, line)) {
      if (pieces.length && !(this.isSpaced(pieces.at(-1), segment) && this.startsSentence(this.py.lstrip(segment)))) {
        pieces[pieces.length - 1] += segment;
      } else {
        pieces.push(segment);
      }
    }
    return pieces.map((piece) => this.py.strip(piece)).filter((piece) => piece);
  }

  layout(lines) {
    const sentences = [];
    const shape = [];
    for (const line of lines) {
      const parts = this.splitSentences(line);
      shape.push(parts.map((_, i) => sentences.length + i));
      sentences.push(...parts);
    }
    return { sentences, lines: shape };
  }

  unknownCharacters(text) {
    const unknown = new Set();
    for (const ch of new Set(codePoints(text))) {
      if (this.py.isSpace(ch)) continue;
      const ids = this.codec.encode(ch);
      if (!ids.length || ids.includes(this.codec.unk)) unknown.add(ch);
    }
    return unknown;
  }

  /** text.split_long: halved at a word boundary until every piece has at most the limit's tokens. */
  splitLong(sentence) {
    const tokens = this.codec.countTokens(sentence);
    if (tokens <= this.sentenceLimit) return [sentence];
    const words = this.py.split(sentence);
    if (words.length < 2) {
      const start = codePoints(sentence).slice(0, 40).join("");
      throw new RangeError(
        `a single word of ${tokens} tokens is over the limit of ${this.sentenceLimit} tokens per sentence: ` +
          `${start}…; add spaces or remove it`,
      );
    }
    const middle = Math.floor(words.length / 2);
    return [...this.splitLong(words.slice(0, middle).join(" ")), ...this.splitLong(words.slice(middle).join(" "))];
  }

  sourceIds(text) {
    const ids = this.codec.encodeSource(text);
    if (ids.length > this.maxSrcLen) {
      throw new RangeError(`a sentence of ${ids.length} tokens is longer than this model's limit of ${this.maxSrcLen}`);
    }
    return ids;
  }

  /** LoadedModel.prepare: lines → sentences → the token ids of each piece. */
  prepare(lines) {
    const shape = this.layout(lines);
    const unknown = this.unknownCharacters(shape.sentences.join(" "));
    const prepared = { shape, srcIds: [], owner: [], clauses: [], leftOut: new Set(), refused: new Map() };
    shape.sentences.forEach((sentence, index) => {
      const known = this.py.split(codePoints(sentence).filter((ch) => !unknown.has(ch)).join("")).join(" ");
      if (!this.py.alnum.test(known)) return;
      let pieces;
      try {
        pieces = this.splitLong(known);
      } catch (err) {
        if (!(err instanceof RangeError)) throw err;
        prepared.refused.set(index, err.message);
        return;
      }
      for (const ch of codePoints(sentence)) if (unknown.has(ch)) prepared.leftOut.add(ch);
      for (const piece of pieces) {
        const whole = this.sourceIds(piece);
        const cut = this.clauses.split(piece, whole.length);
        prepared.srcIds.push(...(cut.length === 1 ? [whole] : cut.map((c) => this.sourceIds(query(c)))));
        prepared.owner.push(...cut.map(() => index));
        prepared.clauses.push(...cut);
      }
    });
    return prepared;
  }

  /** LoadedModel.assemble: each piece's output ids back into its sentence, the sentences into their lines. */
  assemble(prepared, outIds) {
    const perSentence = [...prepared.shape.sentences];
    for (const index of [...prepared.owner, ...prepared.refused.keys()]) perSentence[index] = "";
    prepared.owner.forEach((index, i) => {
      const piece = this.clauses.render(prepared.clauses[i], this.codec.decode(outIds[i]));
      perSentence[index] = this.py.strip(`${perSentence[index]} ${piece}`);
    });
    return prepared.shape.lines.map((line) => line.map((i) => perSentence[i]).join(" "));
  }
}
