// The search of aiayn/search/ (greedy.py, beam.py, translator.py) over the engine of engine.js, step for step:
// the same length batches, length cap (real source length + max_extra_len), candidate order, ties (the lower
// token id, then the lower beam), ids never generated (step.py's allowed_top), length penalty (GNMT's or |Y|^α)
// and finishing rules, so the outputs are NumPy's.
// Scores are JavaScript numbers, float64 like NumPy's, summed from the graph's float32 log-probabilities.

/** Sentence indices by similar length (longest first), capped by sentences and padded tokens. */
function lengthBatches(lengths, maxSentences, maxTokens) {
  const order = [...lengths.keys()].sort((a, b) => lengths[b] - lengths[a]);
  const batches = [];
  for (const i of order) {
    const last = batches.at(-1);
    if (last && last.length < maxSentences && lengths[last[0]] * (last.length + 1) <= maxTokens) last.push(i);
    else batches.push([i]);
  }
  return batches;
}

/** step.py's allowed_top: the k best values of one row of log-probabilities, best first, equal values by the
 * lower id (ONNX TopK), the banned ids left out as they are there: after the log-softmax, not renormalised. */
function topK(logProbs, row, vocab, k, banned) {
  const values = [];
  const ids = [];
  const base = row * vocab;
  for (let id = 0; id < vocab; id++) {
    if (banned.has(id)) continue;
    const value = logProbs[base + id];
    if (values.length === k && !(value > values[k - 1])) continue;
    let at = values.length;
    while (at > 0 && value > values[at - 1]) at -= 1; // after every equal one: the lower id stays first
    values.splice(at, 0, value);
    ids.splice(at, 0, id);
    if (values.length > k) {
      values.pop();
      ids.pop();
    }
  }
  return { values, ids };
}

/** The allowed id of a row's highest log-probability; equal ones go to the lower id (topK with k = 1, without
 * its lists). */
function argmax(logProbs, row, vocab, banned) {
  const base = row * vocab;
  let best = -1;
  for (let id = 0; id < vocab; id++) {
    if (!banned.has(id) && (best < 0 || logProbs[base + id] > logProbs[base + best])) best = id;
  }
  return best;
}

/** beam.py's length_penalty_of: lp(Y) = ((5 + |Y|) / 6)^α ("gnmt") or |Y|^α ("power"), </s> counted in |Y|. */
function lengthPenalty(length, alpha, normalization) {
  if (normalization === "power") return length ** alpha;
  if (normalization === "gnmt") return ((5 + length) / 6) ** alpha;
  throw new RangeError(`unknown length normalization ${normalization}`);
}

/** greedy.py: the most probable next token until </s> or the limit; finished rows leave the state. */
async function greedy(engine, srcIds, limits) {
  const batch = srcIds.length;
  const outputs = srcIds.map(() => []);
  const own = srcIds.map(() => []); // each output id's log-probability, as its step gave it
  let state = await engine.start(srcIds);
  let rows = [...Array(batch).keys()];
  let last = rows.map(() => engine.bos);
  const longest = Math.max(...limits);
  for (let length = 1; length <= longest; length++) {
    let logProbs;
    [logProbs, state] = await engine.step(state, last);
    const choice = rows.map((_, r) => argmax(logProbs, r, engine.vocab, engine.neverGenerate));
    rows.forEach((sentence, r) => {
      if (choice[r] === engine.eos) return;
      outputs[sentence].push(choice[r]);
      own[sentence].push(logProbs[r * engine.vocab + choice[r]]);
    });
    const going = rows.map((sentence, r) => choice[r] !== engine.eos && limits[sentence] > length);
    if (!going.some(Boolean)) break;
    if (!going.every(Boolean)) {
      const kept = going.flatMap((g, r) => (g ? [r] : []));
      state = engine.select(state, kept);
      rows = kept.map((r) => rows[r]);
      last = kept.map((r) => choice[r]);
    } else {
      last = choice;
    }
  }
  return outputs.map((tokens, i) => ({ tokens, tokenLogProbs: own[i] }));
}

