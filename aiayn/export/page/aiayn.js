// aiayn in the browser: `await window.aiayn.translate(lines, { beam })` gives the lines' translations, in order,
// as `aiayn translate` gives them (the beam the folder's config.json sets by default). Everything comes from this
// folder: the model's config.json and tokenizer.json, the graphs, and the pinned npm files beside this module.
// The page's address picks ONNX Runtime's device: `?device=auto` (the default: WebGPU where the browser offers
// it, else WASM), `?device=wasm` (the CLI's very answers), `?device=webgpu`; and `?threads=N` caps WASM's threads
// (default: one per core where the page is cross-origin isolated, else one; engine.js).
import initSentencex, { segment } from "./sentencex_wasm.js";
import { Tokenizer } from "./tokenizers.min.mjs";
import { OrtEngine, pickDevice, wasmThreads } from "./engine.js";
import { unsureSpans, words } from "./marks.js";
import { searchAll } from "./search.js";
import { Codec, TextPipeline } from "./text.js";

// Where the page's first seconds go: each part's start and end, in ms since the page was opened.
const timings = {};

/** `promise`, its time kept in `timings` under `name`. */
async function timed(name, promise) {
  const start = performance.now();
  const value = await promise;
  timings[name] = { start, end: performance.now() };
  return value;
}

async function load() {
  const asked = new URLSearchParams(location.search);
  const threads = wasmThreads(Number(asked.get("threads")) || 0);
  const [config, device] = await Promise.all([
    timed("config", fetch("config.json").then((response) => response.json())),
    timed("device", pickDevice(asked.get("device") ?? "auto")),
  ]);
  // The graphs load while the tokenizer and sentencex do: the WASM compiles and downloads overlap.
  const [tokenizerJson, , engine] = await Promise.all([
    timed("tokenizer", fetch("tokenizer.json").then((response) => response.json())),
    timed("sentencex", initSentencex()),
    timed("engine", OrtEngine.load(config.web, config, device, threads, timed)),
  ]);
  const codec = new Codec(new Tokenizer(tokenizerJson, {}), config.web.special_tokens, config.model.source_prefix);
  const text = new TextPipeline(config.web, config.model.src_lang, codec, segment);
  const vocab = tokenizerJson.model.vocab; // BPE: {piece: id}; Unigram: [[piece, score], ...] by id
  const pieces = Array.isArray(vocab) ? vocab.map(([piece]) => piece) : [];
  if (!Array.isArray(vocab)) for (const [piece, id] of Object.entries(vocab)) pieces[id] = piece;
  return { config, text, engine, device, pieces };
}

const loaded = load();

/** The translations of `lines` (strings without line breaks); beam 1 is greedy. */
async function translate(lines, { beam } = {}) {
  const { text } = await loaded;
  const { prepared, outputs } = await search(lines, beam);
  return text.assemble(prepared, outputs.map((output) => output.tokens));
}

/** `translate` with the words the model was unsure of: per line `{ translation, unsure_words }`, the spans as
 * `aiayn translate --report` and the JSON route give them (docs/serve.md). */
async function translateMarked(lines, { beam } = {}) {
  const { config, text, pieces } = await loaded;
  const { prepared, outputs } = await search(lines, beam);
  const threshold = config.confidence?.min_word_log_prob;
  return text.assemble(prepared, outputs.map((output) => output.tokens)).map((translation, number) => {
    const found = prepared.shape.lines[number].flatMap((sentence) =>
      prepared.owner.flatMap((owner, i) =>
        owner === sentence ? words(outputs[i].tokens.map((id) => pieces[id]), outputs[i].tokenLogProbs) : [],
      ),
    );
    const marks = threshold === undefined ? [] : unsureSpans(translation, found, threshold, config.web.alnum);
    return { translation, unsure_words: marks };
  });
}

async function search(lines, beam) {
  if (!Array.isArray(lines) || !lines.every((line) => typeof line === "string")) {
    throw new TypeError("translate(lines): lines must be an array of strings");
  }
  const { config, text, engine } = await loaded;
  const first = !("first translation" in timings) && performance.now();
  beam ??= config.web.beam_size;
  if (!Number.isInteger(beam) || beam < 1) throw new RangeError(`beam must be a positive integer, got ${beam}`);
  const broken = lines.findIndex((line) => text.splitLines(line).length > 1);
  if (broken >= 0) throw new RangeError(`line ${broken + 1} holds a line break; give one line per item`);
  const prepared = text.prepare(lines.map((line) => text.splitLines(line)[0] ?? ""));
  const outputs = await searchAll(engine, prepared.srcIds, config.web, beam);
  if (first) timings["first translation"] = { start: first, end: performance.now() };
  return { prepared, outputs };
}

/** A text as the page's box holds it, translated line by line. */
async function translateText(source, { beam } = {}) {
  const { text } = await loaded;
  return (await translate(text.splitLines(source), { beam })).join("\n");
}

export const aiayn = {
  ready: loaded.then(({ config, device, engine }) => ({
    src: config.model.src_lang,
    tgt: config.model.tgt_lang,
    device,
    threads: engine.threads,
    isolated: globalThis.crossOriginIsolated === true,
    beam: config.web.beam_size,
  })),
  translate,
  translateMarked,
  translateText,
  timings,
};
window.aiayn = aiayn;