/** beam.py's beam_search: up to k finished hypotheses per sentence, the best by log-probability / lp(length). */
async function beam(engine, srcIds, k, alpha, normalization, limits) {
  const batch = srcIds.length;
  const eos = engine.eos;
  const finished = srcIds.map(() => []);
  const repeated = [...Array(batch).keys()].flatMap((r) => Array(k).fill(r));
  let state = engine.select(await engine.start(srcIds), repeated); // row r * k + b: beam b of sentence r
  let active = [...Array(batch).keys()];
  let scores = active.map(() => Array.from({ length: k }, (_, b) => (b === 0 ? 0 : -Infinity)));
  let tokens = active.map(() => Array.from({ length: k }, () => []));
  let own = active.map(() => Array.from({ length: k }, () => [])); // each token's log-probability, as its step gave it
  let last = repeated.map(() => engine.bos);
  const longest = Math.max(...limits);
  for (let length = 1; length <= longest; length++) {
    let logProbs;
    [logProbs, state] = await engine.step(state, last);
    const kk = Math.min(2 * k, engine.vocab - engine.neverGenerate.size); // allowed_top's columns
    const m = Math.min(2 * k, k * kk);
    const penalty = lengthPenalty(length, alpha, normalization);
    const next = { beams: [], scores: [], tokens: [], own: [] };
    active.forEach((sentence, r) => {
      // Columns beam by beam, each beam's tokens best first: among equal scores, the (beam, token) order.
      const candidates = [];
      for (let b = 0; b < k; b++) {
        const top = topK(logProbs, r * k + b, engine.vocab, kk, engine.neverGenerate);
        top.values.forEach((value, j) =>
          candidates.push({ score: scores[r][b] + value, parent: b, token: top.ids[j], value }),
        );
      }
      const best = candidates
        .map((c, column) => [c, column])
        .sort(([a, i], [b, j]) => (a.score > b.score ? -1 : a.score < b.score ? 1 : i - j))
        .slice(0, m)
        .map(([c]) => c);
      const beams = Array(k).fill(0); // dead beams copy beam 0 and are fed </s>, their outputs ignored
      const beamScores = Array(k).fill(-Infinity);
      const newTokens = Array(k).fill(eos);
      const newValues = Array(k).fill(0);
      let liveAbove = 0;
      // beam.py's finishing rule (fairseq's): only a </s> among the best k ends a hypothesis, the others are dropped.
      for (const [rank, c] of best.entries()) {
        const finite = Number.isFinite(c.score);
        if (finite && c.token === eos && rank < k) {
          const output = tokens[r][c.parent].slice();
          const values = own[r][c.parent].slice();
          finished[sentence].push({ tokens: output, tokenLogProbs: values, logProb: c.score, score: c.score / penalty });
        } else if (finite && c.token !== eos) {
          if (liveAbove < k) {
            beams[liveAbove] = c.parent;
            beamScores[liveAbove] = c.score;
            newTokens[liveAbove] = c.token;
            newValues[liveAbove] = c.value;
          }
          liveAbove += 1;
        }
      }
      next.beams.push(beams);
      next.scores.push(beamScores);
      next.tokens.push(beams.map((parent, b) => [...tokens[r][parent], newTokens[b]]));
      next.own.push(beams.map((parent, b) => [...own[r][parent], newValues[b]]));
    });
    scores = next.scores;
    tokens = next.tokens;
    own = next.own;
    const going = active.map((sentence, r) => {
      const atLimit = limits[sentence] <= length;
      if (atLimit) {
        scores[r].forEach((score, b) => {
          if (!Number.isFinite(score)) return;
          const hypothesis = { tokens: tokens[r][b], tokenLogProbs: own[r][b], logProb: score, score: score / penalty };
          finished[sentence].push(hypothesis);
        });
      }
      return !atLimit && finished[sentence].length < k && Number.isFinite(scores[r][0]);
    });
    if (!going.some(Boolean)) break;
    const kept = going.flatMap((g, r) => (g ? [r] : []));
    state = engine.select(state, kept.flatMap((r) => next.beams[r].map((parent) => r * k + parent)));
    active = kept.map((r) => active[r]);
    scores = kept.map((r) => scores[r]);
    tokens = kept.map((r) => tokens[r]);
    own = kept.map((r) => own[r]);
    last = tokens.flatMap((beams) => beams.map((output) => output.at(-1)));
  }
  return finished.map((hyps) => {
    const ranked = hyps.map((h, i) => [h, i]).sort(([a, i], [b, j]) => b.score - a.score || i - j);
    return ranked.length ? ranked[0][0] : { tokens: [], tokenLogProbs: [] };
  });
}

/** Translator.outputs: the output of each source id list (each ending in </s>), searched in length batches: its
 * ids (`tokens`) and each id's log-probability (`tokenLogProbs`). */
export async function searchAll(engine, srcIds, settings, beamSize) {
  const outputs = srcIds.map(() => ({ tokens: [], tokenLogProbs: [] }));
  const lengths = srcIds.map((ids) => ids.length);
  for (const batch of lengthBatches(lengths, settings.max_sentences, settings.max_tokens)) {
    const rows = batch.map((i) => srcIds[i]);
    const limits = rows.map((ids) => ids.length + settings.max_extra_len);
    const results =
      beamSize === 1
        ? await greedy(engine, rows, limits)
        : await beam(engine, rows, beamSize, settings.length_penalty, settings.length_normalization, limits);
    batch.forEach((i, j) => {
      outputs[i] = results[j];
    });
  }
  return outputs;
}
